"""The pipeline floors with recompute (plan/pipeline_floor.py): by hand (the stage bound ``V`` and its
dynamic programs, the recompute's knapsack lines, the ranks' busy time); against every split and
recompute choice of a small Llama and a random stack under each ZeRO stage, simulated by the engine's
own accounting (no rank holds less than the bytes floor; where every rank fits, no stage works less
than the seconds floor, nor do the stages recompute less together, nor are the ranks busy less
together); and in the layout search, settling combinations the engine would settle, the answer
unchanged."""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import pytest

from stagesplit import api

torch = pytest.importorskip("torch")


@functools.cache
def _llama(blocks: int = 3):
    """A Llama from a config (``blocks`` blocks 64 wide, sequence 32, two sequences), captured with
    float32 parameters and Adam: its blocks have selective and full recompute options. Captured once per
    worker and depth (the tests only read it)."""
    transformers = pytest.importorskip("transformers")
    from stagesplit.capturing.pytorch import capture_model
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=blocks,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   use_cache=False, tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    ids = torch.zeros(2, 32, dtype=torch.long, device="meta")
    return capture_model(model, {"input_ids": ids, "labels": ids}, allocator_round=1, name="llama")


def _stack(seed: int = 3):
    from stagesplit.capturing.pytorch import capture_model
    rng = np.random.default_rng(seed)
    widths = [int(w) for w in rng.integers(8, 160, 6)]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1)])
    return capture_model(model, torch.empty(8, widths[0], device="meta"), allocator_round=1, name="stack")


def _floors(L: int, **kw):
    """A ``RangeFloors`` of ``L`` layers from per-range arrays given by hand, the recompute's knots made
    from each layer's options (``saved`` and ``added``: (3, L), rows none, selective, full)."""
    from stagesplit.plan.pipeline_floor import RangeFloors, _knot_tables, _pieces
    knots = _knot_tables(*_pieces(kw.pop("saved"), kw.pop("added")), L)
    return RangeFloors(**kw, knots=knots[0], knot_saved=knots[1], knot_cost=knots[2])


def test_the_recompute_cost_is_the_knapsack_over_each_layers_options_by_hand():
    """Layer 0: selective saves 4 bytes for 1 s, full 10 for 4 s (the 6 more at 0.5 s a byte, dearer
    than selective's 0.25: two pieces); layer 1: selective 5 for 5 s, full 6 for 3 s (selective lies
    above the line to full: one piece, 6 bytes for 3 s). Both layers: 4 bytes cost 1 s, 7 cost 1 + 3 x
    0.5 = 2.5 s, all 16 cost 7 s; layer 1 alone: 6 bytes cost 3 s."""
    from stagesplit.plan.pipeline_floor import _knot_tables, _pieces
    saved = np.array([[0.0, 0.0], [4, 5], [10, 6]])
    added = np.array([[0.0, 0.0], [1, 5], [4, 3]])
    layer, size, cost = _pieces(saved, added)
    assert layer.tolist() == [0, 0, 1] and size.tolist() == [4, 6, 6] and cost.tolist() == [1, 3, 3]
    knots, knot_saved, knot_cost = _knot_tables(layer, size, cost, 2)
    assert knots.tolist() == [0.25, 0.5]
    rf = _floors(2, roles={}, forward_cut=np.zeros(3), backward_cut=np.zeros(3), unstashed=np.zeros(3),
                 model_output=0.0, stash=np.zeros((2, 2)), full_backward=np.zeros((2, 2)), own=np.zeros((2, 2)),
                 held=np.zeros((2, 2)), saves=np.zeros((2, 2)), saved=saved, added=added)
    for s, expected in ((4, 1.0), (7, 2.5), (16, 7.0), (0, 0.0)):
        assert rf.recompute_cost(np.full((2, 2), float(s)))[0, 1] == pytest.approx(expected)
    assert rf.recompute_cost(np.full((2, 2), 6.0))[1, 1] == pytest.approx(3.0)


