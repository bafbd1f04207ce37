import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vision import torchvision_model_code  # noqa: E402

torchvision_model_code()          # before anything imports transformers or timm

# Hypothesis profiles. "ci" (the default, what the README's test command and CI run): the same
# examples every run (derandomized), so a red build is reproducible; no per-example deadline on
# a shared 2-core machine. "dev": five times the examples, random, to hunt for new failures:
#   HYPOTHESIS_PROFILE=dev pytest ...   or   pytest --hypothesis-profile dev
# A test's own @settings(max_examples=...) still applies (it overrides the profile's count).
import os  # noqa: E402

from hypothesis import HealthCheck, settings  # noqa: E402

from helpers import PROFILES, load_sample, sample_json_text  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=500, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SAMPLES = ["bert-base.stagesplit", "gpt.stagesplit", "cnn.stagesplit"]


# Memory: the quick suite is kept under 1.5 GB peak RSS. The shipped samples load in a
# fraction of a second, so they are kept for one module at a time, not for the whole session.
@pytest.fixture(scope="module", params=SAMPLES)
def sample_analysis(request):
    from stagesplit.model.analysis import Analysis
    return Analysis.load(PROFILES / request.param)


@pytest.fixture(scope="module", autouse=True)
def _forget_cached_samples():
    """Drop the samples ``helpers.load_sample`` (and ``sample_json_text``) cached for a module."""
    yield
    load_sample.cache_clear()
    sample_json_text.cache_clear()


# Timed tests (``@pytest.mark.timed``: tests/plan/test_steptime_*.py) hold a prediction to the wall
# time of real processes, each given a core of its own: beside another pytest worker they measure
# that worker. The README's test command runs them alone after the rest (``-m timed``); a run that
# would put one beside other workers fails it at once rather than let it measure noise.
@pytest.fixture(autouse=True)
def _timed_tests_run_alone(request):
    if request.node.get_closest_marker("timed") and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.fail("a timed test measures real processes' wall time and runs alone, not beside other pytest "
                    "workers: run it with -m timed (no -n)", pytrace=False)


@pytest.fixture
def search_under_1f1b(monkeypatch):
    """The layout search under 1F1B alone unless a test names its schedules: for the modules whose
    oracles simulate 1F1B (every layout x every split, hand cases); the default list, 1F1B and
    interleaved 1F1B (plan/layouts.py's ``DEFAULT_SCHEDULES``), is tested in test_layout_defaults.py."""
    monkeypatch.setattr("stagesplit.plan.layouts.DEFAULT_SCHEDULES", "1f1b")



#: handed out first: the suite's longest test (a multi-process matrix, 144 s on the 2-core machine),
#: then the files of long single-process tests (the documentation's examples, the benchmarks' quick
#: modes, mypy: 4 to 58 s each) that collection order puts last. pytest-xdist gives each worker a
#: block of consecutive tests to start with and the rest as workers free up, so tests collected
#: late decide how long one worker runs on alone at the end: these left a worker idle for minutes.
#: The multi-process tests stay where they are (all the slow tests first put them beside each
#: other: the full suite took 18.5 minutes instead of 14.7).
STARTED_FIRST = (
    "tests/exporters/test_export_hf_pipelines.py::test_exported_pipelines_run_and_every_rank_is_within_tolerance",
    "tests/test_docs_commands.py::",
    "tests/test_benchmarks.py::",
    "tests/test_lint.py::",
)


def pytest_collection_modifyitems(config, items):
    """The tests ``STARTED_FIRST`` names (a node id, or a file's ``::`` prefix) first, in its order;
    the others in collection order."""
    def rank(item) -> int:
        return next((i for i, start in enumerate(STARTED_FIRST) if item.nodeid.startswith(start)),
                    len(STARTED_FIRST))
    items.sort(key=rank)
