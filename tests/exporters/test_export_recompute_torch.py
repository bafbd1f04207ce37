"""The plan's recompute applied through the torch-pipelining export and run for real (#24, #30).

The example GPT and a Hugging Face Llama (tests/recompute_models.py: activation-heavy
configurations) are captured once, without recompute, and solved for 2 devices with
``--recompute full``, and with ``--recompute auto`` under a capacity between what the plan needs
with every layer recomputed and without any (so that the solver recomputes some layers and not
others), for Schedule1F1B and Interleaved 1F1B, 2 chunks per device. Each plan is exported to
torch-pipelining, and the exported file's own program (``build_pipeline``: the GPT traced by
``pipeline()`` and the plan's ``RECOMPUTE`` applied to the traced stage modules, the Llama's
stages built from its modules with each planned block checkpointed; ``train_step``, Adam,
``zero_grad`` as the export sets it) runs across 2 processes (gloo), with MemTracker per rank
(``tests/pipeline_harness.run_exported``). Each rank's peak is within 5% of the plan's predicted
peak, exactly the planned blocks run checkpointed, and the loss and every gradient equal the
unpipelined model's.
"""

from __future__ import annotations

import ast
import functools

import numpy as np
import pytest
from exporthelpers import run

import recompute_models as rm
from stagesplit.exporters.render import literal_assignments
from stagesplit.plan import read_plan

pytestmark = pytest.mark.slow

TOLERANCE = 0.05
MICRO_BATCHES = 4
SCHEDULES = {"gpt": (("1f1b", 1), ("interleaved-1f1b", 2)), "llama": (("1f1b", 1), ("interleaved-1f1b", 2))}
WRAPPED = "_checkpoint_wrapped_module."


def _loss(output, target):
    """The captures' loss (the logits summed), for a traced stage's output of any form."""
    if hasattr(output, "logits"):
        output = output.logits
    elif isinstance(output, (tuple, list)):
        output = output[0]
    return output.sum()


def _target(path, capacity: int) -> str:
    path.write_text(f"kind: gpu\ndescription: a device of {capacity} bytes\ntiles: 1\nbytes_per_tile: {capacity}\n"
                    "flops_per_s: 312000000000000\nmemory_bytes_per_s: 2039000000000\n")
    return str(path)


def _plans(capsys, tmp_path, name: str) -> list:
    """(schedule, mode, plan, exported text) for every case of ``name``."""
    from stagesplit.io import save_profile
    profile = tmp_path / f"{name}.stagesplit"
    save_profile(rm.capture(name), profile)
    out = []
    for kind, v in SCHEDULES[name]:
        common = ["--devices", 2, "--schedule", kind, "--chunks-per-rank", v, "--micro-batches", MICRO_BATCHES]
        needs = {}
        for mode in ("none", "full"):
            plan_path = tmp_path / f"{name}-{kind}-{mode}.json"
            code, _, err = run(capsys, "solve", profile, *common, "--recompute", mode, "--out", plan_path)
            assert code == 0, err
            needs[mode] = max(r.peak_bytes for r in read_plan(plan_path).schedule.ranks)
            if mode == "full":
                out.append((kind, mode, plan_path))
        assert needs["full"] < 0.8 * needs["none"], needs
        capacity = (needs["none"] + needs["full"]) // 2
        plan_path = tmp_path / f"{name}-{kind}-auto.json"
        # the plan runs on CPU processes: no CUDA context or NCCL buffers to keep back on the device
        code, _, err = run(capsys, "solve", profile, *common, "--recompute", "auto", "--target",
                           _target(tmp_path / f"{name}-{kind}.yaml", capacity), "--runtime-reserve", "off",
                           "--out", plan_path)
        assert code == 0, err
        out.append((kind, "auto", plan_path))
    cases = []
    for kind, mode, plan_path in out:
        plan = read_plan(plan_path)
        code, _, err = run(capsys, "export", plan_path, "--to", "torch-pipelining", "-o", plan_path.with_suffix(".py"))
        assert code == 0, err
        cases.append((kind, mode, plan, plan_path.with_suffix(".py").read_text()))
    return cases


