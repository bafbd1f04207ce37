"""Tied parameters a split divides (#21): which tied users land on different stages, for the
warning solve prints and for the exports that must refuse or sum them."""

from __future__ import annotations

import pytest
from exporthelpers import make_plan, run

from stagesplit.exporters import plan_tied_splits
from stagesplit.exporters.tied import TiedSplit, shared_parameter_users, tied_users_across_stages
from stagesplit.plan import read_plan

PATHS = ["transformer.h.0", "transformer.h.1", "transformer.h.2", "transformer.h.3"]


def test_users_by_module_path_and_by_layer_index():
    stages = [[0, 1], [2, 3]]
    tied = {"transformer.wte.weight": [0, "transformer.h.3.mlp"], "shared.bias": ["transformer.h.0.attn", 1],
            "self.tie": ["transformer.h.2", "transformer.h.2.ln_1"]}
    (split,) = tied_users_across_stages(stages, PATHS, tied)
    assert split == TiedSplit(parameter="transformer.wte.weight", stages=(0, 1),
                              users=(("0", 0), ("transformer.h.3.mlp", 1)))
    assert split.message() == (
        "parameter 'transformer.wte.weight' is tied between stages 0, 1 (0 on stage 0, transformer.h.3.mlp on stage "
        "1): pipeline frameworks keep one copy per stage, so sum the copies' gradients across those stages before "
        "each optimizer step (the torch-pipelining export does), or they untie")


def test_the_longest_module_path_wins_and_slashes_read_as_dots():
    paths = ["enc/layer1", "enc/layer1.sub", "enc/layer2"]
    (split,) = tied_users_across_stages([[0], [1], [2]], paths, {"w": ["enc.layer1.sub.x", "enc/layer2/y"]})
    assert split.stages == (1, 2)


@pytest.mark.parametrize("user, error", [("transformer.wte", "under no layer's module path"), (7, "outside"),
                                         (True, "not a bool"), (1.5, "not float")])
def test_unplaceable_users_are_refused(user, error):
    with pytest.raises((ValueError, TypeError), match=error):
        tied_users_across_stages([[0, 1], [2, 3]], PATHS, {"w": [user, 0]})


def test_a_capture_s_tied_embedding_lands_on_the_first_and_last_stage(capsys, captured_gpt, tmp_path):
    """The example GPT ties lm_head to wte: the capture names the parameter once, shared; its
    users are the first and the last layer (the embedding and the head fold into them)."""
    from stagesplit.io import load_profile
    from stagesplit.layers import group_layers
    profile = load_profile(captured_gpt)
    users = shared_parameter_users(profile, group_layers(profile).op_layer)
    assert users == {"transformer.wte.weight": (0, 5)}
    for devices, pins, want in [(2, ["3"], ((0, 1),)), (1, [], ())]:
        argv = ["solve", captured_gpt, "--devices", devices, "--exact", "--out", tmp_path / "plan.json"]
        for pin in pins:
            argv += ["--pin-split", pin]
        code, _, err = run(capsys, *argv)
        assert code == 0, err
        splits = plan_tied_splits(read_plan(tmp_path / "plan.json"), users)
        assert tuple(s.stages for s in splits) == want


def test_an_untied_model_has_no_shared_parameters():
    from helpers import PROFILES
    from stagesplit.io import load_profile
    from stagesplit.layers import group_layers
    profile = load_profile(PROFILES / "llama-7b-layers.json")
    assert shared_parameter_users(profile, group_layers(profile).op_layer) == {}
    plan = make_plan(["a", "b"], [0, 1])
    assert plan_tied_splits(plan, {}) == ()


def test_solve_records_tied_parameters_warns_and_torchtitan_refuses_the_plan(capsys, captured_gpt, tmp_path):
    """The plan records the tied parameter (layers 0 and 5); a split dividing them warns in
    solve and the command-line torchtitan export refuses it, reading the plan alone."""
    plan_path = tmp_path / "plan.json"
    code, _, err = run(capsys, "solve", captured_gpt, "--devices", "2", "--exact", "--pin-split", "3", "--out", plan_path)
    assert code == 0
    assert ("stagesplit: warning: parameter 'transformer.wte.weight' is used by layers on stages 0, 1 (tied weights)"
            in err)
    plan = read_plan(plan_path)
    assert [(t.name, t.layers) for t in plan.tied] == [("transformer.wte.weight", (0, 5))]
    assert [(t.name, stages) for t, stages in plan.tied_across_stages()] == [("transformer.wte.weight", (0, 1))]
    code, out, err = run(capsys, "export", plan_path, "--to", "torchtitan")
    assert (code, out) == (2, "")
    assert "torchtitan refuses pipeline parallelism for models with tied weights" in err
    assert len(err.strip().splitlines()) == 1
    one = tmp_path / "one.json"
    assert run(capsys, "solve", captured_gpt, "--devices", "1", "--out", one)[0] == 0
    assert read_plan(one).tied_across_stages() == []          # one stage: nothing divided, nothing said
