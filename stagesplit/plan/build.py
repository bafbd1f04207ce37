"""From a solved split to a ``Plan``: every stage's layers, memory (per-tile detail recomputed
from the cost model), compute and transfers, the objective phases in the user's units, and
what the plan was solved from."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..common.deadline import Deadline
from ..common.fileio import file_sha256
from ..common.versions import VERSION, versions
from ..model.costmodel import StageCostModel
from ..model.stagememory import MemoryBreakdown
from ..model.traffic import Traffic, wide_tensors
from ..solver.cpsat import PHASE_NAMES, SolverResult
from ..solver.problem import Split, SplitProblem, evaluate_split, schedule_note, stage_in_flight
from .records import (
    PhaseRecord,
    Plan,
    PlanInputs,
    PlanProfile,
    PlanRun,
    PlanVariant,
    RankRecord,
    ScheduleRecord,
    StagePlan,
)

if TYPE_CHECKING:
    from ..solver.chunk_cpsat import ChunkSolve
    from ..solver.chunk_problem import ChunkProblem
    from ..solver.schedule_generation import Action

__all__ = ["REPLAY_SECONDS_PER_EVENT", "make_plan", "make_schedule_plan", "plan_profile", "refused_plan",
           "replay_events_estimate", "with_reserved"]


def plan_profile(model: StageCostModel) -> PlanProfile:
    """The plan's record of the profile: name, device, and the file and hash it was read from."""
    p = model.profile
    sha = p.info.sha256                                  # hashed from the bytes as they were read
    layout = p.info.parallel_layout
    precision = p.info.precision
    if sha is None and p.info.path is not None:
        sha = file_sha256(p.info.path)
    return PlanProfile(name=p.info.name, source=p.info.source, synthetic=p.info.synthetic, target=p.target.name,
                       tiles=p.target.tiles, bytes_per_tile=p.target.bytes_per_tile,
                       path=None if p.info.path is None else str(p.info.path), sha256=sha,
                       tensor_parallel=layout.tensor_parallel if layout is not None else 1,
                       sequence_parallel=layout.sequence_parallel if layout is not None else False,
                       tensor_parallel_styles=tuple(layout.styles) if layout is not None else (),
                       sequence_parallel_additions=tuple(layout.additions) if layout is not None else (),
                       context_parallel=layout.context_parallel if layout is not None else 1,
                       expert_parallel=layout.expert_parallel if layout is not None else 1,
                       parameter_dtype=precision.parameters if precision is not None else "",
                       autocast_dtype=precision.autocast if precision is not None else "",
                       master_weights=precision.master_weights if precision is not None else False)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def make_plan(model: StageCostModel, problem: SplitProblem, split: Split | None, inputs: PlanInputs, *,
              method: str, traffic: Traffic, result: SolverResult | None = None, message: str = "",
              profile: PlanProfile | None = None, variant_models: Sequence[StageCostModel] = (),
              variants: tuple[PlanVariant, ...] = (), notes: Sequence[str] = ()) -> Plan:
    """Describe ``split`` stage by stage (per-tile detail recomputed from the cost model; with
    profile variants, from the cost model of the variant each stage takes, ``variant_models``
    in the order of ``problem.variants``, recorded as ``variants``; ``model`` is the first's).
    The plan is made complete: ``notes`` are added after the solver's, and it keeps ``model``."""
    p = model.profile
    o = problem.options
    evaluation = evaluate_split(problem, split) if split is not None else None
    chosen = evaluation.variants if evaluation is not None and problem.variants else ()
    stages: list[StagePlan] = []
    if split is not None:
        ks = stage_in_flight(problem, split)
        seconds = problem.seconds_per_unit
        unit_s = p.target.seconds_per_unit(p.compute_unit)
        for index, ((position, first, last), k) in enumerate(zip(split.stages, ks)):
            variant = problem.variants[chosen[index] if chosen else 0] if problem.variants else None
            stage_model = variant_models[chosen[index] if chosen else 0] if variant_models else model
            sm = stage_model.stage_memory(first, last)
            total = sm.total(k)
            tile = int(total.argmax())
            received, sent = traffic.stage_io(first, last)
            compute = stage_model.range_compute(first, last)
            stage_time = float(compute)
            cut_bytes = float(traffic.cut_bytes[first] + traffic.cut_bytes[last + 1])
            if o.communication and o.link_bytes_per_s and unit_s:
                stage_time += cut_bytes / o.link_bytes_per_s / unit_s
            time_s = None
            if seconds is not None:
                time_s = compute * seconds
                if stage_model.layer_time_s is not None:     # roofline seconds (model/roofline.py)
                    time_s = float(sum(stage_model.layer_time_s[first:last + 1]))
                if o.communication and o.link_bytes_per_s:
                    time_s += cut_bytes / o.link_bytes_per_s
            stages.append(StagePlan(
                stage=index, device=position, first_layer=first, last_layer=last,
                layers=model.layers.names[first:last + 1], in_flight=k,
                capacity_bytes=int(problem.capacity[position]), worst_tile=tile, worst_tile_bytes=int(total[tile]),
                memory_at_worst_tile=sm.at_tile(tile, k), memory_total=sm.summed(k), compute=float(compute),
                time_s=time_s, bytes_received=int(received), bytes_sent=int(sent), time=stage_time,
                memory_proportion=variant.proportion if variant is not None else None,
                variant=variant.name if variant is not None else None))
    feasible = bool(evaluation is not None and evaluation.feasible)
    units = {"time": problem.time_unit, "memory": "bytes" if problem.homogeneous else "fraction of capacity",
             "devices": "devices"}
    # the split's own figures (unrounded) as values; the solver's integer bound converted back
    actual = {"time": max((s.stage_time for s in stages), default=None),
              "memory": max((s.worst_tile_bytes if problem.homogeneous else s.worst_tile_bytes / s.capacity_bytes
                             for s in stages), default=None),
              "devices": len(stages) if stages else None}
    phases = []
    for ph in (result.phases if result else []):
        value = actual[ph.quantity] if ph.value is not None and stages else problem.user_value(ph.quantity, ph.value)
        bound = value if ph.bound is not None and ph.bound == ph.value else problem.user_value(ph.quantity, ph.bound)
        if isinstance(bound, float):
            bound = float(f"{bound:.9g}")
        phases.append(PhaseRecord(PHASE_NAMES[ph.quantity], ph.status, value, bound, ph.gap, round(ph.seconds, 3),
                                  unit=units[ph.quantity], scale=problem.objective_scale(ph.quantity),
                                  solver_value=ph.value, solver_bound=ph.bound, proof=ph.proof))
    status = result.status if result is not None else ("feasible" if feasible else "infeasible")
    run = PlanRun(stagesplit=VERSION, created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                  solver_seconds=round(result.seconds, 3) if result else 0.0,
                  phase_seconds=tuple(ph.seconds for ph in phases), versions=versions(),
                  dp_seconds=_rounded(result.dp_seconds if result else None),
                  cpsat_seconds=_rounded(result.cpsat_seconds if result else None))
    return Plan(profile=profile or plan_profile(model), inputs=inputs, layer_names=list(model.layers.names),
                devices=o.devices, method=method, status=status, feasible=feasible, message=message, stages=stages,
                phases=phases, compute_unit=p.compute_unit, module_paths=list(model.layers.module_paths),
                notes=[n for n in (schedule_note(o),) if n] + (list(result.notes) if result is not None else [])
                + list(notes), run=run, tied=model.tied, variants=tuple(variants), analysis=model,
                wide_tensors=wide_tensors(model, traffic))