def _layer_choice(plan) -> list[str]:
    return [r for s in plan.stages for r in (s.recompute or ("none",) * len(s.layers))]


def _reference(name: str) -> tuple[float, dict]:
    ids, _ = rm.batch(name, MICRO_BATCHES)
    model = rm.model(name, "none")
    loss = _loss(model(ids), None)
    loss.backward()
    # the exported train_step divides the gradients by the micro-batches: the mean
    return float(loss.detach()), {n: p.grad.detach().numpy() / MICRO_BATCHES for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["gpt", pytest.param("llama", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None, reason="needs transformers"))])
def test_the_exported_recompute_runs_in_torch_within_5_percent_of_the_plan(capsys, tmp_path, name):
    pytest.importorskip("torch")
    import pipeline_harness as h
    cases = _plans(capsys, tmp_path, name)
    L = rm.num_layers(name)
    for kind, mode, plan, text in cases:
        chosen = _layer_choice(plan)
        recompute = literal_assignments(ast.parse(text))["RECOMPUTE"]
        assert sorted(recompute.values()) == sorted(r for r in chosen if r != "none")
        if mode == "full":
            assert chosen == ["full"] * L
        else:            # the capacity makes the solver recompute some layers, not all
            assert 0 < sum(r != "none" for r in chosen) < L, (kind, chosen)
    batch = functools.partial(rm.batch, name, MICRO_BATCHES)
    runs = [h.ExportedCase(text, functools.partial(rm.model, name, "none"), batch, loss=_loss)
            for _, _, _, text in cases]
    results = h.run_exported(runs, 2, timeout_s=600)
    want_loss, want_grads = _reference(name)
    rows, worst = [], 0.0
    for (kind, mode, plan, text), per_rank in zip(cases, results):
        chosen = ", ".join(f"stage {s.stage}: {'/'.join(s.recompute) if s.recompute else 'none'}" for s in plan.stages)
        for r, measured in enumerate(per_rank):
            predicted = plan.schedule.ranks[r].peak_bytes
            error = (predicted - measured.peak_bytes) / measured.peak_bytes
            worst = max(worst, abs(error))
            rows.append(f"  {kind:17s} {mode:4s} rank {r}: measured {measured.peak_bytes:>11,} predicted "
                        f"{predicted:>11,} {100 * error:+6.2f}%" + (f"   [{chosen}]" if r == 0 else ""))
            for fqn, grad in measured.grads.items():
                want = want_grads[fqn]
                assert np.allclose(grad, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max())), (kind, mode, fqn)
        # the blocks the plan recomputes, and only those, run checkpointed: their parameters sit under the
        # checkpoint wrapper in the stage modules
        blocks = sorted(literal_assignments(ast.parse(text))["RECOMPUTE"])
        wrapped = {block for result in per_rank for fqn, own in result.stage_names.items() if WRAPPED in own
                   for block in blocks if fqn.startswith(block + ".")}
        plain = {block for result in per_rank for fqn, own in result.stage_names.items() if WRAPPED not in own
                 for block in blocks if fqn.startswith(block + ".")}
        assert wrapped == set(blocks) and not plain, (kind, mode, wrapped, plain)
        held = {fqn for result in per_rank for fqn in result.grads}
        assert held == set(want_grads), (kind, mode)
        losses = next(result.losses for result in per_rank if result.losses)
        # float32 sums of every logit, in two orders: as close as the gradients (rtol 1e-4)
        assert sum(losses) == pytest.approx(want_loss, rel=1e-4)
    print(f"\n{name}: the plan's recompute on 2 ranks (MemTracker vs the plan)\n" + "\n".join(rows))
    assert worst <= TOLERANCE, "\n".join(rows)
