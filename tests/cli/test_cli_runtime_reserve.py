"""``--runtime-reserve auto|off|BYTES`` on the command line: what solve keeps back for the CUDA context
and NCCL's buffers, the line it prints (checked against the plan file), and a bad value in one line."""

from __future__ import annotations

import pytest

from helpers import PROFILES
from stagesplit.cli import main
from stagesplit.plan import read_plan
from stagesplit.reporting.summary import kept_back_line

CAPTURED = PROFILES / "gpt-captured.stagesplit"
GiB = 2**30


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("value, kept", [("auto", 512 * 2**20 + 128 * 2**20), ("off", 0), ("1.5GiB", 3 * GiB // 2)])
def test_the_flag_sets_what_is_kept_back_and_solve_prints_it(capsys, tmp_path, value, kept):
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--schedule", "1f1b", "--runtime-reserve", value,
                         "--reserve", "1GiB", "--out", tmp_path / "p.json")
    assert code == 0, err
    plan = read_plan(tmp_path / "p.json")
    assert plan.inputs.runtime_reserve.estimate_bytes == kept
    assert all(r.capacity_bytes == 80 * GiB - kept - GiB for r in plan.schedule.ranks)
    line = next(x for x in out.splitlines() if x.startswith("kept back per device: "))
    assert line == kept_back_line(plan)
    assert line.endswith(f"reserve 1.00 GiB: {(kept + GiB) / GiB:,.2f} GiB in all, "
                         f"{(80 * GiB - kept - GiB) / GiB:,.2f} GiB of each device left for the plan")


def test_a_bad_value_is_one_line(capsys):
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--runtime-reserve", "some")
    assert (code, out) == (2, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--runtime-reserve" in lines[0] and "expected auto, off or a number of bytes" in lines[0]


def test_a_settings_file_sets_it(capsys, tmp_path):
    settings = tmp_path / "solver.yaml"
    settings.write_text("runtime_reserve: off\n")
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--config", settings, "--out", tmp_path / "p.json")
    assert code == 0, err
    assert read_plan(tmp_path / "p.json").inputs.runtime_reserve.setting == "off"
    settings.write_text("runtime_reserve: lots\n")
    code, out, err = run(capsys, "solve", CAPTURED, "--devices", 2, "--config", settings)
    assert code == 2 and "runtime_reserve" in err and len(err.strip().splitlines()) == 1
