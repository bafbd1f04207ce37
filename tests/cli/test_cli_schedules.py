"""Pipeline schedules and recompute from the command line, on the shipped captured GPT
(profiles/gpt-captured.stagesplit, ``stagesplit capture examples/gpt.py:build``): what solve
prints, what the plan file keeps, sweep rows against single solves, the fewest devices against
the counts around it, ``--schedule auto`` against each schedule solved alone, and the one-line
errors for what a profile cannot do."""

from __future__ import annotations

import json

import pytest

from helpers import PROFILES
from stagesplit.cli import main
from stagesplit.plan import read_plan, write_plan
from stagesplit.plan.files import plan_document

CAPTURED = PROFILES / "gpt-captured.stagesplit"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_chunked_schedule_prints_its_step_and_every_device(capsys, tmp_path):
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--schedule", "zbv", "--micro-batches", 4,
                         "--out", tmp_path / "p.json")
    assert code == 0, err
    lines = out.splitlines()
    step = next(line for line in lines if line.startswith("step: "))
    assert "for 4 micro-batches with zbv, 2 chunks per device" in step and "the schedule simulated" in step
    memory = next(line for line in lines if line.startswith("memory: fullest device "))
    assert memory.endswith("; 2 of 2 devices used")
    plan = read_plan(tmp_path / "p.json")
    assert plan.schedule.kind == "zbv" and plan.schedule.chunks_per_rank == 2 and len(plan.stages) == 4
    assert [s.device for s in plan.stages] == [0, 1, 1, 0]                     # the V
    # the plan file round-trips: read, written again, the same document
    write_plan(plan, tmp_path / "again.json")
    first, second = (json.loads((tmp_path / n).read_text()) for n in ("p.json", "again.json"))
    for doc in (first, second):
        doc["run"].pop("created")
    assert first == second == {**plan_document(plan), "run": first["run"]}


def test_recompute_full_is_shown_per_stage_and_kept_in_the_plan(capsys, tmp_path):
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--schedule", "1f1b", "--micro-batches", 4,
                         "--recompute", "full", "--wide", "--out", tmp_path / "p.json")
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("stage "))
    assert "recompute" in header and "saved per micro-batch (GiB)" in header
    plan = read_plan(tmp_path / "p.json")
    for s in plan.stages:
        assert s.recompute == ("full",) * len(s.layers)
        assert f"full {len(s.layers)}/{len(s.layers)}" in out
        assert s.recompute_saved_bytes > 0 and s.recompute_time > 0
    none = read_plan_after(capsys, tmp_path, "none")
    # recomputing every layer holds less and takes longer
    assert max(r.peak_bytes for r in plan.schedule.ranks) < max(r.peak_bytes for r in none.schedule.ranks)
    assert plan.schedule.step_time > none.schedule.step_time
    assert all(s.recompute == () for s in none.stages)


def read_plan_after(capsys, tmp_path, mode: str):
    code, _, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--schedule", "1f1b", "--micro-batches", 4,
                       "--recompute", mode, "--out", tmp_path / f"{mode}.json")
    assert code == 0, err
    return read_plan(tmp_path / f"{mode}.json")


def test_nothing_fits_without_recompute_so_auto_is_used_with_a_note(capsys, tmp_path):
    """0.3% of an A100 (about 246 MiB, nothing else kept back) holds the GPT only with some layers recomputed."""
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--schedule", "1f1b", "--micro-batches", 4,
                         "--headroom", 0.997, "--runtime-reserve", "off", "--out", tmp_path / "p.json")
    plan = read_plan(tmp_path / "p.json")
    if code != 0:
        pytest.fail(out + err)
    assert any(s.recomputed_layers for s in plan.stages)
    assert "note: no split fits without activation recompute" in out
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--schedule", "1f1b", "--micro-batches", 4,
                         "--headroom", 0.997, "--runtime-reserve", "off", "--recompute", "none")
    assert code == 1 and "status: infeasible" in out


