"""The libpva test double's report files (tests/fake_pva: ``write_report_file``): a profile.pop
that ``openReport`` opens in any process, as libpva opens a real one, holding the same report
that ``report_from_profile`` builds in memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fake_pva.support import FAKE_DIR, load_fake_pva
from helpers import assert_profiles_equal
from stagesplit.io.compact import write_compact
from stagesplit.io.popvision import read_popvision
from stagesplit.io.profile import Target
from stagesplit.io.synth import synthesize

SMALL = Target("small", tiles=16, bytes_per_tile=638976, clock_hz=1.33e9)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pva(monkeypatch):
    return load_fake_pva(monkeypatch)


@pytest.fixture(scope="module")
def synthetic():
    return synthesize("bert-base", SMALL, layers=2, piece_bytes=16384)


def brief_rows(report):
    return [(v.id, v.bytes, v.tileId, v.equivalenceClass.id, [(s.start, s.end) for s in v.equivalenceClass.steps])
            for v in report.compilation.loweredVariables.allBriefVars]


def program_rows(report):
    return [(p._id, p.name, p.type, list(p.controlCodeByTile), list(p.codeBytesByTile), len(p.children))
            for p in report.compilation.programs]


def operation_rows(pva, report):
    return [(o.name, o.firstStepIndex, o.lastStepIndex, o.debugContext.id, o.debugContext.json,
             [p._id for p in o.programs()], [v._id for v in o.vars]) for o in pva.OperationAnalysis(report).operations]


def tile_rows(report):
    return [(t.memory.alwaysLiveBytes, t.memory.notAlwaysLiveBytes, t.memory.total.excludingGaps,
             [(v.type.name, v.codeBytes) for v in t.memory.vertices]) for t in report.compilation.tiles]


def assert_same_report(pva, a, b):
    assert a is not b
    ta, tb = a.compilation.target, b.compilation.target
    assert (ta.tilesPerIpu, ta.numTiles, ta.bytesPerTile) == (tb.tilesPerIpu, tb.numTiles, tb.bytesPerTile)
    assert brief_rows(a) == brief_rows(b)
    assert program_rows(a) == program_rows(b)
    assert operation_rows(pva, a) == operation_rows(pva, b)
    assert tile_rows(a) == tile_rows(b)
    steps_a, steps_b = a.compilation.livenessProgramSteps, b.compilation.livenessProgramSteps
    assert [s.program._id for s in steps_a] == [s.program._id for s in steps_b]
    for t in (0, ta.numTiles - 1):
        assert [s.notAlwaysLiveMemoryForTile(t).bytes for s in steps_a] == \
            [s.notAlwaysLiveMemoryForTile(t).bytes for s in steps_b]


class TestReportFile:
    def test_opens_as_the_report_built_in_memory(self, pva, tmp_path, synthetic):
        path = pva.write_report_file(tmp_path / "profile.pop", synthetic)
        assert path.read_bytes().startswith(pva.FILE_MAGIC)
        opened = pva.openReport(str(path))
        assert_same_report(pva, opened, pva.report_from_profile(synthetic))
        assert len(opened.compilation.loweredVariables.allBriefVars) == len(synthetic.variables)
        assert pva.opened == [(str(path), None)]

    def test_report_options_are_carried(self, pva, tmp_path, synthetic):
        path = pva.write_report_file(tmp_path / "profile.pop", synthetic, ipus=2, code_in_always_live=True)
        opened = pva.openReport(str(path))
        assert opened.compilation.target.numTiles == 2 * SMALL.tiles
        assert_same_report(pva, opened, pva.report_from_profile(synthetic, ipus=2, code_in_always_live=True))

    def test_each_open_builds_a_fresh_report(self, pva, tmp_path, synthetic):
        path = str(pva.write_report_file(tmp_path / "profile.pop", synthetic))
        assert pva.openReport(path) is not pva.openReport(path)

    def test_compact_file_is_copied_byte_for_byte(self, pva, tmp_path, synthetic):
        compact = tmp_path / "model.stagesplit"
        write_compact(synthetic, compact)
        path = pva.write_report_file(tmp_path / "profile.pop", compact, ipus=3)
        header = pva.FILE_MAGIC + json.dumps({"ipus": 3}).encode() + b"\n"
        assert path.read_bytes() == header + compact.read_bytes()
        assert not (tmp_path / "profile.pop.part").exists()

    def test_stagesplit_reads_it_as_it_reads_a_registered_report(self, pva, tmp_path, synthetic):
        from_file = read_popvision(pva.write_report_file(tmp_path / "file" / "profile.pop", synthetic))
        registered = read_popvision(pva.register(tmp_path / "reg" / "profile.pop", pva.report_from_profile(synthetic)))
        assert from_file.info.warnings == [] and registered.info.warnings == []
        assert len(from_file.variables) == len(synthetic.variables)
        from_file.info = registered.info
        assert_profiles_equal(from_file, registered)

    def test_a_fresh_interpreter_opens_it(self, pva, tmp_path, synthetic):
        path = pva.write_report_file(tmp_path / "profile.pop", synthetic)
        code = ("import pva, sys; r = pva.openReport(sys.argv[1]); v = r.compilation.loweredVariables.allBriefVars; "
                "print(len(v), sum(b.bytes for b in v), len(pva.OperationAnalysis(r).operations))")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(ROOT)])}
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                             check=True).stdout.split()
        assert [int(x) for x in out] == [len(synthetic.variables), int(np.sum(synthetic.variables.bytes)),
                                        len(synthetic.operations)]

    def test_damaged_file_fails_as_libpva_does(self, pva, tmp_path, synthetic):
        path = tmp_path / "profile.pop"
        path.write_bytes(pva.FILE_MAGIC + b"{}\nnot a zip")
        with pytest.raises(RuntimeError, match="is not a valid profile report"):
            pva.openReport(str(path))
        path.write_bytes(b"fake-pva profile.pop v0\n{}\n")
        with pytest.raises(RuntimeError, match="is not a valid profile report"):
            pva.openReport(str(path))

    def test_unknown_option_is_refused(self, pva, tmp_path, synthetic):
        with pytest.raises(TypeError, match="unknown report options"):
            pva.write_report_file(tmp_path / "profile.pop", synthetic, tiles=3)
        assert not (tmp_path / "profile.pop").exists()
