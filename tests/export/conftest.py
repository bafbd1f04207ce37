"""Fixtures the export tests share: the captured example GPT (one capture per session)."""

from __future__ import annotations

import pytest

from exporthelpers import ROOT
from stagesplit.cli import main

#: a small examples/gpt.py: 6 blocks, batch 8 (4 micro-batches of 2 for the pipelined runs)
GPT_CONFIG = dict(vocab_size=64, context=8, d_model=16, heads=2, layers=6, batch=2)
FACTORY = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from examples.gpt import GPTConfig, build as build_gpt


def build():
    return build_gpt(GPTConfig(**{GPT_CONFIG!r}))
"""


@pytest.fixture(scope="session")
def captured_gpt(tmp_path_factory):
    """``stagesplit capture`` of examples/gpt.py (a small configuration, one micro-batch of 2),
    with exact bytes."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("capture")
    (folder / "small_gpt.py").write_text(FACTORY)
    path = folder / "gpt.stagesplit"
    assert main(["capture", f"{folder / 'small_gpt.py'}:build", "-o", str(path), "--allocator-round", "1"]) == 0
    return path
