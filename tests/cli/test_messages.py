"""Error messages that say what went wrong and what to do: a profile given where a plan is
expected says what the file is; a plan for another model says which model it was made for;
install hints name how to install from a checkout too."""

from __future__ import annotations

import sys

import pytest

from helpers import PROFILES
from stagesplit.cli import main

BERT = str(PROFILES / "bert-base.stagesplit")
LLAMA = str(PROFILES / "llama-7b-layers.json")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", [["export", BERT, "--to", "poptorch"], ["report", BERT, "-o", "r.html"]])
def test_a_compact_profile_given_as_a_plan_says_what_it_is(capsys, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *command)
    assert code == 2 and out == ""
    assert err == (f"stagesplit: error: {BERT} is not a plan: it is a zip archive, as a compact stagesplit profile "
                   f"(.stagesplit, .npz) is; a profile? make a plan from it with stagesplit solve {BERT} --devices N "
                   "--out plan.json\n")


def test_a_json_profile_given_as_a_plan_says_what_it_is(capsys):
    code, _, err = run(capsys, "export", LLAMA, "--to", "megatron")
    assert code == 2
    assert err == (f'stagesplit: error: {LLAMA} is a stagesplit profile (format "stagesplit-profile"), not a plan: '
                   f"make a plan from it first with stagesplit solve {LLAMA} --devices N --out plan.json\n")


def test_a_plan_for_another_model_names_that_model(capsys, tmp_path):
    plan = tmp_path / "cnn-plan.json"
    assert run(capsys, "solve", PROFILES / "cnn.stagesplit", "--devices", "12", "--out", plan)[0] == 0
    code, _, err = run(capsys, "diagnose", BERT, "--plan", plan)
    assert code == 2
    assert err.startswith(f"stagesplit: error: {plan}: the plan was made for cnn-efficientnet with 26 layers (0, 1, 2, "
                          "3...), but this profile (bert-base) has 12 (0, 1, 2, 3...)")


def test_a_plan_for_another_profile_with_the_same_layers_warns(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    other = tmp_path / "bert-seed-3.stagesplit"
    assert run(capsys, "solve", BERT, "--devices", "6", "--out", plan)[0] == 0
    assert run(capsys, "synth", "bert-base", "-o", other, "--seed", "3")[0] == 0
    code, out, err = run(capsys, "diagnose", other, "--plan", plan)
    assert code == 0 and out.startswith("Stage 0")
    assert err.startswith(f"stagesplit: warning: {plan} was made for bert-base (SHA-256 ")
    assert "not this file (SHA-256 " in err and "diagnosed on this profile's figures" in err


def test_capture_without_torch_says_how_to_install_it_from_a_checkout_too(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)              # import torch raises ImportError
    factory = tmp_path / "model.py"
    factory.write_text("def build():\n    raise AssertionError('not reached')\n")
    code, _, err = run(capsys, "capture", f"{factory}:build", "-o", tmp_path / "m.stagesplit")
    assert code == 2
    assert err == ("stagesplit: error: stagesplit capture needs PyTorch: pip install 'stagesplit[torch]' (from a "
                   "checkout of stagesplit: pip install '.[torch]')\n")