def make_schedule_plan(model: StageCostModel, problem: ChunkProblem, solve: ChunkSolve, inputs: PlanInputs, *, traffic: Traffic,
                       message: str = "", profile: PlanProfile | None = None) -> Plan:
    """A plan for a chunk split under a pipeline schedule (``solver/chunk_problem.py``): one stage per
    chunk on its device, each device's memory from the schedule's actions, and the step time."""
    # the schedule's modules, here: a per-layer solve does not need them
    from ..solver.chunk_problem import step_durations
    from ..solver.schedule_memory import chunks_in_flight
    schedule = problem.schedule
    result = solve.result
    o = inputs.options
    # a second solve kept the caching allocator's excess back from the solver's capacities
    # (plan/engine.py's _refit); the plan records each device's own capacity, which the replay checks
    retry = inputs.runtime_reserve.retry_bytes if inputs.runtime_reserve is not None else ()

    def capacity(rank: int) -> int:
        return int(problem.capacities[rank]) + (retry[rank] if rank < len(retry) else 0)
    stages: list[StagePlan] = []
    record = None
    if result is not None:
        bounds = result.bounds
        cc = problem.table.chunks(bounds, split_backward=False)        # (its times alone)
        unit_s = model.profile.target.seconds_per_unit(model.profile.compute_unit)
        seconds = problem.table.time_unit == "seconds"
        rc = problem.table.recompute
        choice = np.asarray(result.choice if result.choice else [0] * len(model.layers.names), np.int64)
        saved, _, added = rc.chunk_effect(bounds, choice) if rc is not None else \
            (np.zeros(schedule.chunks, np.int64), None, np.zeros(schedule.chunks))
        options = ("none", "selective", "full")
        recomputing = bool(choice.any())
        for c in range(schedule.chunks):
            first, last = bounds[c], bounds[c + 1] - 1
            rank = schedule.chunk_rank[c]
            k = int(chunks_in_flight(schedule)[c])
            m = result.memory
            received, sent = traffic.stage_io(first, last)
            compute = model.range_compute(first, last)
            chunk_time = float(cc.forward_time[c] + cc.backward_input_time[c] + cc.backward_weight_time[c] + added[c])
            breakdown = MemoryBreakdown(always_live=int(m.resident[c]), not_always_live=int(max(
                m.forward_peak[c], m.full_backward_peak[c])), stashed_copies=int((k - 1) * m.stash[c]))
            stages.append(StagePlan(
                stage=c, device=rank, first_layer=first, last_layer=last, layers=model.layers.names[first:last + 1],
                in_flight=k, capacity_bytes=capacity(rank), worst_tile=0,
                worst_tile_bytes=int(result.ranks[rank].peak), memory_at_worst_tile=breakdown, memory_total=breakdown,
                compute=float(compute), time_s=chunk_time if seconds else (chunk_time * unit_s if unit_s else None),
                bytes_received=int(received), bytes_sent=int(sent), time=float(compute),
                recompute=tuple(options[o] for o in choice[first:last + 1]) if recomputing else (),
                recompute_saved_bytes=int(saved[c]), recompute_time=float(added[c])))
        ranks = []
        for r in result.ranks:
            at = "the optimizer step" if r.peak_action < 0 else _action_text(schedule.leaves[r.rank][r.peak_action])
            busy = float(sum(schedule.micro_batches * (cc.forward_time[c] + cc.backward_input_time[c] + added[c]
                                                       + cc.backward_weight_time[c]) + cc.optimizer_time[c]
                             for c in schedule.rank_chunks(r.rank)))
            ranks.append(RankRecord(rank=r.rank, chunks=schedule.rank_chunks(r.rank), peak_bytes=int(r.peak),
                                    capacity_bytes=capacity(r.rank), peak_at=at, busy=busy))
        _, _, _, transfer, optimizer = step_durations(problem, bounds, choice)
        record = ScheduleRecord(kind=schedule.kind.value, chunks_per_rank=schedule.chunks_per_rank,
                                micro_batches=schedule.micro_batches, step_time=float(result.step_time),
                                time_unit=problem.table.time_unit, bubble=float(result.bubble), ranks=tuple(ranks),
                                chunk_times=tuple((float(f), float(b + a), float(w)) for f, b, w, a in zip(
                                    cc.forward_time, cc.backward_input_time, cc.backward_weight_time, added)),
                                transfer_times=tuple(float(x) for x in transfer),
                                optimizer_times=tuple(float(x) for x in optimizer))
    feasible = result is not None and result.feasible
    status = "optimal" if solve.optimal and feasible else "feasible" if feasible else \
        ("infeasible" if solve.status == "infeasible" else "unknown")
    quantity = "worst device memory" if o.objective.value == "memory" else "step time"
    value = None
    if result is not None:
        value = float(np.max(result.peaks / problem.capacities)) if quantity == "worst device memory" \
            else float(result.step_time)
    bound = float(solve.bound) if np.isfinite(solve.bound) else None
    gap = None if value is None or bound is None else (0.0 if solve.optimal else max(value - bound, 0.0) / max(value, 1e-300))
    unit = "fraction of capacity" if quantity == "worst device memory" else problem.table.time_unit
    phases = [PhaseRecord(quantity, "OPTIMAL" if solve.optimal else ("INFEASIBLE" if status == "infeasible" else
                                                                      "FEASIBLE" if feasible else "UNKNOWN"),
                          value, value if solve.optimal else bound, gap, round(solve.seconds, 3), unit=unit,
                          proof="cp-sat")]
    run = PlanRun(stagesplit=VERSION, created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                  solver_seconds=round(solve.seconds, 3), phase_seconds=(round(solve.seconds, 3),),
                  versions=versions())
    notes = list(solve.notes)
    return Plan(profile=profile or plan_profile(model), inputs=inputs, layer_names=list(model.layers.names),
                devices=o.devices, method="cp-sat", status=status, feasible=feasible, message=message, stages=stages,
                phases=phases, compute_unit=model.profile.compute_unit, module_paths=list(model.layers.module_paths),
                notes=notes, run=run, tied=model.tied, schedule=record, analysis=model,
                wide_tensors=wide_tensors(model, traffic))


