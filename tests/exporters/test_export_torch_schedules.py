"""The torch-pipelining export of chunked schedules, run for real: plans solved with
``--schedule interleaved-1f1b / looped-bfs / zb-h1 / zbv / dualpipev`` (two chunks per device)
on the captured example GPT, exported, and run by torch.distributed.pipelining's own
multi-stage schedule classes across 2 processes (gloo). Every rank builds exactly the chunks
the plan puts on its device, each chunk holds exactly the plan's layers, and the loss and every
gradient equal the unpipelined model's."""

from __future__ import annotations

import ast
import json

import pytest
from exporthelpers import run, run_ranks
from test_export_torch import MICRO_BATCH, _cross_entropy, _example_gpt, _expected_from_capture

from stagesplit.exporters.render import literal_assignments
from stagesplit.plan import read_plan

MICRO_BATCHES = 4
SCHEDULES = {"interleaved-1f1b": "ScheduleInterleaved1F1B", "looped-bfs": "ScheduleLoopedBFS",
             "zb-h1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
             "dualpipev": "ScheduleDualPipeV"}


def _solve_and_export(capsys, captured_gpt, tmp_path, schedule):
    plan_path, code_path = tmp_path / f"{schedule}.json", tmp_path / f"{schedule}.py"
    code, _, err = run(capsys, "solve", captured_gpt, "--devices", 2, "--schedule", schedule, "--chunks-per-rank", 2,
                       "--micro-batches", MICRO_BATCHES, "--out", plan_path)
    assert code == 0, err
    code, _, err = run(capsys, "export", plan_path, "--to", "torch-pipelining", "-o", code_path)
    assert code == 0, err
    return read_plan(plan_path), code_path.read_text()


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_a_chunked_plan_exports_its_rank_placement(capsys, captured_gpt, tmp_path, schedule):
    pytest.importorskip("torch")
    plan, text = _solve_and_export(capsys, captured_gpt, tmp_path, schedule)
    assert plan.schedule is not None and plan.schedule.chunks_per_rank == 2 and len(plan.stages) == 4
    data = literal_assignments(ast.parse(text))
    placement = [[k for k, s in enumerate(plan.stages) if s.device == r] for r in range(2)]
    assert data["STAGES_OF_RANK"] == placement and data["NUM_STAGES"] == 4
    # the plan's own rank order: looped (0,1,0,1) or V-shaped (0,1,1,0)
    v_shape = schedule in ("zbv", "dualpipev")
    assert placement == ([[0, 3], [1, 2]] if v_shape else [[0, 2], [1, 3]])
    assert (f"schedule = {SCHEDULES[schedule]}(stages, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn, "
            "scale_grads=False)" in text)
    assert "# on every rank (torchrun --nproc-per-node 2 ...)" in text


def _chunked_rank(rank, world, runs, out_dir):
    import torch
    results = {}
    for key, (text, _expected) in runs.items():
        model = _example_gpt()
        vocab, context = 64, 8
        g = torch.Generator().manual_seed(11)
        ids = torch.randint(0, vocab, (MICRO_BATCH * MICRO_BATCHES, context), generator=g)
        targets = torch.randint(0, vocab, ids.shape, generator=g)
        canonical: dict = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            canonical.setdefault(id(p), name)
        alias = {name: canonical[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
        reference = _example_gpt()
        loss = sum(_cross_entropy(reference(ids[i:i + MICRO_BATCH]), targets[i:i + MICRO_BATCH])
                   for i in range(0, len(ids), MICRO_BATCH)) / MICRO_BATCHES
        loss.backward()
        ref_grads = {alias[n]: p.grad for n, p in reference.named_parameters(remove_duplicate=False)}

        ns: dict = {}
        exec(compile(text, "pipe.py", "exec"), ns)
        stages, schedule, tied = ns["build_pipeline"](model, ids[:MICRO_BATCH], torch.device("cpu"), _cross_entropy)
        held = [sorted({alias[n] for n, _ in s.submod.named_parameters()}) for s in stages]
        losses = ns["train_step"](stages, schedule, ids, targets)
        ns["sum_tied_gradients"](tied)
        for s in stages:
            for name, p in s.submod.named_parameters(remove_duplicate=False):
                want = ref_grads[alias[name]]
                got = p.grad if p.grad is not None else torch.zeros_like(p)
                assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max())), (key, rank, name)
        out = {"held": held, "indices": [s.stage_index for s in stages]}
        if any(s.is_last for s in stages):
            out["loss"] = [sum(float(x.detach()) for x in losses) / len(losses), float(loss.detach())]
        results[key] = out
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))


@pytest.mark.slow
def test_chunked_schedules_run_in_torch_and_match_the_unpipelined_model(capsys, captured_gpt, tmp_path):
    from stagesplit.io import load_profile
    profile = load_profile(captured_gpt)
    parameters = {n for n, _ in _example_gpt().named_parameters()}
    runs, plans = {}, {}
    for schedule in SCHEDULES:
        plan, text = _solve_and_export(capsys, captured_gpt, tmp_path, schedule)
        plans[schedule] = plan
        runs[schedule] = (text, _expected_from_capture(profile, plan, parameters))
    run_ranks(2, _chunked_rank, runs, tmp_path)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for schedule, (_, expected) in runs.items():
        plan = plans[schedule]
        for r in range(2):
            chunks = [k for k, s in enumerate(plan.stages) if s.device == r]
            assert results[r][schedule]["indices"] == chunks
            assert results[r][schedule]["held"] == [sorted(expected[k]) for k in chunks]
        last_rank = plan.stages[-1].device
        got, want = results[last_rank][schedule]["loss"]
        assert abs(got - want) <= 1e-5 * abs(want), schedule
