"""Every script under benchmarks/ runs: each in its ``--tiny`` mode (the script's own code path
on tiny inputs, in seconds; validate_gpu.py's CPU half, ``--predict``), in a fresh interpreter
from the repository root as the docs say to run them, so that a refactor of the package cannot
break one silently. What each prints is checked where the tiny inputs fix it (the files that
must be byte-identical are, the plain DP and stagesplit agree, the layers found)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

BENCHMARKS = ROOT / "benchmarks"

#: each script's arguments: --tiny, and the optional parts too (--extended, --each), so that
#: every table's code runs ({tmp}: the test's own temporary folder)
ARGUMENTS = {
    "bench_allocator.py": ["--tiny"],
    "bench_capture.py": ["--tiny"],
    "bench_core.py": ["--tiny"],
    "bench_exported.py": ["--tiny"],
    "bench_layouts.py": ["--tiny"],
    "bench_onnx.py": ["--tiny"],
    "bench_popliner.py": ["--tiny"],
    "bench_popvision.py": ["--tiny"],
    "bench_pva_export.py": ["--tiny"],
    "bench_scale.py": ["--tiny"],
    "bench_schedules.py": ["--tiny", "--each"],
    "bench_solver.py": ["--tiny", "--extended"],
    "bench_startup.py": ["--tiny"],
    "bench_steptime.py": ["--tiny"],
    "bench_synth.py": ["--tiny"],
    "bench_tensor_parallel.py": ["--tiny"],
    "bench_variants.py": ["--tiny"],
    "validate_allocator.py": ["--predict", "{tmp}/sequences.json", "--tiny"],
    "validate_gpu.py": ["--predict", "{tmp}/predictions.json"],
}
#: the packages a script needs beyond the test command's core (skipped, with the reason, without them)
NEEDS = {"bench_allocator.py": ("torch", "transformers"), "bench_tensor_parallel.py": ("torch", "transformers"), "bench_capture.py": ("torch",), "bench_exported.py": ("torch", "transformers"), "bench_schedules.py": ("torch", "transformers"), "bench_onnx.py": ("onnx",),
         "bench_layouts.py": ("torch", "transformers"), "bench_steptime.py": ("torch", "transformers"),
         "validate_gpu.py": ("torch",), "validate_allocator.py": ("torch",)}


def test_every_script_is_run():
    """A new script under benchmarks/ gets its tiny run here."""
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(ARGUMENTS)


@pytest.fixture(scope="module")
def temp_folder(tmp_path_factory):
    """One temporary folder for the whole module (TMPDIR): the scripts cache their generated
    profiles there, so the tiny BERT is made once, and nothing is left in the system's."""
    return tmp_path_factory.mktemp("benchmarks-tmp")


def run_script(name: str, folder, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(folder)}
    arguments = [a.format(tmp=tmp_path) for a in ARGUMENTS[name]]
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *arguments], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=600)