def _two_layers():
    """Two layers of 10 parameter bytes; 4 bytes cross the cut each way; the model's output 3 bytes;
    each layer a stash of 6 bytes (4 its own, all of which full recompute saves for 2 s, holding 1
    again in its backward) and a full backward 5 bytes over what it holds all step."""
    L = 2
    tri = np.triu(np.ones((L, L)))
    return _floors(L, roles={"param": np.full(L, 10.0), "grad": np.zeros(L), "state": np.zeros(L),
                             "other": np.zeros(L)},
                   forward_cut=np.array([0.0, 4, 0]), backward_cut=np.array([0.0, 4, 0]), unstashed=np.zeros(3),
                   model_output=3.0, stash=np.array([[6.0, 12], [0, 6]]), full_backward=np.array([[5.0, 10], [0, 5]]),
                   own=np.array([[4.0, 8], [0, 4]]), held=tri.copy(), saves=np.array([[4.0, 8], [0, 4]]),
                   saved=np.array([[0.0, 0], [0, 0], [4, 4]]), added=np.array([[0.0, 0], [0, 0], [2, 2]]))


def test_the_stage_bound_and_its_recompute_by_hand():
    """``_two_layers`` on 2 stages, 2 micro-batches, no ZeRO. 1F1B: stage 0 (layer 0, two in flight)
    holds 10 + 2 x 4 (the gradient it is sent back) = 18 always, one other micro-batch's stash less
    the 4 recompute saves (2), and its full backward 5 + 4 (the output it sent on) less its own 4 plus
    the 1 held again: 26; stage 1 (one in flight) 10 + 2 x 4 (its input) = 18 and 5 + 3 + 4 (the
    model's output and the gradient sent back) - 4 + 1: 27. Under 27 bytes each must save 3 bytes
    (stage 0: (18 + 9 + 6 - 27) / 2; stage 1: 18 + 12 - 27), 1.5 s: with layer works 1 and 2 the slowest
    stage is 3.5 s and the stages recompute 3 s together. GPipe (both hold the other micro-batch):
    stage 0 18 + 2 + (5 - 4 + 1) = 22, stage 1 18 + (9 - 4) + (5 + 3 - 4 + 1) = 28."""
    from stagesplit.plan.pipeline_floor import pipeline_floors
    rf = _two_layers()
    kw = dict(stages=2, micro_batches=2, dp=1, zero=0, capacity=27.0, layer_work=np.array([1.0, 2.0]))
    fullest, slowest, recompute = pipeline_floors(rf, schedule="1f1b", **kw)
    assert (fullest, slowest, recompute) == pytest.approx((27.0, 3.5, 3.0))
    assert pipeline_floors(rf, schedule="gpipe", **kw)[0] == pytest.approx(28.0)
    # under 26 bytes stage 1 cannot fit whatever it recomputes: no split steps at all
    assert pipeline_floors(rf, schedule="1f1b", **(kw | {"capacity": 26.0}))[1:] == (np.inf, np.inf)
    # ZeRO 3 over 2 ranks halves the parameters: 5 bytes less on each stage, and less to recompute
    fullest, slowest, recompute = pipeline_floors(rf, schedule="1f1b", **(kw | {"dp": 2, "zero": 3}))
    assert fullest == pytest.approx(22.0) and recompute < 3.0
    # one stage: 20 always, no receive buffers nor anything held for other stages; its full backward 10
    # less its own 8 plus the 1 held again
    one = pipeline_floors(rf, schedule="1f1b", **(kw | {"stages": 1}))
    assert one[0] == pytest.approx(20 + 10 - 8 + 1)


