"""End-to-end `stagesplit solve` and `stagesplit sweep` on the shipped samples."""

import json
import subprocess
import sys

from helpers import PROFILES, ROOT
from stagesplit.cli import main
from stagesplit.plan import read_plan

BERT = str(PROFILES / "bert-base.stagesplit")
CNN = str(PROFILES / "cnn.stagesplit")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_solve_summary_plan_and_plots(tmp_path, capsys):
    plan, png, svg = tmp_path / "plan.json", tmp_path / "plan.png", tmp_path / "plan.svg"
    code, out, err = run(capsys, "solve", BERT, "--devices", "4", "--out", str(plan), "--plot", str(png))
    assert code == 0
    assert "split: [ 0 1 2 | 3 4 5 | 6 7 8 | 9 10 11 ]" in out
    assert "status: optimal, proven optimal by the exact DP" in out
    saved = read_plan(plan)
    assert saved.split_text == "[ 0 1 2 | 3 4 5 | 6 7 8 | 9 10 11 ]"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    assert run(capsys, "solve", BERT, "--devices", "4", "--plot", str(svg))[0] == 0
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_solve_compare_shows_greedy_worse(capsys):
    code, out, _ = run(capsys, "solve", CNN, "--devices", "4", "--compare")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.startswith(("stagesplit (optimal) ", "greedy ", "uniform "))}
    assert set(rows) == {"stagesplit", "greedy", "uniform"}
    ratio = float(rows["greedy"].split()[-2])                # step time over the optimal plan's
    assert ratio > 1.0
    assert f"{ratio:.2f}x faster than PopLiner's greedy" in out


def test_solve_json_matches_plan_file(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    code, out, _ = run(capsys, "solve", BERT, "--devices", "3", "--format", "json", "--out", str(plan))
    assert code == 0
    doc = json.loads(out)
    assert doc["split"] == read_plan(plan).split_text
    assert doc["feasible"] is True and doc["status"] == "optimal"


def test_solve_infeasible_says_why(capsys):
    code, out, err = run(capsys, "solve", BERT, "--devices", "2")
    assert code == 1
    assert "no split of the 12 layers fits on 2 device(s); the smallest number that fits is 3" in out


def test_solve_options(capsys):
    code, out, _ = run(capsys, "solve", BERT, "--devices", "5", "--schedule", "1f1b", "--micro-batches", "2",
                       "--headroom", "0.05", "--pin-split", "6", "--objective", "memory")
    assert code == 0
    assert "| 6 " in out.split("split: ")[1].splitlines()[0]
    code, out, _ = run(capsys, "solve", BERT, "--devices", "4", "--target", "ipu-mk2,ipu-mk2,ipu-mk2,ipu-bow")
    assert code == 0


def test_solve_bad_options(capsys):
    for argv, expected in ((["--devices", "4", "--pin-split", "nope"], "--pin-split: no layer named 'nope'"),
                           (["--devices", "4", "--target", "ipu-mk1"], "1216 tiles per device"),
                           (["--devices", "4", "--target", "a,b"], "--target: give one target or 4"),
                           (["--devices", "0"], "--devices: expected an integer >= 1"),
                           (["--devices", "4", "--pin-layer", "3"], "expected LAYER=STAGE")):
        code, out, err = run(capsys, "solve", BERT, *argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("stagesplit: error:") and expected in lines[0]


def test_sweep_table_and_plot(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    code, out, _ = run(capsys, "sweep", BERT, "--devices", "2..5", "--plot", str(png))
    assert code == 0
    assert "fewest devices that fit: 3" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit() or line.strip()[:1].isdigit()]
    assert [r[0] for r in rows][:4] == ["2", "3", "4", "5"]
    assert rows[0][1] == "no" and rows[1][1] == "yes"
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run(capsys, "sweep", BERT, "--devices", "3,4", "--format", "csv")
    assert out.splitlines()[0].startswith("devices,fits,used")


def test_console_script_solve():
    exe = ROOT / ".venv" / "bin" / "stagesplit"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "stagesplit"]
    proc = subprocess.run(command + ["solve", BERT, "--devices", "4"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "split: [ 0 1 2 | 3 4 5 | 6 7 8 | 9 10 11 ]" in proc.stdout


def test_layer_compute_file_overrides_profile_compute(tmp_path, capsys):
    override = tmp_path / "compute.yaml"
    override.write_text('"0": 5.0e6\n"11": 2.0e5\n')
    code, out, _ = run(capsys, "solve", BERT, "--devices", "4", "--layer-compute", str(override))
    assert code == 0
    assert "split: [ 0 | 1 2 3 4 | 5 6 7 8 | 9 10 11 ]" in out
    assert "bottleneck: stage 0 (layers 0..0): 5e+06 cycles" in out
    override.write_text("nope: 1\n")
    code, out, err = run(capsys, "solve", BERT, "--devices", "4", "--layer-compute", str(override))
    assert code == 2 and err.strip() == (f"stagesplit: error: {override}: no layer named 'nope' "
                                         "(layers: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)")


def test_layer_names_with_line_breaks_stay_on_their_row(tmp_path, capsys):
    """A hostile per-layer file whose layer names hold line breaks and control characters: the
    text tables escape them, so every row of the stage table is one line; JSON keeps them."""
    layers = [{"name": name, "weights": 4 * 2**30, "activations": 2**30, "output": 2**20, "compute": 1e12}
              for name in ("embed\nding", "block\r0", "block\t1", "head\x1b[31m")]
    doc = {"format": "stagesplit-profile", "version": 1, "kind": "layers", "name": "hostile", "target": "a100-80gb",
           "training": True, "compute_unit": "flops", "layers": layers}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    code, out, _ = run(capsys, "solve", str(path), "--devices", "2")
    assert code == 0
    assert "embed\\nding" in out and "block\\r0" in out and "head\\x1b[31m" in out
    assert "\x1b" not in out and "\r" not in out
    assert not any(line in ("ding", "embed") for line in out.splitlines())
    code, out, _ = run(capsys, "solve", str(path), "--devices", "2", "--format", "json")
    assert code == 0 and "embed\\nding" in out and json.loads(out)
    plan = tmp_path / "plan.json"
    assert run(capsys, "solve", str(path), "--devices", "2", "--compare", "--out", str(plan))[0] == 0
    for argv in (["breakdown", str(path)], ["sweep", str(path), "--devices", "1..3"],
                 ["diagnose", str(path), "--plan", str(plan)]):
        code, out, _ = run(capsys, *argv)
        assert code == 0, argv
        assert not any(ord(ch) < 32 and ch != "\n" for ch in out), argv
        assert "embed\\nding" in out and not any(line.startswith("ding") for line in out.splitlines()), argv
