"""The shipped layout sample, ``profiles/llama3-70b.stagesplit`` (docs/layouts.md, "A sample to try"): the
Llama-3-70B shape as one rank at each tensor-parallel degree, so that the layout search runs without torch.
It is what the capture command its page gives writes: a rank captured again by that command, at one of its
degrees, is the sample's rank of that degree, operation for operation and byte for byte."""

from __future__ import annotations

import contextlib
import io
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "profiles" / "llama3-70b.stagesplit"
PAGE = ROOT / "docs" / "layouts.md"


def _documented_capture() -> list[str]:
    """The capture command docs/layouts.md gives for the sample, as arguments after ``stagesplit``."""
    lines = [line.strip() for line in PAGE.read_text().splitlines()
             if line.strip().startswith("stagesplit capture examples/real_models.py:llama3_70b ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]


def test_the_sample_holds_a_rank_at_each_degree_its_command_names():
    from stagesplit.io import load_variants
    args = _documented_capture()
    degrees = tuple(int(d) for d in args[args.index("--tp") + 1].split(","))
    assert degrees == (1, 2, 4, 8) and args[args.index("-o") + 1] == SAMPLE.name
    sample = load_variants(SAMPLE)
    assert sample.degrees == degrees
    for degree in degrees:
        rank = sample.of(degree)
        info = rank.info
        assert info.name == "llama-3-70b" and info.batch_size == 1 and rank.target.name == "h100-80gb"
        assert (info.precision.parameters, info.precision.master_weights) == ("bfloat16", True)
        assert info.layer_grouping.layers == tuple(str(i) for i in range(80))
        assert "from examples/real_models.py:llama3_70b" in info.description     # no machine's own path
        layout = info.parallel_layout
        assert (layout is None) if degree == 1 else (layout.tensor_parallel == degree and layout.sequence_parallel)


@pytest.mark.slow
def test_the_sample_s_rank_is_what_the_documented_command_captures(tmp_path, monkeypatch):
    """Degree 2 alone (all four take 35 s), by the page's own command with its degrees and output changed,
    run from the checkout's root as the page runs it."""
    pytest.importorskip("transformers")
    monkeypatch.chdir(ROOT)
    from stagesplit.cli import main
    from stagesplit.io import load_profile, load_variants
    from stagesplit.io.jsonprofile import dumps_profile
    args = _documented_capture()
    args[args.index("--tp") + 1] = "2"
    args[args.index("-o") + 1] = str(tmp_path / "tp2.stagesplit")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(args) == 0

    def text(profile) -> str:        # (the file's own hash and path aside)
        return dumps_profile(replace(profile, info=replace(profile.info, sha256="", path="")))
    assert text(load_profile(tmp_path / "tp2.stagesplit")) == text(load_variants(SAMPLE).of(2))