def test_the_ranks_busy_time_and_the_recompute_their_whole_memory_forces_by_hand():
    """``_two_layers`` under 1F1B as above. At its first backward rank 0 holds m = 18 + 6 (the other
    micro-batch's stash) + 9 (its full backward, the output sent on included) = 33 with nothing
    recomputed, less 2 S for the S bytes its recompute saves per micro-batch (both micro-batches'); rank
    1 holds 18 + 12 = 30, less S. Under 27 bytes: 2 S0 >= 6 and S1 >= 3. Full recompute saves at 0.5 s
    a byte, the only knot: at t = 0.5 the Lagrange bound is (1 + 0.5 / 2 x 33) + (2 + 0.5 x 30) - 0.5 x 27
    x (1 / 2 + 1) = 6 s per micro-batch, the layers' 3 s and 3 s of recompute, what saving 3 bytes on
    each stage costs: 12 s over 2 micro-batches. Under 33 bytes nothing is forced: the work alone, 6 s."""
    from stagesplit.plan.pipeline_floor import busy_floor
    rf = _two_layers()
    kw = dict(stages=2, micro_batches=2, dp=1, zero=0, layer_work=np.array([1.0, 2.0]))
    assert busy_floor(rf, schedule="1f1b", capacity=27.0, **kw) == pytest.approx(12.0)
    assert busy_floor(rf, schedule="1f1b", capacity=33.0, **kw) == pytest.approx(6.0)


