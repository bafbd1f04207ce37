"""Fixtures the export tests share: the captured example GPT (one capture per session), and no thread left
behind by a test that calls traced stage modules."""

from __future__ import annotations

import contextlib
import threading

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


@pytest.fixture
def no_thread_left(monkeypatch):
    """Calling a traced stage module starts tqdm's monitor thread, which would stop the PopVision reader's
    fork later in this process (it forks only with no other thread running): kept off, and the test
    must leave no thread behind."""
    threads = threading.active_count()
    with contextlib.suppress(ImportError):
        import tqdm
        monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    yield
    assert threading.active_count() == threads
