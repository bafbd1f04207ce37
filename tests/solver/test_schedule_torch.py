"""stagesplit.solver's schedules (schedule_generation, schedule_memory) against torch.distributed.pipelining
itself (torch 2.13).

Three levels:
* torch's schedule classes are built for every P <= 8, M <= 32, v <= 4: they accept exactly the
  configurations ``is_valid`` accepts, and their ``pipeline_order`` (and the lowered order the
  runtime walks, ``pipeline_order_with_comms``) holds the actions ``build_schedule`` generates;
* torch's own runtime (``_step_microbatches``) runs on recording stand-in stages, in one
  process, and the calls it makes are the leaf actions, rank by rank;
* a real pipeline (tests/pipeline_harness.py: gloo, one process per rank) runs every schedule
  for P = 2 and 4 and executes the same order, with the unpipelined model's loss and gradients.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest

from stagesplit.solver.schedule_generation import Op, build_schedule
from stagesplit.solver.schedule_kinds import ScheduleKind, is_valid, traits
from stagesplit.solver.schedule_memory import ChunkMemory, rank_memory

torch = pytest.importorskip("torch")
schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping  # noqa: E402

KINDS = [k.value for k in ScheduleKind]


class RecordingStage:
    """A stand-in for torch's PipelineStage with no process group and no tensors: torch's
    schedule code runs unchanged on it, and it records the compute calls the runtime makes (in
    torch's notation: ``3F1``, ``3I1`` input-gradient backward, ``3W1``, ``3B1`` full backward);
    every communication is an empty list of operations."""

    def __init__(self, index: int, num_stages: int, devices: int, rank: int, log: list[str]):
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, num_stages, devices, rank
        self.submod = torch.nn.Identity()
        self.stage_index_to_group_rank: dict[int, int] = {}
        self.device = "cpu"
        self.has_backward = True
        self.log = log
        self.output_chunks: list = []
        self.args_recv_info = {0: ()}
        self.act_send_info: dict = {}

    is_first = property(lambda self: self.stage_index == 0)
    is_last = property(lambda self: self.stage_index == self.num_stages - 1)

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
        self.log.append(f"{self.stage_index}{'B' if full_backward else 'I'}{mb}")

    def backward_weight_one_chunk(self, mb, last_backward=False):
        self.log.append(f"{self.stage_index}W{mb}")

    def _none(self, *args, **kwargs):
        return None

    def _no_ops(self, *args, **kwargs):
        return []

    _prepare_forward_infra = _prepare_backward_infra = clear_runtime_states = _none
    set_local_fwd_input = set_local_bwd_input = get_local_bwd_output = perform_reduce_grad = _none
    _get_init_p2p_neighbors_ops = get_fwd_recv_ops = get_bwd_recv_ops = _no_ops
    get_fwd_send_ops = get_bwd_send_ops = _no_ops


@pytest.fixture(autouse=True, scope="module")
def _quiet_torch_pipelining():
    """torch logs every schedule it builds at INFO; keep the test output readable."""
    logger = logging.getLogger("torch.distributed.pipelining")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def _torch_stage_indices(kind: str, P: int, v: int, rank: int) -> list[int]:
    """The stages torch places on ``rank`` (its own mapping, not stagesplit's)."""
    style = "v" if kind in ("zbv", "dualpipev") else "loop"
    return generate_rank_to_stage_mapping(P, P * v, style=style)[rank]


def _torch_schedule(kind: str, P: int, M: int, v: int, rank: int, log: list[str]):
    """torch's schedule class for ``rank``, on recording stages (raises what torch raises)."""
    cls = getattr(schedules, traits(kind).torch_class)
    if not traits(kind).multi_stage:
        if v != 1:
            raise ValueError("a single-stage schedule takes one stage")
        return cls(RecordingStage(rank, P, P, rank, log), M)
    return cls([RecordingStage(i, P * v, P, rank, log) for i in _torch_stage_indices(kind, P, v, rank)], M)


def _compute_actions(order: list) -> list[str]:
    return [repr(a) for a in order if a is not None and a.is_compute_op]


def _check_against_torch(kind: str, P: int, M: int, v: int, run_runtime: bool) -> None:
    valid = is_valid(kind, P, M, v)
    try:
        probe = _torch_schedule(kind, P, M, v, 0, [])
    except ValueError:
        assert not valid, f"torch refuses {kind} P={P} M={M} v={v}; stagesplit accepts it"
        return
    assert valid, f"torch accepts {kind} P={P} M={M} v={v}; stagesplit refuses it"
    ours = build_schedule(kind, P, M, v)
    if traits(kind).multi_stage:
        assert ours.chunk_rank == tuple(probe.stage_index_to_group_rank[c] for c in range(P * v))
    for r in range(P):
        mine = [a.torch_repr() for a in ours.actions[r]]
        leaves = [a.torch_repr() for a in ours.leaves[r]]
        if traits(kind).multi_stage:
            # torch's IR, and the lowered IR (with communication) its runtime walks
            assert _compute_actions(probe.pipeline_order[r]) == mine, (kind, P, M, v, r)
            assert _compute_actions(probe.pipeline_order_with_comms[r]) == mine, (kind, P, M, v, r)
        elif kind == "gpipe" or r < P - 1:
            # Schedule1F1B's pipeline_order is wrong for its last rank in torch 2.13 (it lists
            # forwards 1..M where the runtime runs 0..M-1); the runtime check below is the truth
            assert _compute_actions(probe.pipeline_order[r]) == mine, (kind, P, M, v, r)
        if run_runtime or not traits(kind).multi_stage:
            log: list[str] = []
            _torch_schedule(kind, P, M, v, r, log)._step_microbatches()
            assert log == leaves, (kind, P, M, v, r)


# M < P, M = P, M not a multiple of P, M >= 2P: every branch of every generator
QUICK = [(kind, P, M, v) for kind in KINDS for P in (1, 2, 3, 4) for v in (1, 2, 3, 4)
         for M in (1, 2, 3, 4, 5, 6, 8, 9)]


@pytest.mark.parametrize("kind", KINDS)
def test_action_lists_equal_torch_on_a_grid(kind):
    for k, P, M, v in QUICK:
        if k == kind:
            _check_against_torch(kind, P, M, v, run_runtime=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_action_lists_equal_torch_for_every_p_to_8_m_to_32_v_to_4(kind):
    # about 25 s for the ~3,300 configurations torch accepts (and the ~2,900 it refuses)
    for P in range(1, 9):
        for v in range(1, 5):
            for M in range(1, 33):
                _check_against_torch(kind, P, M, v, run_runtime=False)


def test_torch_1f1b_pipeline_order_is_the_one_that_is_off():
    """Why the 1F1B comparison above skips torch's IR for the last rank: torch's own IR names
    micro-batch M, which does not exist; its runtime runs 0..M-1, as build_schedule says."""
    probe = _torch_schedule("1f1b", 4, 6, 1, 3, [])
    assert _compute_actions(probe.pipeline_order[3])[:2] == ["3F1", "3B0"]
    assert "3F6" in _compute_actions(probe.pipeline_order[3])
    log: list[str] = []
    _torch_schedule("1f1b", 4, 6, 1, 3, log)._step_microbatches()
    assert log[:4] == ["3F0", "3B0", "3F1", "3B1"]
    assert log == [a.torch_repr() for a in build_schedule("1f1b", 4, 6).leaves[3]]


# --- a real pipeline ----------------------------------------------------------------------------

def _cases(P: int):
    import pipeline_harness as h
    M = 2 * P                      # DualPipeV needs M >= 2P; 1F1B M >= P
    cases = []
    for kind in KINDS:
        v = traits(kind).fixed_chunks_per_rank or 2
        C = v * P
        widths = [32 + 16 * (c % 3) for c in range(C + 1)]          # uneven chunks
        # gradients kept between steps (zero_grad(set_to_none=False)) and no merged outputs:
        # the resident bytes are then the same all through the step, as ChunkMemory has them
        cases.append(h.PipelineCase(
            kind, M, v, build=functools.partial(h.mlp_chunks, C, widths=widths),
            make_batch=functools.partial(h.regression_batch, 32 * M, widths[0], widths[-1]), optimizer="adam",
            grads_set_to_none=False, return_outputs=False))
    return cases


def _first_micro_batch_figures(schedule, rank: int, result) -> ChunkMemory:
    """Per-chunk figures read off the measured trace of each chunk's first F, B/BW and W only
    (before, peak, after of each): resident = live bytes before the rank's first action."""
    C = schedule.chunks
    f = {name: np.zeros(C, np.int64) for name in ("resident", "stash", "weight_stash", "forward_peak",
                                                  "backward_peak", "weight_peak", "optimizer_peak",
                                                  "full_backward_peak", "retained")}
    first: dict[tuple[Op, int], int] = {}
    for i, a in enumerate(schedule.leaves[rank]):
        first.setdefault((a.op, a.chunk), i)
    local = schedule.rank_chunks(rank)
    f["resident"][local[0]] = result.trace[0][0]
    before, peak, _ = result.optimizer_trace
    f["optimizer_peak"][local[0]] = peak - before
    for c in local:
        b, p, a = result.trace[first[Op.FORWARD, c]]
        stash = f["stash"][c] = a - b
        f["forward_peak"][c] = p - b
        if (Op.FULL_BACKWARD, c) in first:
            b, p, a = result.trace[first[Op.FULL_BACKWARD, c]]
            f["full_backward_peak"][c] = p - (b - stash)
            f["retained"][c] = a - (b - stash)
        if (Op.BACKWARD_INPUT, c) in first:
            bi, pi, ai = result.trace[first[Op.BACKWARD_INPUT, c]]
            bw, pw, aw = result.trace[first[Op.BACKWARD_WEIGHT, c]]
            weight_stash = f["weight_stash"][c] = bw - aw
            f["backward_peak"][c] = pi - (bi - stash)
            f["weight_peak"][c] = pw - (bw - weight_stash)
            f["retained"][c] = ai - (bi - stash) - weight_stash
    return ChunkMemory(**f)


@pytest.mark.slow
@pytest.mark.parametrize("P", [2, 4])
def test_real_pipeline_runs_our_order_trains_like_the_whole_model_and_has_our_memory(P):
    # every schedule torch ships runs on CPU with gloo (torch 2.13), zero-bubble and DualPipeV
    # included: one group of P processes runs the seven cases (about 20 s for P = 2, 30 s for 4)
    import pipeline_harness as h
    cases = _cases(P)
    results = h.run_pipelines(cases, P)
    table = []
    for case, per_rank in zip(cases, results):
        ours = build_schedule(case.kind, P, case.micro_batches, case.chunks_per_rank)
        for r, result in enumerate(per_rank):
            assert result.stages == ours.rank_chunks(r)
            assert list(result.executed) == [a.torch_repr() for a in ours.leaves[r]], (case.kind, r)
        loss, grads = h.reference(case)
        losses = [x for result in per_rank for x in result.losses]
        assert len(losses) == case.micro_batches
        assert np.mean(losses) == pytest.approx(loss, rel=1e-12)
        got = {k: g for result in per_rank for k, g in result.grads.items()}
        assert got.keys() == grads.keys()
        for name in grads:
            np.testing.assert_allclose(got[name], grads[name], rtol=1e-9, atol=1e-14, err_msg=f"{case.kind} {name}")
        # memory: figures from each chunk's first micro-batch predict every other action
        for r, result in enumerate(per_rank):
            predicted = rank_memory(ours, _first_micro_batch_figures(ours, r, result))[r]
            during, after = result.trace[:, 1], result.trace[:, 2]
            table.append((case.kind, r, int(result.peak_bytes), predicted.peak))
            if traits(case.kind).keeps_sent:
                # exact, action by action (the last action's "after" is taken once the step
                # has freed what it kept, so it is left out)
                assert predicted.during.tolist() == during.tolist(), (case.kind, r)
                assert predicted.after[:-1].tolist() == after[:-1].tolist(), (case.kind, r)
            else:
                # Schedule1F1B frees some sent tensors at its next send, not at once: the
                # rule is a lower bound there, up to one micro-batch's sends per action
                assert np.all(predicted.during <= during), (case.kind, r)
            # the step's peak is at an action, where the prediction is exact
            # (the optimizer step of the zero-bubble runtimes starts with some of the step's
            # tensors still held, which ChunkMemory has no figure for)
            step_peak = int(during.max())
            if traits(case.kind).keeps_sent and result.peak_bytes == step_peak:
                assert predicted.peak == result.peak_bytes
    print(f"\nper-rank peak bytes, P = {P}: measured (MemTracker) vs predicted from the first micro-batch")
    for kind, r, measured, predicted in table:
        print(f"  {kind:17s} rank {r}: {measured:9d} {predicted:9d} {100 * (predicted - measured) / measured:+6.2f}%")