def _every_choice(L: int, options: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """None, selective and full everywhere (where a layer has the option), and random mixes."""
    allowed = [np.flatnonzero(options[:, i]) for i in range(L)]
    out = [np.zeros(L, np.int64)]
    for o in (1, 2):
        out.append(np.array([o if options[o, i] else 0 for i in range(L)], np.int64))
    out += [np.array([rng.choice(a) for a in allowed], np.int64) for _ in range(3)]
    return out


def test_the_micro_batches_in_flight_at_each_first_backward_by_hand():
    """1F1B: ``min(M, pp - r)``; GPipe: every micro-batch; interleaved 1F1B over 2 ranks of 2 chunks and 4
    micro-batches, as torch orders it (rank 0: F0 F1 of chunk 0, F0 F1 of chunk 2, F2 of chunk 0, then
    B0 of chunk 2; rank 1: F0 F1 of chunk 1, F0 of chunk 3, B0 of chunk 3, ...): a chunk's micro-batches
    before its first backward, and every chunk's on its rank at the rank's first backward."""
    from stagesplit.plan.pipeline_floor import first_backward_in_flight
    from stagesplit.solver.schedule_generation import build_schedule
    assert first_backward_in_flight(build_schedule("1f1b", 3, 4)).tolist() == [3, 2, 1]
    assert first_backward_in_flight(build_schedule("1f1b", 2, 5)).tolist() == [2, 1]
    assert first_backward_in_flight(build_schedule("gpipe", 3, 4)).tolist() == [4, 4, 4]
    interleaved = build_schedule("interleaved-1f1b", 2, 4, 2)
    counts = first_backward_in_flight(interleaved)
    for chunk in range(4):           # read off the actions themselves
        rank = interleaved.leaves[interleaved.chunk_rank[chunk]]
        first = next(i for i, a in enumerate(rank) if a.chunk == chunk and a.op.name != "FORWARD")
        assert counts[chunk] == sum(1 for a in rank[:first] if a.chunk == chunk and a.op.name == "FORWARD")
    assert counts.tolist() == [4, 3, 2, 1]
    # at each rank's first backward: rank 0 holds micro-batches 0-2 of chunk 0 and 0-1 of chunk 2 (running
    # 0's backward), rank 1 micro-batches 0-1 of chunk 1 and 0 of chunk 3 (running its backward)
    from stagesplit.plan.pipeline_floor import rank_first_backward
    held, running = rank_first_backward(interleaved)
    assert held.tolist() == [3, 2, 2, 1] and running.tolist() == [False, False, True, True]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved-1f1b"])
@pytest.mark.parametrize("which", ["llama", "stack"])
def test_the_floors_are_below_every_split_and_recompute_choice(which, schedule):
    """Every split into 1 to 3 stages (interleaved 1F1B: 2 ranks of 2 chunks), with no recompute, each
    option everywhere and random mixes, on
    the rank sharded by each ZeRO stage over 2 ranks and simulated by the engine's accounting
    (``evaluate_chunk_choice``): no rank holds less than the bytes floor; under a capacity some splits
    exceed without recompute, where every rank fits no stage's work per micro-batch (its layers' and
    its recompute) is under the seconds floor and the stages' recompute together is under the third
    floor. The floors are not vacuous: the bytes floor passes the plain always-live mean, and on the
    Llama the slowest stage's floor passes the best balance of the layers' work somewhere, by recompute."""
    from stagesplit.io.targets import load_target
    from stagesplit.model.datasharding import DataLayout
    from stagesplit.plan.engine import resolve
    from stagesplit.plan.pipeline_floor import RangeFloors, busy_floor, pipeline_floors
    from stagesplit.plan.scheduled import schedule_problem
    from stagesplit.solver.chunk_evaluation import evaluate_chunk_choice
    from stagesplit.solver.chunk_problem import step_durations
    from stagesplit.solver.request import SolveRequest
    looped = schedule == "interleaved-1f1b"
    profile = (_llama(5) if looped else _llama()) if which == "llama" else _stack()
    target = load_target("h100-80gb")
    rf = RangeFloors.of(api.analyze(profile), target)
    assert rf is not None
    L = rf.num_layers
    rng = np.random.default_rng(0)
    forced = bytes_above_mean = busy_forced = 0
    for zero in (0, 1, 2, 3):
        analysis = api.analyze(profile, layout=DataLayout(2, zero))
        for pp in ((2,) if looped else (1, 2, 3)):
            V = 2 if looped else 1
            M = 2 * pp if looped else pp + 1
            request = SolveRequest(devices=pp, targets=("h100-80gb",), schedule=schedule, micro_batches=M,
                                   exact=True, dp=2, zero=zero, runtime_reserve="off",
                                   **({"chunks_per_rank": V} if looped else {}))
            resolved = resolve(request, analysis)
            table = resolved.model.phase_table
            problem = schedule_problem(resolved.model, resolved.inputs, table)
            layer_work = table.layer_times[:, :3].sum(axis=1)
            options = table.recompute.saved > 0
            options[0] = True
            chunks = pp * V
            splits = [(0, *inner, L) for inner in itertools.combinations(range(1, L), chunks - 1)]
            choices = _every_choice(L, options, rng)
            results = {(b, i): evaluate_chunk_choice(problem, b, c) for b in splits for i, c in enumerate(choices)}
            # a capacity half the splits pass without recompute, and the least any split needs with full
            # recompute everywhere (where some split fits, most only by recomputing)
            plain = [max(results[b, 0].rank_peaks) for b in splits]
            least = min(max(results[b, 2].rank_peaks) for b in splits)
            for capacity in (float(np.median(plain)), float(least)):
                fullest, slowest, recompute = pipeline_floors(rf, schedule=schedule, stages=pp, micro_batches=M,
                                                              dp=2, zero=zero, capacity=capacity,
                                                              layer_work=layer_work, chunks_per_rank=V)
                busy = busy_floor(rf, schedule=schedule, stages=pp, micro_batches=M, dp=2, zero=zero,
                                  capacity=capacity, layer_work=layer_work, chunks_per_rank=V)
                busy_forced += busy > M * float(layer_work.sum()) * (1 + 1e-9)
                mean = sum(float(a.sum()) for a in rf.roles.values()) / chunks
                bytes_above_mean += fullest > mean
                balanced = min(max(layer_work[b[i]:b[i + 1]].sum() for i in range(chunks)) for b in splits)
                forced += slowest > balanced * (1 + 1e-9) and recompute > 0
                for (bounds, i), result in results.items():
                    where = (zero, pp, bounds, choices[i].tolist(), capacity)
                    assert max(result.rank_peaks) >= fullest, where
                    if max(result.rank_peaks) > capacity:
                        continue
                    f, b, w, _, _ = step_durations(problem, bounds, choices[i])
                    assert max(f + b + w) >= slowest, where
                    added = table.recompute.added[choices[i], np.arange(L)]
                    assert float(added.sum()) >= recompute, where
                    assert M * float((f + b + w).sum()) >= busy, where      # every rank's M micro-batches
    assert bytes_above_mean
    # (a stack of Linear layers owns no stash of its own: nothing to recompute, none forced; a chunk of two
    # on a rank is bounded alone, its rank's other chunk left out, which forces nothing on this Llama)
    assert forced if which == "llama" and not looped else not forced
    # the ranks' whole memory forces recompute on the Llama, its rank's two chunks together included
    assert busy_forced if which == "llama" else not busy_forced


def _small_device(profile, tmp_path):
    """A slow device of 4 per node with half the memory ``profile``'s whole step holds on one."""
    peak = api.solve(profile, devices=1, target="h100-80gb", schedule="1f1b", micro_batches=1).stages[0].worst_tile_bytes
    device = tmp_path / "small.yaml"
    device.write_text(f"kind: gpu\ntiles: 1\nbytes_per_tile: {peak // 2}\nflops_per_s: 1e9\n"
                      "link_bytes_per_s: 1e11\nmemory_bytes_per_s: 3e10\nnode: {gpus_per_node: 4, "
                      "intra_bytes_per_s: 1e11, intra_latency_s: 0.000003, inter_bytes_per_s: 1e10, "
                      "inter_latency_s: 0.000005}\n")
    return device


def test_the_time_kept_at_the_end_settles_by_the_floors_alone(monkeypatch, tmp_path):
    """The end of the time limit is kept for the pipeline floors of the combinations no solve reached
    (``TAIL_SHARE``). Kept whole, no combination is solved: each row is settled by a floor or left
    unsearched, and each refused for memory, solved alone, does not fit."""
    import stagesplit.plan.layouts as layouts
    profile = _llama(4)
    device = _small_device(profile, tmp_path)
    monkeypatch.setattr(layouts, "TAIL_SHARE", 1.0)
    monkeypatch.setattr(layouts, "TAIL_PER_ITEM_S", 1e9)
    kw = dict(target=str(device), gpus=4, global_batch=16, captured_batch=2, runtime_reserve="off")
    lp = api.layouts(profile, time_limit=60, **kw)
    assert lp.best is None and {r.status for r in lp.rows} <= {"memory", "cut off", "refused", "unknown"}
    floors = [r for r in lp.rows if r.status == "memory" and "with the most recompute" in r.reason]
    assert {r.layout.schedule for r in floors} == {"1f1b", "interleaved-1f1b"}
    assert any(r.status == "unknown" for r in lp.rows)
    monkeypatch.undo()
    for r in floors[:2] + [r for r in floors if r.layout.schedule != "1f1b"][:2]:
        alone = api.layouts(profile, time_limit=60, tp=r.layout.tp, pp=r.layout.pp, dp=r.layout.dp,
                            zero=r.layout.zero, micro_batch_size=r.layout.micro_batch_size, **_alone(r.layout), **kw)
        assert [a.status for a in alone.rows] == ["memory"] or "fits" in alone.rows[0].reason, alone.rows


def _alone(lay) -> dict:
    """The search options that make ``lay`` its only combination: its schedule, and its chunks per
    device under a looped one."""
    return {"schedule": lay.schedule, **({"chunks_per_rank": lay.chunks_per_rank} if lay.chunks_per_rank > 1 else {})}


def test_the_search_with_the_pipeline_floors_finds_what_it_finds_without(monkeypatch, tmp_path):
    """A small Llama on 4 GPUs of a slow device with half the memory its whole step holds on one (batch
    16, every micro-batch size: most layouts recompute or do not fit): the pipeline floors settle combinations (no split fits, or none
    steps under the best found with the recompute its memory forces); without them (each solved) the
    best is the same, each combination they refused as not fitting does not fit, and each they cut off
    is slower than the best. A memory row's figure is the floor's."""
    from fractions import Fraction

    import stagesplit.plan.layouts as layouts
    from stagesplit.io.targets import load_target
    from stagesplit.model.batchscale import scale_batch
    from stagesplit.plan.pipeline_floor import RangeFloors, pipeline_floors
    profile = _llama(4)
    whole = api.analyze(profile)
    device = _small_device(profile, tmp_path)
    kw = dict(target=str(device), gpus=4, global_batch=16, captured_batch=2, time_limit=120, runtime_reserve="off")
    bounded = api.layouts(profile, **kw)
    settled = {r.layout: r for r in bounded.rows if "with the most recompute" in r.reason
               or "with the recompute its memory forces" in r.reason}
    assert settled and bounded.proven
    memory = [r for r in settled.values() if r.status == "memory"]
    # (under the default schedules: an interleaved combination's chunks bounded too, each checked below)
    assert memory and {r.layout.schedule for r in memory} == {"1f1b", "interleaved-1f1b"}
    memory.sort(key=lambda r: r.layout.schedule != "interleaved-1f1b")
    target = load_target(str(device))
    for r in memory[:3]:
        lay = r.layout
        ratio = Fraction(lay.micro_batch_size, 2)
        analysis = whole if ratio == 1 else api.analyze(scale_batch(profile, ratio))
        rf = RangeFloors.of(analysis, target)
        need = pipeline_floors(rf, schedule=lay.schedule, stages=lay.pp, micro_batches=lay.micro_batches,
                               dp=lay.sync, zero=lay.zero, capacity=target.device_bytes, layer_work=None,
                               chunks_per_rank=max(lay.chunks_per_rank, 1))[0]
        assert need > target.device_bytes and re.match(rf"memory floor: {need / 2**30:.1f} GiB ", r.reason), r.reason
    monkeypatch.setattr(layouts, "pipeline_floors", lambda *a, **k: (0.0, 0.0, 0.0))
    unbounded = api.layouts(profile, **kw)
    assert not [r for r in unbounded.rows if "with the most recompute" in r.reason
                or "with the recompute its memory forces" in r.reason]
    assert unbounded.best.layout == bounded.best.layout
    assert unbounded.best.step_s == pytest.approx(bounded.best.step_s)
    again = {r.layout: r for r in unbounded.rows}
    cut = 0
    for lay, r in settled.items():
        said = re.fullmatch(r"step floor (\S+) (m?s) with the recompute its memory forces >= (\S+) (m?s), the best step "
                            r"found before it", r.reason)
        if r.status != "cut off":
            continue
        assert said, r.reason
        floor, best = (float(said.group(i)) * (1e-3 if said.group(i + 1) == "ms" else 1.0) for i in (1, 3))
        assert floor >= best * (1 - 5e-3) and best >= bounded.best.step_s * (1 - 5e-3), r.reason
        if cut < 3:                     # solved alone without the floors: no step under the floor it names
            cut += 1
            rows = api.layouts(profile, **kw, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero=lay.zero,
                               micro_batch_size=lay.micro_batch_size, **_alone(lay)).rows
            assert len(rows) == 1, rows
            alone = rows[0]
            assert alone.status in ("memory", "refused") or alone.step_s >= floor * (1 - 5e-3), (r.reason, alone)
    assert cut
    for lay, r in settled.items():
        other = again[lay]
        if r.status == "memory":        # solved alone (no best to cut it off), every split's memory is checked
            alone = api.layouts(profile, **kw, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero=lay.zero,
                                micro_batch_size=lay.micro_batch_size, **_alone(lay)).rows
            assert len(alone) == 1 and alone[0].status in ("memory", "refused") and alone[0].proven, (lay, alone)
            assert alone[0].status == "memory" or "fits" in alone[0].reason, alone[0].reason
        else:
            assert other.status in ("slower", "cut off", "memory", "refused"), (lay, other)
            assert other.step_s is None or other.step_s >= bounded.best.step_s * (1 - 1e-9), (lay, other)
