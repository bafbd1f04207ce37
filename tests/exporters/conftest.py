"""Fixtures the export tests share: the captured example GPT (one capture per session)."""

from __future__ import annotations

import pytest
from exporthelpers import GPT_FACTORY

from stagesplit.cli import main


@pytest.fixture(scope="session")
def captured_gpt(tmp_path_factory):
    """``stagesplit capture`` of examples/gpt.py (a small configuration, one micro-batch of 2),
    with exact bytes."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("capture")
    (folder / "small_gpt.py").write_text(GPT_FACTORY)
    path = folder / "gpt.stagesplit"
    assert main(["capture", f"{folder / 'small_gpt.py'}:build", "-o", str(path), "--allocator-round", "1"]) == 0
    return path