#: the allocator replay's cost per event as measured (benchmarks/bench_allocator.py: about 1.5 us), with room
REPLAY_SECONDS_PER_EVENT = 2e-6


def replay_events_estimate(plan: Plan) -> int:
    """About how many allocations and frees replaying ``plan`` takes: every micro-batch runs each phase
    (forward, backward) over every layer once, each not-always-live tensor allocated and freed once per
    phase it lives in (``6 x tensors x micro-batches``)."""
    model, s = plan.analysis, plan.schedule
    if model is None or s is None:
        return 0
    return 6 * int(np.count_nonzero(model.var_nal)) * int(s.micro_batches)


def with_reserved(plan: Plan, deadline: Deadline | None = None) -> Plan:
    """The plan with each device's reserved bytes on a GPU (solver/schedule_allocator.py: torch's caching
    allocator replayed on the device's allocations in the schedule's order, with the plan's recompute and
    cuBLAS's workspaces), unless the request turned the replay off; other plans as they are. Run once on
    the plan a solve returns (not on every candidate of the auto schedule), after the search, when what is
    left of ``deadline`` covers it (``replay_events_estimate``); else the plan says it was not replayed."""
    s, model = plan.schedule, plan.analysis
    request = plan.inputs.request
    if s is None or not plan.stages or model is None or request.allocator == "off" or not plan.feasible:
        return plan
    target = model.profile.target
    if target.kind != "gpu" or target.tiles != 1 or model.phase_cols is None:
        return plan
    events = replay_events_estimate(plan)
    if deadline is not None and events * REPLAY_SECONDS_PER_EVENT > deadline.left():
        note = (f"reserved memory not replayed: about {events:,} allocator events, more than the "
                f"{max(deadline.left(), 0.0):.1f} s left allow; the plan's priced peaks stand")
        return replace(plan, notes=[*plan.notes, note])
    from ..solver.schedule_allocator import cublas_workspaces, rank_replays  # (only where the replay runs)
    from ..solver.schedule_generation import build_schedule
    name = plan.inputs.targets[0].name if plan.inputs.targets else target.name
    bounds = [st.first_layer for st in plan.stages] + [plan.stages[-1].last_layer + 1]
    options = ("none", "selective", "full")
    choice = [options.index(o) for st in plan.stages for o in (st.recompute or ("none",) * len(st.layers))]
    schedule = build_schedule(s.kind, len(s.ranks), s.micro_batches, s.chunks_per_rank)
    replays = rank_replays(model, bounds, schedule, [r.peak_bytes for r in s.ranks], request.allocator_options(),
                           cublas_workspaces(name), choice, [r.capacity_bytes for r in s.ranks])
    ranks = tuple(replace(r, reserved_bytes=rep.reserved_bytes, replayed_bytes=rep.allocated_bytes,
                          fits_after_retries=rep.fits_after_retries,
                          allocator_retries=None if rep.capped is None else rep.capped.retries)
                  for r, rep in zip(s.ranks, replays))
    return replace(plan, schedule=replace(s, ranks=ranks))


def refused_plan(model: StageCostModel, inputs: PlanInputs, message: str, status: str = "infeasible") -> Plan:
    """A plan with no split: the request cannot be solved as asked (``message`` says why), or
    (``status="unknown"``) the time limit came before any split was found."""
    run = PlanRun(stagesplit=VERSION, created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                  versions=versions())
    return Plan(profile=plan_profile(model), inputs=inputs, layer_names=list(model.layers.names),
                devices=inputs.options.devices, method="cp-sat", status=status, feasible=False,
                message=message, stages=[], phases=[], compute_unit=model.profile.compute_unit,
                module_paths=list(model.layers.module_paths), notes=[], run=run, tied=model.tied, analysis=model)


def _action_text(action: Action) -> str:
    """``F3 of chunk 5``: an action as the plan tells it."""
    names = {"F": "forward", "B": "backward (input gradients)", "W": "backward (weight gradients)",
             "BW": "backward"}
    return f"the {names.get(action.op.value, action.op.value)} of micro-batch {action.micro_batch} on chunk {action.chunk}"