def rows_of(stdout: str) -> dict[str, str]:
    """A ``print_table`` table's rows: measure -> value (two or more spaces apart)."""
    out = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 2:
            out.setdefault(cells[0], cells[1])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_benchmark_runs(name, temp_folder, tmp_path):
    for module in NEEDS.get(name, ()):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{name} needs {module}, which is not installed")
    done = run_script(name, temp_folder, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    out = done.stdout
    rows = rows_of(out)
    check = CHECKS.get(name)
    if check is not None:
        check(out, rows, tmp_path)


def check_core(out, rows, tmp_path):
    assert "Core benchmark: 4-layer BERT profile (synthetic; --tiny)" in out
    assert rows["layers / tiles / program steps"].startswith("4 / 1,472 / ")
    assert "price all 10 layer ranges" in rows                   # 4 layers: 4 * 5 / 2 ranges


def check_steptime(out, rows, tmp_path):
    # two plans of the tiny Llama, the solver's and one pinned 2 / 6, both priced and both run; the table's
    # rows and the order line are the script's (the figures are the machine's: docs/benchmarks.md)
    lines = [line for line in out.splitlines() if line.startswith("| 1f1b | 4 | ")]
    assert [line.split(" | ")[2] for line in lines] == ["0-3 / 4-7 (solver)", "0-1 / 2-7 (pinned)"], out
    assert re.search(r"within 10%: [0-2] of 2", out) and "order 1f1b, 4 micro-batches: " in out
    assert "2 plans, 2 rounds, in " in out


def check_exported(out, rows, tmp_path):
    # the exported Llama's program on 2 processes: the loss equal to the unpipelined model's, every rank's
    # peak near the plan's, and the README's table row
    row = next(line for line in out.splitlines() if line.startswith("llama "))
    cells = row.split()
    assert cells[:4] == ["llama", "1f1b", "2", "4"] and cells[7] == "yes", row
    assert abs(float(cells[4].rstrip("%"))) <= 3.0 and float(cells[8]) <= 1e-4, row
    assert "| llama | " in out and "1 runs in " in out


def check_scale(out, rows, tmp_path):
    assert "Scale: 6 layers" in out and "6 IPUs" in out
    assert re.search(r"solve \(exact DP; CP-SAT for what it leaves\)\s+\S+ s \(optimal, \d stages\)", out)
    assert rows["device counts solved"] == "6"


def check_solver(out, rows, tmp_path):
    # the plain DP and stagesplit find the same optimum in every case
    compared = [line for line in out.splitlines() if line.startswith("12 x 4")]
    assert len(compared) == 5 and all(line.rstrip().endswith("yes") for line in compared), compared
    assert "solve --time-limit 2, 40 layers x 8 devices" in out
    assert "Solver benchmark: bert-large@3, 4 layers on 3 devices" in out        # --extended's tables
    assert out.count("Solver benchmark: 16 layers on 6 mixed devices") == 3


def check_popliner(out, rows, tmp_path):
    # PopLiner's code is not here: that part is skipped, saying so, and stagesplit's half runs
    assert "PopLiner side-by-side skipped: pass --popliner DIR" in out
    assert re.search(r"stagesplit split \(optimal, 2 stages\)\s+0-1 \| 2-3", out)
    assert rows["layers found (each tool's default layer regex)"] == "stagesplit 4"


def check_popvision(out, rows, tmp_path):
    assert out.startswith("bert-base on ipu-mk2: 174,069 variables")
    assert "diagnose: bottleneck tile" in out


def check_pva_export(out, rows, tmp_path):
    assert "PopVision export: bert-base 2 layers" in out
    assert rows["the two files byte-identical"] == "yes"


def check_synth(out, rows, tmp_path):
    assert "synth bert-base --layers 2:" in out and rows["the two files byte-identical"] == "yes"


def check_onnx(out, rows, tmp_path):
    assert "ONNX import: 100 nodes, training (Adam), batch 4" in out and rows["nodes"] == "100"


def check_capture(out, rows, tmp_path):
    found = [line for line in out.splitlines() if line.startswith("layers found (the module tree's blocks)")]
    assert [line.split()[-2:] for line in found] == [["8", "8"], ["4", "4"]]
    assert "split (optimal): [ 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 ]" in out


def check_schedules(out, rows, tmp_path):
    assert "Llama, 8 blocks, hidden 64, sequence 32 (--tiny), 2 x a100-80gb, --schedule auto" in out
    assert "Every schedule alone" in out and "fewest 80 GB GPUs" in out


def check_allocator(out, rows, tmp_path):
    assert "Caching-allocator replay: Llama shapes 8 and 4 blocks deep, hidden 64 (--tiny)" in out
    lines = [line.split() for line in out.splitlines() if line.startswith(("llama-8 ", "llama-4 "))]
    assert [(x[0], x[1]) for x in lines] == [(m, k) for m in ("llama-8", "llama-4") for k in ("1f1b", "zbv")]
    for x in lines:
        low, high = (float(v) for v in x[8].split("-"))
        assert 1.0 <= low <= high                     # the allocator reserves at least what it hands out


def check_startup(out, rows, tmp_path):
    assert "Start-up: median of 1 run in a fresh interpreter" in out
    light = [line for line in out.splitlines() if line.startswith("stagesplit ")]
    assert len(light) == 4 and all("heavy imports: none" in line for line in light), light


def check_variants(out, rows, tmp_path):
    assert "Profile variants of the synthetic BERT-base" in out and "Per-layer variants at scale" in out


def check_validate_allocator(out, rows, tmp_path):
    cases = json.loads((tmp_path / "sequences.json").read_text())
    assert out.strip() == f"{len(cases)} sequences written to {tmp_path / 'sequences.json'}" and len(cases) == 8
    assert all(c["reserved"] >= c["allocated"] > 0 for c in cases)
    # the GPU half: without a GPU one line (exit 2); on a GPU every sequence replayed by torch's allocator
    measured = subprocess.run([sys.executable, str(BENCHMARKS / "validate_allocator.py"), "--measure",
                               str(tmp_path / "sequences.json")], cwd=str(ROOT), capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    import torch
    if torch.cuda.is_available():
        assert measured.returncode in (0, 1), measured.stdout + measured.stderr
        assert f"of {len(cases)} exact" in measured.stdout
    else:
        assert measured.returncode == 2 and measured.stdout == ""
        assert measured.stderr.startswith("validate_allocator: no CUDA device here")


def check_validate_gpu(out, rows, tmp_path):
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert out.strip() == f"{len(predictions)} stage predictions written to {tmp_path / 'predictions.json'}"
    assert [(r["schedule"], r["stage"]) for r in predictions] == [(s, k) for s in ("none", "1f1b") for k in range(4)]
    assert all(r["predicted"] > 0 for r in predictions)
    # the GPU half: without a GPU it says so in one line (exit 2); on a GPU it measures every predicted
    # stage (exit 1 where the 5% target is missed: that is the benchmark's finding, not a breakage)
    import torch
    measured = subprocess.run([sys.executable, str(BENCHMARKS / "validate_gpu.py"), "--measure",
                               str(tmp_path / "predictions.json")], cwd=str(ROOT), capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    if torch.cuda.is_available():
        assert measured.returncode in (0, 1), measured.stdout + measured.stderr
        assert len(re.findall(r"\(([\d,]+) vs ([\d,]+) bytes\)", measured.stdout)) == len(predictions)
        assert "worst error" in measured.stdout
    else:
        assert measured.returncode == 2 and measured.stdout == ""
        assert measured.stderr.startswith("validate_gpu: no CUDA device here")


CHECKS = {"bench_allocator.py": check_allocator, "bench_core.py": check_core, "bench_exported.py": check_exported, "bench_steptime.py": check_steptime, "bench_scale.py": check_scale, "bench_solver.py": check_solver,
          "bench_popliner.py": check_popliner, "bench_popvision.py": check_popvision,
          "bench_pva_export.py": check_pva_export, "bench_synth.py": check_synth, "bench_onnx.py": check_onnx,
          "bench_capture.py": check_capture, "bench_schedules.py": check_schedules, "bench_startup.py": check_startup,
          "bench_variants.py": check_variants, "validate_gpu.py": check_validate_gpu,
          "validate_allocator.py": check_validate_allocator}
