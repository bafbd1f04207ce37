"""Every command speaks the device's language: on a GPU profile (one pool of device memory) GiB,
"device", aten operations and modules, never tiles or IPU code categories; on an IPU profile
tiles, bytes per tile and code categories. Checked on a per-layer GPU profile, on a profile
captured from PyTorch (slow: it imports torch) and on an IPU profile, for solve (text and
plot), sweep, breakdown, diagnose, targets, export and report. One unit rule: GiB = 2**30."""

from __future__ import annotations

import re

import pytest

from helpers import PROFILES
from stagesplit.cli import main

LLAMA = PROFILES / "llama-7b-layers.json"
BERT = PROFILES / "bert-base.stagesplit"
#: words that mean nothing on a one-tile GPU
IPU_WORDS = re.compile(r"\btiles?\b|vertex|exchange code|control code|code\+state|\(MB\)|\(GB\)|\bMB\b", re.I)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def gpu_outputs(capsys, profile, folder, devices: int):
    """Every command's text on a GPU profile, by command."""
    plan, svg, page = folder / "plan.json", folder / "plan.svg", folder / "report.html"
    texts = {"solve": run(capsys, "solve", profile, "--devices", devices, "--schedule", "1f1b", "--compare",
                          "--out", plan, "--plot", svg)[0]}
    texts["plot"] = svg.read_text()
    texts["sweep"] = run(capsys, "sweep", profile, "--devices", f"{devices - 1}..{devices}")[0]
    texts["breakdown"] = run(capsys, "breakdown", profile, "--sections", "summary,layers,totals")[0]
    texts["diagnose"] = run(capsys, "diagnose", profile, "--plan", plan)[0]
    texts["export"] = run(capsys, "export", plan, "--to", "megatron")[0].split("\n\n")[0]   # its header
    run(capsys, "report", plan, profile, "-o", page)
    texts["report"] = page.read_text().split("<h2>Export</h2>")[0]             # the snippets are the frameworks'
    return texts


def check_gpu(texts: dict[str, str]) -> None:
    for command, text in texts.items():
        found = IPU_WORDS.findall(re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text))
        assert found == [], f"{command} says {found[:3]} on a GPU"
        assert "GiB" in text, command


def test_a_per_layer_gpu_profile_in_every_command(capsys, tmp_path):
    texts = gpu_outputs(capsys, LLAMA, tmp_path, 4)
    check_gpu(texts)
    # 0.75 GiB of each 80 GiB device kept back: the CUDA context (0.50) and NCCL's buffers (0.25)
    assert "memory: fullest stage 0 uses 43.43 of 79.25 GiB (54.8%)" in texts["solve"]
    assert "device memory (GiB)" in texts["plot"]
    assert "whole model on one device" in texts["breakdown"] and "118.20 of 80.00 GiB" in texts["breakdown"]
    assert re.search(r"peak at .* \(step \d+\)", texts["diagnose"]) and "capacity 79.25 GiB" in texts["diagnose"]
    assert "memory (GiB)" in texts["sweep"]
    assert "memory 43.43 GiB of 79.25 GiB" in texts["export"]


@pytest.mark.slow
def test_a_captured_profile_in_every_command(capsys, tmp_path):
    pytest.importorskip("torch")
    factory = tmp_path / "small_gpt.py"
    factory.write_text(f"import sys\nsys.path.insert(0, {str(PROFILES.parent)!r})\n"
                       "from examples.gpt import GPTConfig, build as build_gpt\n\n\n"
                       "def build():\n    return build_gpt(GPTConfig(layers=4, d_model=64, context=32, "
                       "vocab_size=512, batch=2))\n")
    profile = tmp_path / "gpt.stagesplit"
    run(capsys, "capture", f"{factory}:build", "-o", profile)
    texts = gpu_outputs(capsys, profile, tmp_path, 3)
    check_gpu(texts)
    # the peak names the aten operation and the module running at it
    assert re.search(r"peak at aten\.\w+ in [\w.]+( \(\w+\))? \(step \d+\)", texts["diagnose"])
    assert re.search(r"aten\.\w+ in transformer\.h\.\d", texts["diagnose"])
    assert "module" in texts["breakdown"] and "transformer.h.0" in texts["breakdown"]


def test_an_ipu_profile_in_every_command(capsys, tmp_path):
    plan, svg, page = tmp_path / "plan.json", tmp_path / "plan.svg", tmp_path / "report.html"
    solve = run(capsys, "solve", BERT, "--devices", "4", "--compare", "--out", plan, "--plot", svg)[0]
    assert "on tile 1238 (84.4%)" in solve and "worst tile bytes" in solve and "GiB" not in solve
    assert "worst tile memory (KiB)" in svg.read_text() and "capacity per tile" in svg.read_text()
    breakdown = run(capsys, "breakdown", BERT)[0]
    assert "1,472 tiles x 638,976 bytes" in breakdown and "vertex code" in breakdown and "GiB" not in breakdown
    diagnose = run(capsys, "diagnose", BERT, "--plan", plan)[0]
    assert re.search(r"bottleneck tile \d+ at step \d+", diagnose) and "bytes per tile" in diagnose
    header = run(capsys, "export", plan, "--to", "poptorch")[0]
    assert "at the worst tile" in header
    run(capsys, "report", plan, BERT, "-o", page)
    assert "worst tile" in page.read_text() and "PopLiner&#x27;s greedy" in page.read_text()


def test_targets_and_solve_agree_on_a_gib(capsys, tmp_path):
    targets = run(capsys, "targets")[0]
    a100 = next(line for line in targets.splitlines() if line.startswith("a100-80gb "))
    solve = run(capsys, "solve", LLAMA, "--devices", "4")[0]
    assert a100.split()[4] == "80.00" and "(80.00 GiB each)" in solve