@pytest.mark.parametrize("argv, flag", [
    (["profiles/llama-7b-layers.json", "--devices", "4", "--schedule", "1f1b", "--recompute", "auto"], "--recompute"),
    ([str(CAPTURED), "--devices", "2", "--recompute", "full"], "--recompute"),
    (["profiles/llama-7b-layers.json", "--devices", "4", "--schedule", "zbv"], "--schedule"),
])
def test_what_a_profile_or_request_cannot_do_is_one_line(capsys, argv, flag):
    code, out, err = run(capsys, "solve", *argv)
    assert (code, out) == (2, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stagesplit: error: {flag}: ") and "Traceback" not in err


def test_sweep_rows_are_the_single_solves(capsys, tmp_path):
    code, out, err = run(capsys, "sweep", CAPTURED, "--devices", "1..3", "--schedule", "interleaved-1f1b",
                         "--micro-batches", 6)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line[:7].strip().isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"] and all(r[2] == "interleaved-1f1b" for r in rows)
    for n, row in zip((1, 2, 3), rows):
        code, _, err = run(capsys, "solve", CAPTURED, "--devices", n, "--exact", "--schedule", "interleaved-1f1b",
                           "--micro-batches", 6, "--out", tmp_path / f"{n}.json")
        assert code == 0, err
        plan = read_plan(tmp_path / f"{n}.json")
        assert float(row[5]) == pytest.approx(plan.schedule.step_time * 1e3, abs=6e-4)   # the table's 3 decimals


def test_the_fewest_devices_fit_and_one_fewer_does_not(capsys, tmp_path):
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 6, "--schedule", "1f1b", "--micro-batches", 6,
                         "--objective", "devices", "--headroom", 0.997, "--runtime-reserve", "off", "--recompute", "none", "--out",
                         tmp_path / "p.json")
    assert code == 0, err
    n = len(read_plan(tmp_path / "p.json").schedule.ranks)
    assert n > 1
    for count, fits in ((n - 1, False), (n, True)):
        code, out, _ = run(capsys, "solve", CAPTURED, "--devices", count, "--exact", "--schedule", "1f1b",
                           "--micro-batches", 6, "--headroom", 0.997, "--runtime-reserve", "off", "--recompute", "none")
        assert (code == 0) == fits, out


def test_auto_is_the_fastest_schedule_solved_alone(capsys, tmp_path):
    """Every schedule torch ships with 1 to 4 chunks per device that its class accepts for 2
    devices and 4 micro-batches (listed by hand); each one solved alone is no faster than auto's
    plan, which is proven optimal; a schedule auto marks "slower" (proven to have no faster split
    than the plan) is at least as slow alone; one it marks optimal has the same step alone."""
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--schedule", "auto", "--micro-batches", 4,
                         "--out", tmp_path / "auto.json")
    assert code == 0, err
    assert "Schedules tried (--schedule auto)" in out
    auto = read_plan(tmp_path / "auto.json")
    assert auto.status == "optimal"
    expected = {("gpipe", 1), ("1f1b", 1), ("zbv", 2), ("dualpipev", 2)} | {
        (kind, v) for kind in ("interleaved-1f1b", "looped-bfs", "zb-h1") for v in (1, 2, 3, 4)}
    tried = {(c.schedule, c.chunks_per_rank): c for c in auto.candidates}
    assert set(tried) == expected and len(auto.candidates) == 16
    for (kind, v), candidate in sorted(tried.items()):
        code, _, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--exact", "--schedule", kind,
                           "--chunks-per-rank", v, "--micro-batches", 4, "--out", tmp_path / f"{kind}-{v}.json")
        assert code == 0, err
        alone = read_plan(tmp_path / f"{kind}-{v}.json")
        assert alone.status == "optimal", (kind, v)
        assert alone.schedule.step_time >= auto.schedule.step_time * (1 - 1e-9), (kind, v)
        assert candidate.status in ("optimal", "slower"), (kind, v, candidate)
        if candidate.status == "optimal":
            assert candidate.step_time == pytest.approx(alone.schedule.step_time, rel=1e-9), (kind, v)
        else:
            assert candidate.note.endswith("(proven)") and candidate.step_time >= alone.schedule.step_time * (1 - 1e-9)
    assert min(c.step_time for c in auto.candidates) == auto.schedule.step_time


