import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import PROFILES  # noqa: E402

SAMPLES = ["bert-base.stagesplit", "gpt.stagesplit", "cnn.stagesplit"]


@pytest.fixture(scope="session", params=SAMPLES)
def sample_analysis(request):
    from stagesplit.analysis import Analysis
    return Analysis.load(PROFILES / request.param)
