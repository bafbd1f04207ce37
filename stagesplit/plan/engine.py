"""The solving strategy behind the front door: from an analysed profile and a ``SolveRequest`` to
a ``Plan``. Which path a request takes (the stage-level model, a schedule's own actions, profile
variants), the ``auto`` schedule's search over schedules, the sweep over device counts and the
fallbacks between them live here, so that ``stagesplit.api`` keeps only argument checking, file
I/O and events, and a new kind of search has one place to go.

Every search is bounded by one ``Deadline`` (common/deadline.py), made from the time limit where
the solve starts and passed down; a phase given a share of the time asks it what is left.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.deadline import Deadline, TimeLimitReached
from ..common.events import Events
from ..common.text import show
from ..errors import OptionError, StagesplitError
from ..model.analysis import Analysis
from ..solver.request import RecomputeMode, Schedule, SolveRequest
from .records import Plan, PlanInputs

if TYPE_CHECKING:
    from ..model.costmodel import RangeTable, StageCostModel
    from ..model.phases import PhaseTable
    from .advise import Advice
    from .records import ScheduleCandidate
    from .sweep import SweepResult, SweepRow

#: a schedule ``schedule='auto'`` solved: (schedule, chunks per device, its advice or None, why none)
_Solved = tuple[str, int, "Advice | None", str]
#: a schedule ranked by the quick search: ((rank, share or step), schedule, chunks per device, micro-batches)
_Ranked = tuple[tuple[int, float], str, int, int]

__all__ = ["AUTO_MAX_CHUNKS_PER_RANK", "Resolved", "auto_candidates", "check_variants_request", "price", "resolve",
           "scheduled", "solve", "solve_variants", "sweep"]


@dataclass(frozen=True)
class Resolved:
    """A request resolved against an analysis: the cost model with compute on the first target,
    the solver's options (names as indices), and the plan's record of the inputs."""

    analysis: Analysis
    model: Any                        # model.costmodel.StageCostModel, on the request's first target
    inputs: PlanInputs


def resolve(request: SolveRequest, analysis: Analysis, retry_bytes: tuple[int, ...] = ()) -> Resolved:
    """Check ``request`` against the profile's layers and targets: names become indices,
    targets capacities; the micro-batch count is chosen when the request gives none. On a GPU
    the options keep back what the profile does not hold (solver/runtime_reserve.py), and
    ``retry_bytes`` more per device (a second solve's: ``_refit``)."""
    from ..common.fileio import file_sha256
    from ..solver.problem import SolveOptions, resolve_micro_batches
    profile = analysis.profile
    names = analysis.layers.names
    index = {name: i for i, name in enumerate(names)}

    def layer(name: str, parameter: str) -> int:
        if name not in index:
            raise OptionError(parameter, f"no layer named '{show(name)}' (layers: {', '.join(names)})")
        return index[name]

    targets = list(request.resolved_targets())
    if len(targets) == 1:
        targets = targets * request.devices
    capacities: tuple[int, ...] | None = None
    if targets:
        per_device: list[int] = []
        for t in targets:
            if profile.target.tiles == 1:
                per_device.append(t.device_bytes)          # a one-tile profile: the device is one pool
            elif t.tiles == profile.target.tiles:
                per_device.append(t.bytes_per_tile)
            else:
                raise OptionError("targets", f"{t.name} has {t.tiles} tiles per device, but the profile was captured "
                                  f"on {profile.target.tiles} tiles; choose a target with the same tile count")
        capacities = tuple(per_device)
    link = request.link_bandwidth or (targets[0].link_bytes_per_s if targets else None) or \
        profile.target.link_bytes_per_s
    chunks = request.resolved_chunks()
    micro_batches, micro_auto = resolve_micro_batches(request.schedule.value, request.micro_batches,
                                                      request.devices * chunks)
    from ..solver.runtime_reserve import request_reserve
    layout = profile.info.parallel_layout
    kept = request_reserve(request, tuple(targets), profile.target,
                           layout.tensor_parallel if layout is not None else 1)
    if kept is not None and retry_bytes:
        kept = replace(kept, retry_bytes=retry_bytes)
    options = SolveOptions(
        kept_back=kept.per_device(request.devices) if kept is not None else (),
        devices=request.devices, objective=request.objective, exact=request.exact,
        schedule=request.schedule, micro_batches=micro_batches, micro_batches_auto=micro_auto,
        chunks_per_rank=chunks,
        headroom=request.headroom, capacities=capacities, reserve=request.reserve, min_layers=request.min_layers,
        max_layers=request.max_layers,
        pinned_splits=tuple(sorted({layer(x, "pin_splits") for x in request.pin_splits})),
        pinned_layers=tuple((layer(n, "pin_layers"), p) for n, p in request.pin_layers),
        communication=request.communication, link_bytes_per_s=link, time_limit=request.time_limit,
        workers=request.workers)
    model = analysis.model
    if request.layer_compute:
        model = model.with_compute(dict(request.layer_compute), request.layer_compute_source or "layer_compute")
    model = model.on(targets[0] if targets else None, request.efficiency)
    sha = None
    if request.layer_compute_source and Path(request.layer_compute_source).is_file():
        sha = file_sha256(request.layer_compute_source)
    inputs = PlanInputs(request=request, options=options,
                        targets=tuple(targets) or (profile.target,) * request.devices, layer_compute_sha256=sha,
                        runtime_reserve=kept)
    return Resolved(analysis, model, inputs)


def price(resolved: Resolved, events: Events, max_devices: int | None = None) -> RangeTable:
    """Every layer range priced once, for every in-flight count the request can need."""
    from .search import price as price_ranges
    L = resolved.model.num_layers
    events.start(f"pricing the ranges of {L:,} layers that can fit a device")
    table = price_ranges(resolved.model, resolved.inputs.options, max_devices=max_devices, progress=events.update)
    events.done()
    return table


def scheduled(request: SolveRequest, model: StageCostModel) -> bool:
    """Whether the request is solved with a schedule's own actions (solver/chunk_cpsat.py): any
    schedule but none, on a one-device profile that records each operation's phase; the looped
    and V-shaped schedules need such a profile, GPipe and 1F1B fall back to the stage model."""
    recompute = request.recompute not in (None, RecomputeMode.NONE)
    if recompute and (request.schedule is Schedule.NONE or model.phase_cols is None
                      or model.profile.target.tiles != 1):
        assert request.recompute is not None
        raise OptionError("recompute", f"{request.recompute.value} needs a profile of one device that records each "
                          "operation's phase (as stagesplit capture writes) and a pipeline schedule "
                          "(`schedule='1f1b'`, zbv, ...); on IPUs, solve profile variants compiled at several memory proportions")
    if request.schedule is Schedule.NONE:
        return False
    ok = model.phase_cols is not None and model.profile.target.tiles == 1
    if not ok and not request.schedule.one_stage_per_device:
        why = "has per-tile memory (an IPU's): use gpipe or 1f1b" if model.profile.target.tiles > 1 else \
            "does not say: capture the model, or use gpipe or 1f1b"
        raise OptionError("schedule", f"{request.schedule.value} needs a profile of one device that records each "
                          "operation's phase (forward, backward, optimizer), as stagesplit capture writes; this "
                          "profile " + why)
    return ok


def _completed(advice: Advice, model: StageCostModel, events: Events, **more: Any) -> Plan:
    """The advice's plan with what the solve adds: its warnings reported, the baselines, the
    cost model it was solved on (for plots and reports) and every warning of the solve."""
    for message in advice.warnings:
        events.warn(message)
    baselines = [replace(b, analysis=model) for b in advice.baselines]
    return replace(advice.plan, baselines=baselines, warnings=list(events.warnings), analysis=model, **more)


# -- one profile ---------------------------------------------------------------------------------

def solve(analysis: Analysis, request: SolveRequest, deadline: Deadline, events: Events,
          cutoff: float | None = None) -> Plan:
    """The plan of ``request`` on ``analysis``, searched until ``deadline``: under the schedule's
    own actions where the profile records phases (``scheduled``), each schedule in turn for
    the ``auto`` schedule, else on the stage-level model. ``cutoff`` (the ``auto`` schedule with the
    compute objective; the layout search's step to beat): every schedule is asked only for a split
    whose step is under it, and one with none is settled as slower (``_solve_auto``)."""
    from .advise import advise
    from .build import with_reserved
    resolved = resolve(request, analysis)
    if request.schedule is Schedule.AUTO:
        return _refit(with_reserved(_solve_auto(request, analysis, deadline, events, cutoff), deadline), analysis,
                      deadline, events)
    if scheduled(request, resolved.model):
        from .scheduled import advise_schedule
        events.start("pricing every layer range in each phase of the step")
        table = resolved.model.phase_table
        events.done()
        events.start("solving")
        advice = advise_schedule(resolved.model, resolved.inputs, table=table, log=events.start, deadline=deadline)
    else:
        table = price(resolved, events, max_devices=request.devices)
        events.start("solving")
        advice = advise(resolved.model, resolved.inputs, table=table, log=events.start, deadline=deadline)
    events.done()
    return _refit(with_reserved(_completed(advice, resolved.model, events), deadline), analysis, deadline, events)


#: at most this many second solves where the caching allocator's replay does not fit (each keeps back
#: the excess of the one before too); the deadline bounds them as well
REFIT_ROUNDS = 3
#: the least time left for a second solve to be tried
REFIT_MIN_SECONDS = 1.0


def _excess(plan: Plan) -> tuple[int, ...]:
    """Per device position, the bytes by which what the caching allocator reserves (replayed) passes
    the device's capacity, even with torch's retries (all 0 where every device fits)."""
    s = plan.schedule
    if s is None or not plan.feasible:
        return ()
    out = [0] * plan.devices
    for r in s.ranks:
        if r.reserved_bytes is not None and not r.fits and r.rank < len(out):
            out[r.rank] = r.needed_bytes - r.capacity_bytes
    return tuple(out)


def _refit(plan: Plan, analysis: Analysis, deadline: Deadline, events: Events) -> Plan:
    """Where a GPU plan's replayed reserved bytes do not fit a device, even with the allocator's
    retries (the split is chosen on the priced peaks), solve the plan's own schedule again keeping
    each such device's excess back too, up to ``REFIT_ROUNDS`` times while the deadline leaves
    ``REFIT_MIN_SECONDS``; the plan says what was done in a note, and whether it fits then. A second
    solve that finds no split keeps the first plan."""
    excess = _excess(plan)
    kept = plan.inputs.runtime_reserve
    if not any(excess) or kept is None:
        return plan
    from .build import with_reserved  # (imported where a second solve may run)
    from .scheduled import advise_schedule
    first = plan
    over = ", ".join(f"device {i} by {b / 2**30:,.2f} GiB" for i, b in enumerate(excess) if b)
    retry = tuple(kept.retry_bytes) or (0,) * plan.devices
    rounds, why = 0, "the time limit leaves too little"
    while any(excess) and rounds < REFIT_ROUNDS:
        if deadline.left() < REFIT_MIN_SECONDS:
            break
        retry = tuple(a + b for a, b in zip(retry, excess))
        request = replace(plan.inputs.request, time_limit=max(deadline.left(), 0.001))
        resolved = resolve(request, analysis, retry_bytes=retry)
        events.start("solving again, keeping back what the caching allocator reserves beyond each device")
        try:
            advice = advise_schedule(resolved.model, resolved.inputs, table=resolved.model.phase_table,
                                     deadline=deadline.part(deadline.left()))
        except TimeLimitReached:
            break
        except StagesplitError as exc:
            why = str(exc)
            break
        finally:
            events.done()
        rounds += 1
        if not advice.plan.feasible:           # the last plan that has a split stays
            return replace(plan, notes=[*plan.notes, f"what the caching allocator reserves does not fit ({over}): "
                                        f"solved again keeping that back too, no split fits then"])
        for message in advice.warnings:       # each said once
            if message not in events.warnings:
                events.warn(message)
        plan = with_reserved(replace(advice.plan, baselines=[replace(b, analysis=resolved.model)
                                                             for b in advice.baselines],
                                     warnings=list(events.warnings), analysis=resolved.model,
                                     candidates=first.candidates), deadline)
        excess = _excess(plan)
    if rounds == 0:
        return replace(first, notes=[*first.notes, f"what the caching allocator reserves does not fit ({over}): not "
                                     f"solved again, {why}"])
    outcome = "the plan fits what it reserves" if not any(excess) else "it still does not fit"
    note = (f"what the caching allocator reserves did not fit ({over}): solved again keeping that back too "
            f"({rounds} time{'' if rounds == 1 else 's'}); {outcome}")
    # the auto schedule's choice (its last note) stays with the plan it chose
    chosen = [first.notes[-1]] if first.candidates and first.notes and first.notes[-1] not in plan.notes else []
    return replace(plan, notes=[*plan.notes, *chosen, note])


def check_variants_request(request: SolveRequest) -> None:
    """Refuse what profile variants cannot be solved with (the API asks before reading them)."""
    if not request.schedule.one_stage_per_device:
        raise OptionError("schedule", f"profile variants are solved with the stage-level model: `schedule='none'`, "
                          f"gpipe or 1f1b, not {request.schedule.value}")
    if request.recompute not in (None, RecomputeMode.NONE):
        raise OptionError("recompute", "profile variants already trade memory for time per stage (the memory "
                          "proportion); recompute is chosen on captured GPU profiles only")


def solve_variants(analyses: Sequence[Analysis], names: Sequence[str], proportions: Sequence[float],
                   request: SolveRequest, deadline: Deadline, events: Events) -> Plan:
    """The plan of ``request`` on profile variants (plan/variants.py), their layers already
    checked to be the same: every range priced in each, one split for all."""
    from .variants import advise_variants
    check_variants_request(request)
    resolved = [resolve(request, a) for a in analyses]
    tables = [price(r, events, max_devices=request.devices) for r in resolved]
    events.start("solving")
    advice = advise_variants([r.model for r in resolved], list(names), list(proportions), resolved[0].inputs,
                             tables=tables, log=events.start, deadline=deadline)
    events.done()
    for message in advice.warnings:
        events.warn(message)
    baselines = [replace(b, analysis=r.model) for b, r in zip(advice.baselines, resolved)]
    return replace(advice.plan, baselines=baselines, warnings=list(events.warnings), analysis=resolved[0].model,
                   variant_models={name: r.model for name, r in zip(names, resolved)})


# -- schedule='auto' --------------------------------------------------------------------------------

#: the most chunks per device ``schedule='auto'`` tries (each schedule that takes several: 1 to this)
AUTO_MAX_CHUNKS_PER_RANK = 4


def auto_candidates(req: SolveRequest) -> list[tuple[str, int, int]]:
    """Every (schedule, chunks per device, micro-batches) the ``auto`` schedule tries: each schedule
    torch ships with each chunks-per-device count it takes, up to AUTO_MAX_CHUNKS_PER_RANK (or the
    one asked for), where torch's class accepts the device and micro-batch counts."""
    from ..solver.schedule_kinds import ScheduleKind, is_valid, traits
    out = []
    for kind in ScheduleKind:
        fixed = traits(kind).fixed_chunks_per_rank
        for v in ([fixed] if fixed else range(1, AUTO_MAX_CHUNKS_PER_RANK + 1)):
            if req.chunks_per_rank is not None and v != req.chunks_per_rank:
                continue
            M = req.micro_batches or req.devices * v
            if is_valid(kind, req.devices, M, v):
                out.append((kind.value, v, M))
    return out


def _step(advice: Advice | None) -> float:
    """A schedule solve's step time (infinite where nothing fits or it was refused)."""
    if advice is None or not advice.plan.feasible:
        return math.inf
    schedule = advice.plan.schedule
    assert schedule is not None               # a schedule solve's plan records its schedule
    return schedule.step_time


#: a schedule ``schedule='auto'``'s time limit stopped before any split of it was found
_NOT_SEARCHED = "the time limit was reached before a split of this schedule was found"


def _solve_auto(req: SolveRequest, analysis: Analysis, deadline: Deadline, events: Events,
                cutoff: float | None = None) -> Plan:
    """The ``auto`` schedule: every schedule (and chunks per device) valid for the device and
    micro-batch counts, the most promising first (by a quick search of each). The first is solved
    to its proven optimum; every other is asked only for a split faster than the fastest plan so
    far, which is quick to refute where there is none (and where there is, that schedule's plan
    becomes the fastest, proven in turn). Time left at the end goes to the searches the time limit
    stopped. The plan is the fastest that fits (the emptiest, with the memory objective);
    ``plan.candidates`` lists them all. The deadline bounds all of it: a schedule it stops before
    any split is found is listed as not known (status "unknown"). ``cutoff``: a step to beat from
    the start (the first schedule too is asked only for a split under it); where every schedule is
    slower, infeasible or refused, no split of any schedule is under it (proven), and the plan is the
    fastest of those found, or none."""
    with deadline.watched():
        return _solve_auto_within(req, analysis, deadline, events, cutoff)


def _solve_auto_within(req: SolveRequest, analysis: Analysis, deadline: Deadline, events: Events,
                       cutoff: float | None = None) -> Plan:
    from ..solver.chunk_search import local_search
    from .records import ScheduleCandidate
    from .scheduled import advise_schedule, schedule_problem
    candidates = auto_candidates(req)
    if not candidates:
        raise OptionError("schedule", f"no schedule is valid for {req.devices} devices and {req.micro_batches} "
                          "micro-batches")
    memory = req.objective.value == "memory"
    table: PhaseTable | None = None
    ranked: list[_Ranked] = []
    events.start("ranking the schedules by a quick search")
    budget = min(0.25, req.time_limit / (10 * len(candidates)))
    # the ranking takes at most half of the time: on long schedules (thousands of micro-batches,
    # many chunks) making one schedule's actions takes seconds, and the solves need the rest
    ranking = deadline.part(deadline.left() - req.time_limit / 2)
    for kind, v, M in candidates:
        trial = replace(req, schedule=Schedule(kind), chunks_per_rank=v, micro_batches=M)
        resolved = resolve(trial, analysis)
        if not scheduled(trial, resolved.model):
            raise OptionError("schedule", "auto needs a profile of one device that records each operation's phase "
                              "(forward, backward, optimizer), as stagesplit capture writes")
        if table is None:
            table, solved_on = resolved.model.phase_table, resolved.model
        try:
            with ranking.watched():
                problem = schedule_problem(resolved.model, resolved.inputs, table)
                quick = local_search(problem, budget_s=budget)
            share = float((quick.peaks / problem.capacities).max())
            rank: tuple[int, float] = (0 if quick.feasible else 1, share if memory else quick.step_time)
        except TimeLimitReached:         # not ranked: after the others
            rank = (3, 0.0)
        except StagesplitError:
            rank = (2, 0.0)
        ranked.append((rank, kind, v, M))
    events.done()
    ranked.sort(key=lambda item: item[0])

    plans: list[_Solved] = []
    for i, (_, kind, v, M) in enumerate(ranked):
        left = deadline.left()
        # the first (the likeliest fastest) may take half of the time, each other its part of what
        # is left or (a schedule that beats the fastest so far proves its own optimum) up to 10 s;
        # refuting a split faster than the fastest so far takes a second or two where there is none
        share = max(left / 2 if i == 0 else max(left / (len(ranked) - i), min(left / 2, 10.0)), 1.0)
        fastest = min((_step(p[2]) for p in plans[:i]), default=math.inf)
        if cutoff is not None:               # the caller's step to beat, where nothing found beats it
            fastest = min(fastest, cutoff)
        # the plan records the share it was searched with as its time limit (as such plans always have)
        trial = replace(req, schedule=Schedule(kind), chunks_per_rank=v, micro_batches=M, time_limit=share)
        resolved = resolve(trial, analysis)
        events.start(f"solving {kind}, {v} chunk(s) per device")
        try:
            advice = advise_schedule(resolved.model, resolved.inputs, table=table,
                                     cutoff=None if memory or not math.isfinite(fastest) else fastest,
                                     deadline=deadline.part(share))
            plans.append((kind, v, advice, ""))
        except TimeLimitReached:
            plans.append((kind, v, None, _NOT_SEARCHED))
        except StagesplitError as exc:
            plans.append((kind, v, None, str(exc)))
        finally:
            events.done()
    if not memory:
        _spend_what_is_left(req, analysis, table, ranked, plans, deadline, events, cutoff)
    feasible: list[tuple[str, int, Advice]] = [(k, v, a) for k, v, a, _ in plans if a is not None and a.plan.feasible]

    def score(item: tuple[str, int, Advice]) -> tuple[float, bool, float]:
        s = item[2].plan.schedule
        assert s is not None                    # a schedule solve's plan records its schedule
        worst = max(r.peak_bytes / r.capacity_bytes for r in s.ranks)
        unproven = item[2].plan.status != "optimal"      # on a tie, the proven plan
        return (worst, unproven, s.step_time) if memory else (s.step_time, unproven, worst)
    rows: list[ScheduleCandidate] = []
    for kind, v, solved, error in plans:
        plan = solved.plan if solved is not None else None
        s = plan.schedule if plan is not None else None
        status = ("unknown" if error == _NOT_SEARCHED else "refused") if plan is None else \
            "slower" if solved is not None and solved.slower else plan.status
        rows.append(ScheduleCandidate(
            schedule=kind, chunks_per_rank=v, status=status,
            step_time=s.step_time if s else None, bubble=s.bubble if s else None,
            worst_memory=max(r.peak_bytes / r.capacity_bytes for r in s.ranks) if s else None,
            seconds=(plan.run.solver_seconds or 0.0) if plan is not None else 0.0,
            note=error or (plan.message if plan else "")))
    best: Advice | None
    if feasible:
        best = min(feasible, key=score)[2]
    else:
        best = next((a for _, _, a, _ in plans if a is not None), None)
        if best is None and all(e == _NOT_SEARCHED for _, _, _, e in plans):
            raise TimeLimitReached(f"no split was found within the time limit ({req.time_limit:g} s); allow more "
                                   "with `time_limit`")
        if best is None:
            raise StagesplitError("no schedule could be solved: " + "; ".join(f"{k} (v={v}): {e}"
                                                                               for k, v, _, e in plans))
    plan = best.plan
    proven = plan.status == "optimal" and all(r.status in ("optimal", "slower", "infeasible", "refused") for r in rows)
    if plan.feasible:
        assert plan.schedule is not None          # a schedule solve's plan records its schedule
        note = (f"`schedule='auto'`: {plan.schedule.kind} with {plan.schedule.chunks_per_rank} chunk(s) per device "
                f"is the {'emptiest' if memory else 'fastest'} that fits of {len(rows)} tried"
                + (" (proven: no other schedule has a faster split)" if proven and not memory else ""))
    else:
        note = f"`schedule='auto'`: none of the {len(rows)} schedules tried fits"
    for message in best.warnings:
        events.warn(message)
    # the model the plans were solved on (the target's roofline applied, the phase table kept)
    return replace(plan, candidates=tuple(rows), notes=[*plan.notes, note], warnings=list(events.warnings),
                   analysis=solved_on)


def _spend_what_is_left(req: SolveRequest, analysis: Analysis, table: PhaseTable | None, ranked: list[_Ranked],
                        plans: list[_Solved], deadline: Deadline,
                        events: Events, cutoff: float | None = None) -> None:
    """The ``auto`` schedule's second pass: while time is left, a schedule whose search the time
    limit stopped with a lower bound below the fastest plan found (it might still beat it) is
    searched again, with all of that time and the fastest plan's step to beat, the one with the
    lowest bound first; its plan is replaced where the new one is faster."""
    from .scheduled import advise_schedule

    retried: set[int] = set()
    while True:
        left = deadline.left()
        best = min((_step(a) for _, _, a, _ in plans), default=math.inf)
        if cutoff is not None:               # the caller's step to beat, where nothing found beats it
            best = min(best, cutoff)
        open_ = [(a.plan.phases[0].bound, i) for i, (_, _, a, _) in enumerate(plans)
                 if i not in retried and a is not None and not a.slower and a.plan.status != "optimal"
                 and a.plan.phases and a.plan.phases[0].bound is not None
                 and a.plan.phases[0].bound < best * (1 - 1e-9)]
        if left < 2.0 or not open_:
            return
        _, i = min(open_)
        retried.add(i)
        kind, v, advice, _ = plans[i]
        assert advice is not None                # only a solved schedule is open
        M = ranked[i][3]
        trial = replace(req, schedule=Schedule(kind), chunks_per_rank=v, micro_batches=M, time_limit=left)
        resolved = resolve(trial, analysis)
        events.start(f"solving {kind}, {v} chunk(s) per device, again with the time left")
        try:
            again = advise_schedule(resolved.model, resolved.inputs, table=table,
                                    cutoff=best if _step(advice) > best and math.isfinite(best) else None,
                                    deadline=deadline.part(left))
        except StagesplitError:
            continue
        finally:
            events.done()
        if again.slower and _step(again) >= _step(advice):
            advice.slower = True
            advice.plan = replace(advice.plan, message=again.plan.message)
        elif _step(again) < _step(advice) or (_step(again) == _step(advice) and again.plan.status == "optimal"):
            plans[i] = (kind, v, again, "")


# -- device counts ---------------------------------------------------------------------------------

def sweep(analysis: Analysis, request: SolveRequest, counts: list[int], events: Events,
          on_row: Callable[[SweepRow], None] | None = None) -> SweepResult:
    """Solve ``request`` for each device count in ``counts`` (each within the request's time
    limit), pricing every layer range once; a ``SweepResult``."""
    from .sweep import sweep as sweep_counts
    resolved = resolve(request, analysis)
    is_scheduled = scheduled(request, resolved.model)
    table = None
    if not is_scheduled:               # priced for the least any count keeps back (the largest capacity)
        from .sweep import sweep_options
        widest = replace(resolved, inputs=replace(resolved.inputs, options=sweep_options(resolved.inputs, counts)))
        table = price(widest, events, max_devices=max(counts))
    phases = resolved.model.phase_table if is_scheduled else None
    done: list[SweepRow] = []

    events.start("solving", "device counts")

    def row_done(row: SweepRow) -> None:
        done.append(row)
        events.update(len(done), len(counts))
        if on_row is not None:
            on_row(row)

    result = sweep_counts(resolved.model, resolved.inputs, counts, table=table, on_row=row_done, phases=phases)
    events.done()
    result.warnings = list(events.warnings)
    return result
