"""The front door: every command as one Python call taking names, as the command line does.

    plan = stagesplit.solve("profiles/bert-base.stagesplit", devices=4, schedule="1f1b")

``solve``, ``sweep``, ``breakdown`` and ``diagnose`` accept a profile path, a loaded ``Profile``
or an ``Analysis`` (profile, layers and cost model, reusable across calls). Solve options are
the fields of ``SolveRequest``, the one options record. Every argument is checked here: a bad
one raises a ``StagesplitError`` (``OptionError`` naming the parameter). Progress and warnings
go through one channel, an ``Events`` object; the command line passes one that prints them,
and the default collects warnings into the result (``plan.warnings``). Functions that write
files take the output paths and refuse one that is also an input.
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import contextmanager
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from .common.deadline import TimeLimitReached, deadline_at
from .common.guards import check_outputs as _check_paths, device_counts
from .common.limits import MAX_DEVICES
from .common.text import show, short_repr
from .common.validate import choice, integer, number
from .errors import OptionError, StagesplitError
from .io.profile import Profile, Target
from .layers import LayerOptions
from .model.analysis import Analysis
from .solver.request import RecomputeMode, Schedule, SharedPolicy, SolveRequest

__all__ = ["Events", "Reproduction", "analyze", "breakdown", "capture", "convert", "diagnose", "export",
           "import_onnx", "plot", "report", "reproduce", "solve", "sweep", "synthesize", "targets"]

ProfileLike = str | Path | Profile | Analysis


class Events:
    """The one channel for progress and warnings. ``start``/``update``/``done`` frame a long
    phase (loading, pricing, solving); ``warn`` reports something the user should know. This
    base class keeps the warnings (``warnings``) and shows nothing; the command line subclasses
    it to print them."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        """Something the user should know (kept in ``warnings``)."""
        self.warnings.append(message)

    def start(self, label: str, unit: str = "") -> None:
        """A phase begins (it ends at ``done`` or when the next one starts); ``unit`` names
        what its ``update`` counts (e.g. "device counts"), empty when only the share matters."""

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` units of the current phase."""

    def done(self, detail: str = "") -> None:
        """The current phase ended."""


def _check_outputs(outputs, inputs) -> None:
    """Every output checked against every file the command reads (``guards.check_outputs``),
    the profiles and debug files a variants file lists included (``io.variants.input_files``):
    the one check every command with an output goes through."""
    from .io.variants import input_files
    if not any(path for _, path, _ in outputs):        # nothing to write: no variants file read for it
        return
    _check_paths(outputs, input_files(inputs))


def _profile_files(profile: Any) -> list[str]:
    """The files a profile argument names: a path (a variants file is expanded by
    ``_check_outputs``), or each profile of a list of variants."""
    from .io.variants import VariantSource, variant_argument
    if isinstance(profile, (str, Path)):
        return [str(profile)]
    out: list[str] = []
    for item in profile if isinstance(profile, (list, tuple)) else ():
        if isinstance(item, VariantSource):
            out += [x for x in (item.path, item.debug) if x]
        elif isinstance(item, str):
            pair = variant_argument(item)
            out.append(pair[0] if pair else item)
        elif isinstance(item, (tuple, list)) and item and isinstance(item[0], (str, Path)):
            out.append(str(item[0]))
    return out


# -- arguments ----------------------------------------------------------------------------------

def _events(events: Events | None) -> Events:
    if events is not None and not isinstance(events, Events):
        raise OptionError("events", f"expected a stagesplit.Events, got {type(events).__name__}")
    return events if events is not None else Events()


def _path(parameter: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, (str, Path)) or not str(value):
        raise OptionError(parameter, f"expected a file path, got {short_repr(value)}")
    return str(value)


def _layering(value: Any) -> LayerOptions | None:
    if value is not None and not isinstance(value, LayerOptions):
        raise OptionError("layering", f"expected a LayerOptions, got {type(value).__name__}")
    return value


def _target(parameter: str, value: Any) -> Target | None:
    from .io.targets import load_target
    if value is None or isinstance(value, Target):
        return value
    if isinstance(value, str):
        return load_target(value)
    raise OptionError(parameter, f"expected a target name, a YAML path or a Target, got {short_repr(value)}")


def _layer_compute(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise OptionError("layer_compute", f"expected a mapping of layer names to compute figures, "
                          f"got {short_repr(value)}")
    return {str(k): number("layer_compute", v, 0, 1e30) for k, v in value.items()}


# -- analysis -----------------------------------------------------------------------------------

def analyze(profile: ProfileLike, *, layering: LayerOptions | None = None, shared: str | SharedPolicy = "every",
            debug: str | Path | None = None, events: Events | None = None) -> Analysis:
    """The profile (read from a path if given one), its layers and its cost model. Warnings of
    the profile and of the grouping go to ``events``."""
    from .io import load_profile
    events = _events(events)
    layering = _layering(layering)
    shared = choice(SharedPolicy, "shared", shared)
    if isinstance(profile, Analysis):
        if (layering is None or layering == profile.layers.options) and profile.model.shared == shared.value:
            return profile
        profile = profile.profile
    if isinstance(profile, (str, Path)):
        path = _path("profile", profile)
        events.start(f"reading {show(path)}")
        profile = load_profile(path, _path("debug", debug, optional=True), events.update)
        events.done()
    elif not isinstance(profile, Profile):
        raise OptionError("profile", f"expected a path, a Profile or an Analysis, got {type(profile).__name__}")
    from .layers import group_layers
    from .model.costmodel import StageCostModel
    events.start(f"grouping {len(profile.operations):,} operations into layers")
    layers = group_layers(profile, layering)
    events.start(f"building the cost model ({len(layers.names):,} layers, {len(profile.variables):,} variables)")
    analysis = Analysis(profile, layers, StageCostModel(profile, layers, shared=shared.value))
    events.done()
    for message in list(profile.info.warnings) + list(analysis.layers.warnings):
        events.warn(message)
    return analysis


def _request(devices: Any, request: SolveRequest | None, options: dict[str, Any]) -> SolveRequest:
    """A ``SolveRequest`` from keyword options (``target=`` is accepted for one target)."""
    if request is not None and not isinstance(request, SolveRequest):
        raise OptionError("request", f"expected a SolveRequest, got {type(request).__name__}")
    if "target" in options:
        if "targets" in options:
            raise OptionError("target", "give target or targets, not both")
        options["targets"] = options.pop("target")
    known = set(SolveRequest.__dataclass_fields__) - {"origins"}
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise OptionError(unknown[0], f"not an option of solve (options: {', '.join(sorted(known - {'devices'}))})")
    if request is not None:
        changes = dict(options)
        if devices is not None:
            changes["devices"] = devices
        return request.overridden(**changes) if changes else request
    if devices is None:
        raise OptionError("devices", "expected the number of devices")
    return SolveRequest(devices=devices, **options)


@dataclass
class Resolved:
    """A request resolved against an analysis: the cost model with compute on the first target,
    the solver's options (names as indices), and the plan's record of the inputs."""

    analysis: Analysis
    model: Any
    inputs: Any                       # plan.records.PlanInputs


def resolve(request: SolveRequest, analysis: Analysis) -> Resolved:
    """Check ``request`` against the profile's layers and targets: names become indices,
    targets capacities; the micro-batch count is chosen when the request gives none."""
    from .common.fileio import file_sha256
    from .model.roofline import apply_roofline
    from .plan.records import PlanInputs
    from .solver.problem import SolveOptions, resolve_micro_batches
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
    capacities = None
    if targets:
        capacities = []
        for t in targets:
            if profile.target.tiles == 1:
                capacities.append(t.device_bytes)          # a one-tile profile: the device is one pool
            elif t.tiles == profile.target.tiles:
                capacities.append(t.bytes_per_tile)
            else:
                raise OptionError("targets", f"{t.name} has {t.tiles} tiles per device, but the profile was captured "
                                  f"on {profile.target.tiles} tiles; choose a target with the same tile count")
        capacities = tuple(capacities)
    link = request.link_bandwidth or (targets[0].link_bytes_per_s if targets else None) or \
        profile.target.link_bytes_per_s
    micro_batches, micro_auto = resolve_micro_batches(request.schedule.value, request.micro_batches,
                                                      request.devices * _chunks_per_rank(request))
    options = SolveOptions(
        devices=request.devices, objective=request.objective, exact=request.exact,
        schedule=request.schedule, micro_batches=micro_batches, micro_batches_auto=micro_auto,
        chunks_per_rank=_chunks_per_rank(request),
        headroom=request.headroom, capacities=capacities, reserve=request.reserve, min_layers=request.min_layers,
        max_layers=request.max_layers, pinned_splits=tuple(sorted({layer(x, "pin_splits") for x in request.pin_splits})),
        pinned_layers=tuple((layer(n, "pin_layers"), p) for n, p in request.pin_layers),
        communication=request.communication, link_bytes_per_s=link, time_limit=request.time_limit,
        workers=request.workers)
    model = analysis.model
    if request.layer_compute:
        model = model.with_compute(dict(request.layer_compute), request.layer_compute_source or "layer_compute")
    else:
        model = copy.copy(model)                      # the roofline below is attached to this copy only
    apply_roofline(model, targets[0] if targets else None, request.efficiency)
    sha = None
    if request.layer_compute_source and Path(request.layer_compute_source).is_file():
        sha = file_sha256(request.layer_compute_source)
    inputs = PlanInputs(request=request, options=options,
                        targets=tuple(targets) or (profile.target,) * request.devices, layer_compute_sha256=sha)
    return Resolved(analysis, model, inputs)


def _price(resolved: Resolved, events: Events, max_devices: int | None = None):
    """Every layer range priced once, for every in-flight count the request can need."""
    from .plan.advise import price
    L = resolved.model.num_layers
    events.start(f"pricing the ranges of {L:,} layers that can fit a device")
    table = price(resolved.model, resolved.inputs.options, max_devices=max_devices, progress=events.update)
    events.done()
    return table


# -- solving ------------------------------------------------------------------------------------

def solve(profile: ProfileLike, devices: int | None = None, *, request: SolveRequest | None = None,
          events: Events | None = None, debug: str | Path | None = None, **options: Any):
    """Split ``profile`` into pipeline stages for ``devices`` devices and return the ``Plan``.

    Options are ``SolveRequest``'s fields: ``target``/``targets``, ``objective`` ("compute",
    "memory", "devices"), ``exact``, ``schedule`` ("none", "gpipe", "1f1b", "interleaved-1f1b",
    "looped-bfs", "zb-h1", "zbv", "dualpipev", "auto"), ``chunks_per_rank``, ``recompute``
    ("auto", "none", "selective", "full"), ``micro_batches``,
    ``headroom``, ``reserve``, ``min_layers``, ``max_layers``, ``pin_splits`` (layer names),
    ``pin_layers`` ({layer name: device position}), ``communication``, ``link_bandwidth``,
    ``efficiency``, ``shared``, ``layer_compute`` ({layer name: compute}), ``layering``,
    ``time_limit``, ``workers``, ``compare``. With ``compare``, ``plan.baselines`` holds what
    the user would do otherwise, priced by the same cost model: on a GPU the frameworks' default
    splits (plan/baselines.py), on an IPU PopLiner's greedy and an even split. ``plan.warnings`` lists what the command line prints as warnings.
    """
    events = _events(events)
    req = _request(devices, request, options)
    with _named_by(req):
        return _solve(profile, req, events, debug)


@contextmanager
def _named_by(request: SolveRequest):
    """An ``OptionError`` about a value a file gave (a settings file, a plan's request) leaves
    named by that file and field, wherever it was found (solver/request.py's ``origins``)."""
    try:
        yield
    except OptionError as exc:
        named = request.named(exc)
        if named is exc:
            raise
        raise named from exc


def _solve(profile: ProfileLike, req: SolveRequest, events: Events, debug: str | Path | None):
    """``solve`` once its request is made."""
    from .plan.advise import advise, advise_schedule
    variants = _variant_sources(profile)
    if variants is not None:
        return _solve_variants(variants, req, events, debug)
    analysis = analyze(profile, layering=req.layering, shared=req.shared, debug=debug, events=events)
    resolved = resolve(req, analysis)
    if req.schedule is Schedule.AUTO:
        return _solve_auto(req, analysis, events)
    if _scheduled(req, resolved.model):
        events.start("pricing every layer range in each phase of the step")
        table = _phase_table(resolved.model)
        events.done()
        events.start("solving")
        advice = advise_schedule(resolved.model, resolved.inputs, table=table, log=events.start)
    else:
        table = _price(resolved, events, max_devices=req.devices)
        events.start("solving")
        advice = advise(resolved.model, resolved.inputs, table=table, log=events.start)
    events.done()
    for message in advice.warnings:
        events.warn(message)
    plan = advice.plan
    plan.baselines, plan.warnings, plan.analysis = advice.baselines, list(events.warnings), resolved.model
    for baseline in plan.baselines:
        baseline.analysis = resolved.model
    return plan


def _variant_sources(profile: Any):
    """The profile variants ``profile`` names (a variants file, or a list of them), or None for
    one profile."""
    from .io.variants import VariantSource, check_variants, is_variants_file, read_variants_file, \
        variants_from_arguments
    if isinstance(profile, (str, Path)):
        return read_variants_file(profile) if is_variants_file(profile) else None
    if not isinstance(profile, (list, tuple)):
        return None
    out = []
    for i, item in enumerate(profile):
        if isinstance(item, VariantSource):
            out.append(item)
        elif isinstance(item, str):
            out += variants_from_arguments([item])
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], (str, Path, Profile)):
            proportion = number(f"profile[{i}]", item[1], 0, 1, low_open=True)
            source = item[0] if isinstance(item[0], Profile) else str(item[0])
            if isinstance(source, Profile):          # named by its file, else its name and proportion
                name = source.info.path or f"{source.info.name or 'variant'}@{proportion:g}"
            else:
                name = source
            out.append(VariantSource(source, proportion, name))
        else:
            raise OptionError("profile", f"expected a list of profile variants ('PATH=PROPORTION', (profile, "
                              f"proportion) or VariantSource), got {short_repr(item)} at {i}")
    return check_variants(out, "profile")


def _solve_variants(sources, req: SolveRequest, events: Events, debug):
    """``solve`` on profile variants (plan/variants.py): each profile read and grouped as one
    profile would be, their layers checked to be the same, every range priced in each."""
    from .io.variants import check_same_layers
    from .plan.variants import advise_variants
    if debug is not None:
        raise OptionError("debug", "with profile variants, give each profile.pop's debug.cbor in a variants file "
                          "(its debug field)")
    if not req.schedule.one_stage_per_device:
        raise OptionError("schedule", f"profile variants are solved with the stage-level model: --schedule none, "
                          f"gpipe or 1f1b, not {req.schedule.value}")
    if req.recompute not in (None, RecomputeMode.NONE):
        raise OptionError("recompute", "profile variants already trade memory for time per stage (the memory "
                          "proportion); recompute is chosen on captured GPU profiles only")
    analyses = [analyze(s.profile, layering=req.layering, shared=req.shared, debug=s.debug, events=events)
                for s in sources]
    names = [s.name for s in sources]
    check_same_layers(names, [a.layers.names for a in analyses])
    resolved = [resolve(req, a) for a in analyses]
    tables = [_price(r, events, max_devices=req.devices) for r in resolved]
    events.start("solving")
    advice = advise_variants([r.model for r in resolved], names, [s.proportion for s in sources], resolved[0].inputs,
                             tables=tables, log=events.start)
    events.done()
    for message in advice.warnings:
        events.warn(message)
    plan = advice.plan
    plan.baselines, plan.warnings, plan.analysis = advice.baselines, list(events.warnings), resolved[0].model
    plan.variant_models = {name: r.model for name, r in zip(names, resolved)}
    for baseline, r in zip(plan.baselines, resolved):
        baseline.analysis = r.model
    return plan


def _chunks_per_rank(request: SolveRequest) -> int:
    """The chunks per device a request's schedule runs with."""
    from .solver.schedule_kinds import ScheduleKind, traits
    if request.chunks_per_rank is not None:
        return request.chunks_per_rank
    if request.schedule.one_stage_per_device or request.schedule is Schedule.AUTO:
        return 1
    return traits(ScheduleKind(request.schedule.value)).fixed_chunks_per_rank or 2


def _scheduled(request: SolveRequest, model) -> bool:
    """Whether the request is solved with a schedule's own actions (solver/chunk_cpsat.py): any
    schedule but none, on a one-device profile that records each operation's phase; the looped
    and V-shaped schedules need such a profile, GPipe and 1F1B fall back to the stage model."""
    recompute = request.recompute not in (None, RecomputeMode.NONE)
    if recompute and (request.schedule is Schedule.NONE or model.phase_cols is None
                      or model.profile.target.tiles != 1):
        raise OptionError("recompute", f"{request.recompute.value} needs a profile of one device that records each "
                          "operation's phase (as stagesplit capture writes) and a pipeline schedule (--schedule 1f1b, "
                          "zbv, ...); on IPUs, solve profile variants compiled at several memory proportions")
    if request.schedule is Schedule.NONE:
        return False
    ok = model.phase_cols is not None and model.profile.target.tiles == 1
    if not ok and not request.schedule.one_stage_per_device:
        raise OptionError("schedule", f"{request.schedule.value} needs a profile of one device that records each "
                          "operation's phase (forward, backward, optimizer), as stagesplit capture writes; this "
                          "profile " + ("has per-tile memory (an IPU's): use gpipe or 1f1b" if model.profile.target.tiles
                                        > 1 else "does not say: capture the model, or use gpipe or 1f1b"))
    return ok


def _phase_table(model):
    """The model's phase table (model/phases.py), made once per model (its times follow the
    target the model's roofline was computed on)."""
    from .model.phases import phase_table
    cached = getattr(model, "_phase_table", None)
    if cached is None:
        cached = phase_table(model)
        model._phase_table = cached
    return cached


#: the most chunks per device ``--schedule auto`` tries (each schedule that takes several: 1 to this)
AUTO_MAX_CHUNKS_PER_RANK = 4


def _auto_candidates(req: SolveRequest) -> list[tuple[str, int, int]]:
    """Every (schedule, chunks per device, micro-batches) ``--schedule auto`` tries: each schedule
    torch ships with each chunks-per-device count it takes, up to AUTO_MAX_CHUNKS_PER_RANK (or the
    one asked for), where torch's class accepts the device and micro-batch counts."""
    from .solver.schedule_kinds import ScheduleKind, is_valid, traits
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


def _step(advice) -> float:
    """A schedule solve's step time (infinite where nothing fits or it was refused)."""
    return advice.plan.schedule.step_time if advice is not None and advice.plan.feasible else math.inf


def _solve_auto(req: SolveRequest, analysis, events: Events):
    """``--schedule auto``: every schedule (and chunks per device) valid for the device and
    micro-batch counts, the most promising first (by a quick search of each). The first is solved
    to its proven optimum; every other is asked only for a split faster than the fastest plan so
    far, which is quick to refute where there is none (and where there is, that schedule's plan
    becomes the fastest, proven in turn). Time left at the end goes to the searches the time limit
    stopped. The plan is the fastest that fits (the emptiest, with the memory objective);
    ``plan.candidates`` lists them all. The time limit bounds all of it (common/deadline.py): a
    schedule it stops before any split is found is listed as not known (status "unknown")."""
    started = time.monotonic()
    with deadline_at(started + req.time_limit, req.time_limit):
        return _solve_auto_within(req, analysis, events, started)


def _solve_auto_within(req: SolveRequest, analysis, events: Events, started: float):
    from .plan.advise import advise_schedule, schedule_problem
    from .plan.records import ScheduleCandidate
    from .solver.chunk_search import local_search
    candidates = _auto_candidates(req)
    if not candidates:
        raise OptionError("schedule", f"no schedule is valid for {req.devices} devices and {req.micro_batches} "
                          "micro-batches")
    memory = req.objective.value == "memory"
    table = None
    ranked = []
    events.start("ranking the schedules by a quick search")
    budget = min(0.25, req.time_limit / (10 * len(candidates)))
    for kind, v, M in candidates:
        trial = replace(req, schedule=kind, chunks_per_rank=v, micro_batches=M)
        resolved = resolve(trial, analysis)
        if not _scheduled(trial, resolved.model):
            raise OptionError("schedule", "auto needs a profile of one device that records each operation's phase "
                              "(forward, backward, optimizer), as stagesplit capture writes")
        if table is None:
            table, solved_on = _phase_table(resolved.model), resolved.model
        try:
            # the ranking takes at most half of the time: on long schedules (thousands of micro-batches,
            # many chunks) making one schedule's actions takes seconds, and the solves need the rest
            with deadline_at(started + req.time_limit / 2):
                problem = schedule_problem(resolved.model, resolved.inputs, table)
                quick = local_search(problem, budget_s=budget)
            share = float((quick.peaks / problem.capacities).max())
            rank = (0 if quick.feasible else 1, share if memory else quick.step_time)
        except TimeLimitReached:         # not ranked: after the others
            rank = (3, 0.0)
        except StagesplitError:
            rank = (2, 0.0)
        ranked.append((rank, kind, v, M))
    events.done()
    ranked.sort(key=lambda item: item[0])

    plans: list = [None] * len(ranked)
    for i, (_, kind, v, M) in enumerate(ranked):
        left = req.time_limit - (time.monotonic() - started)
        # the first (the likeliest fastest) may take half of the time, each other its part of what
        # is left or (a schedule that beats the fastest so far proves its own optimum) up to 10 s;
        # refuting a split faster than the fastest so far takes a second or two where there is none
        share = max(left / 2 if i == 0 else max(left / (len(ranked) - i), min(left / 2, 10.0)), 1.0)
        best = min((_step(p[2]) for p in plans[:i]), default=math.inf)
        trial = replace(req, schedule=kind, chunks_per_rank=v, micro_batches=M, time_limit=share)
        resolved = resolve(trial, analysis)
        events.start(f"solving {kind}, {v} chunk(s) per device")
        try:
            advice = advise_schedule(resolved.model, resolved.inputs, table=table,
                                     cutoff=None if memory or not math.isfinite(best) else best)
            plans[i] = (kind, v, advice, "")
        except TimeLimitReached:
            plans[i] = (kind, v, None, _NOT_SEARCHED)
        except StagesplitError as exc:
            plans[i] = (kind, v, None, str(exc))
        finally:
            events.done()
    if not memory:
        _spend_what_is_left(req, analysis, table, ranked, plans, started, events)
    feasible = [(k, v, a) for k, v, a, _ in plans if a is not None and a.plan.feasible]

    def score(item):
        s = item[2].plan.schedule
        worst = max(r.peak_bytes / r.capacity_bytes for r in s.ranks)
        unproven = item[2].plan.status != "optimal"      # on a tie, the proven plan
        return (worst, unproven, s.step_time) if memory else (s.step_time, unproven, worst)
    rows = []
    for kind, v, advice, error in plans:
        plan = advice.plan if advice is not None else None
        s = plan.schedule if plan is not None else None
        status = ("unknown" if error == _NOT_SEARCHED else "refused") if plan is None else \
            "slower" if advice.slower else plan.status
        rows.append(ScheduleCandidate(
            schedule=kind, chunks_per_rank=v, status=status,
            step_time=s.step_time if s else None, bubble=s.bubble if s else None,
            worst_memory=max(r.peak_bytes / r.capacity_bytes for r in s.ranks) if s else None,
            seconds=(plan.run.solver_seconds or 0.0) if plan is not None else 0.0,
            note=error or (plan.message if plan else "")))
    if feasible:
        best = min(feasible, key=score)[2]
    else:
        best = next((a for _, _, a, _ in plans if a is not None), None)
        if best is None and all(e == _NOT_SEARCHED for _, _, _, e in plans):
            raise TimeLimitReached(f"no split was found within the time limit ({req.time_limit:g} s); allow more "
                                   "with --time-limit")
        if best is None:
            raise StagesplitError("no schedule could be solved: " + "; ".join(f"{k} (v={v}): {e}"
                                                                               for k, v, _, e in plans))
    plan = best.plan
    plan.candidates = tuple(rows)
    proven = plan.status == "optimal" and all(r.status in ("optimal", "slower", "infeasible", "refused") for r in rows)
    plan.notes.append(f"--schedule auto: {plan.schedule.kind} with {plan.schedule.chunks_per_rank} chunk(s) per device "
                      f"is the {'emptiest' if memory else 'fastest'} that fits of {len(rows)} tried"
                      + (" (proven: no other schedule is faster)" if proven and not memory else "")
                      if plan.feasible else f"--schedule auto: none of the {len(rows)} schedules tried fits")
    for message in best.warnings:
        events.warn(message)
    # the model the plans were solved on (the target's roofline applied, the phase table kept)
    plan.warnings, plan.analysis = list(events.warnings), solved_on
    return plan


#: a schedule ``--schedule auto``'s time limit stopped before any split of it was found
_NOT_SEARCHED = "the time limit was reached before a split of this schedule was found"


def _spend_what_is_left(req: SolveRequest, analysis, table, ranked: list, plans: list, started: float,
                        events: Events) -> None:
    """``--schedule auto``'s second pass: while time is left, a schedule whose search the time
    limit stopped with a lower bound below the fastest plan found (it might still beat it) is
    searched again, with all of that time and the fastest plan's step to beat, the one with the
    lowest bound first; its plan is replaced where the new one is faster."""
    from .plan.advise import advise_schedule

    retried: set[int] = set()
    while True:
        left = req.time_limit - (time.monotonic() - started)
        best = min((_step(a) for _, _, a, _ in plans), default=math.inf)
        open_ = [(a.plan.phases[0].bound, i) for i, (_, _, a, _) in enumerate(plans)
                 if i not in retried and a is not None and not a.slower and a.plan.status != "optimal"
                 and a.plan.phases and a.plan.phases[0].bound is not None
                 and a.plan.phases[0].bound < best * (1 - 1e-9)]
        if left < 2.0 or not open_:
            return
        _, i = min(open_)
        retried.add(i)
        kind, v, advice, _ = plans[i]
        M = ranked[i][3]
        trial = replace(req, schedule=kind, chunks_per_rank=v, micro_batches=M, time_limit=left)
        resolved = resolve(trial, analysis)
        events.start(f"solving {kind}, {v} chunk(s) per device, again with the time left")
        try:
            again = advise_schedule(resolved.model, resolved.inputs, table=table,
                                    cutoff=best if _step(advice) > best and math.isfinite(best) else None)
        except StagesplitError:
            continue
        finally:
            events.done()
        if again.slower and _step(again) >= _step(advice):
            advice.slower, advice.plan.message = True, again.plan.message
        elif _step(again) < _step(advice) or (_step(again) == _step(advice) and again.plan.status == "optimal"):
            plans[i] = (kind, v, again, "")


def sweep(profile: ProfileLike, devices: Iterable[int] | str, *, request: SolveRequest | None = None,
          events: Events | None = None, on_row: Callable | None = None, debug: str | Path | None = None,
          **options: Any):
    """Solve for each device count in ``devices`` (a range like ``range(1, 17)``, a list, or
    the command line's "1..16" / "2,4,8"), pricing every layer range once."""
    events = _events(events)
    if isinstance(devices, str):
        counts = device_counts(devices, MAX_DEVICES)
    elif isinstance(devices, Iterable) and not isinstance(devices, (bytes, Mapping)):
        counts = [integer("devices", n, 1, MAX_DEVICES) for n in devices]
    else:
        raise OptionError("devices", f"expected device counts (a list, a range or '1..16'), got {short_repr(devices)}")
    if not counts:
        raise OptionError("devices", "expected at least one device count")
    if on_row is not None and not callable(on_row):
        raise OptionError("on_row", f"expected a function of one row, got {short_repr(on_row)}")
    req = _request(max(counts), request, options)
    with _named_by(req):
        return _sweep(profile, req, counts, events, on_row, debug)


def _sweep(profile: ProfileLike, req: SolveRequest, counts: list[int], events: Events, on_row: Callable | None,
           debug: str | Path | None):
    """``sweep`` once its request is made."""
    from .plan.advise import sweep as sweep_counts
    if _variant_sources(profile) is not None:
        raise OptionError("profile", "profile variants are solved by solve (one device count at a time), not sweep: "
                          "sweep one variant, or solve the variants for each count")
    analysis = analyze(profile, layering=req.layering, shared=req.shared, debug=debug, events=events)
    resolved = resolve(req, analysis)
    scheduled = _scheduled(req, resolved.model)
    table = None if scheduled else _price(resolved, events, max_devices=max(counts))
    phases = _phase_table(resolved.model) if scheduled else None
    done: list = []

    events.start("solving", "device counts")

    def row_done(row) -> None:
        done.append(row)
        events.update(len(done), len(counts))
        if on_row is not None:
            on_row(row)

    result = sweep_counts(resolved.model, resolved.inputs, counts, table=table, on_row=row_done, phases=phases)
    events.done()
    for row in result:
        row.plan.analysis = resolved.model
    result.warnings = list(events.warnings)
    return result


@dataclass
class Reproduction:
    """``reproduce``'s answer: the plan recorded, the plan now, and whether they agree."""

    recorded: Any
    plan: Any
    identical: bool
    profile_matches: bool | None
    differences: list[str] = field(default_factory=list)

    def text(self, path: str) -> str:
        """One line per finding, as the command line prints them."""
        lines = []
        if self.profile_matches is False:
            lines.append(f"note: the profile's SHA-256 ({self.plan.profile.sha256[:12]}...) differs from the one "
                         f"recorded ({self.recorded.profile.sha256[:12]}...)")
        if self.identical:
            lines.insert(0, f"reproduced: the split is identical to {show(path)}'s {self.recorded.split_text}")
        else:
            lines.insert(0, f"differs from {show(path)}: recorded {self.recorded.split_text}, now {self.plan.split_text}")
        for a, b in zip(self.recorded.phases, self.plan.phases):
            if a.value != b.value or a.status != b.status:
                lines.append(f"  {a.quantity}: recorded {a.value} ({a.status}), now {b.value} ({b.status})")
        return "\n".join(lines)


def reproduce(plan_path: str | Path, profile: ProfileLike | None = None, *, events: Events | None = None,
              out: str | Path | None = None) -> Reproduction:
    """Run a plan's recorded request again on its profile (the recorded path unless
    ``profile`` is given) and compare the split and objective values."""
    from .plan.files import read_plan
    events = _events(events)
    plan_path = _path("plan_path", plan_path)
    if out is not None:
        _check_outputs([("out", _path("out", out), None)], [plan_path] + _profile_files(profile))
    recorded = read_plan(plan_path)
    if profile is None and recorded.variants:             # solved on profile variants: the same again
        from .io.variants import VariantSource
        missing = [v.name for v in recorded.variants if not v.path]
        if missing:
            raise StagesplitError(f"{show(plan_path)}: variants: the plan records no path for variant "
                                  f"{show(missing[0])}; give the profiles")
        profile = [VariantSource(_recorded_path(plan_path, v.path, f"variants[{i}].path"), v.proportion, v.name)
                   for i, v in enumerate(recorded.variants)]
        if out is not None:
            _check_outputs([("out", str(out), None)], [v.path for v in recorded.variants])
    if profile is None:
        profile = recorded.profile.path
        if not profile:
            raise StagesplitError(f"{show(plan_path)}: profile.path: the plan records no profile path; give the profile")
        profile = _recorded_path(plan_path, profile, "profile.path")
        if out is not None:                   # the plan's recorded profile is an input too
            _check_outputs([("out", str(out), None)], [profile])
    request = recorded.inputs.request
    if request.layer_compute_source:          # hashed for the new plan's record (its figures are in the plan)
        try:
            _recorded_path(plan_path, request.layer_compute_source, "request.layer_compute_source")
        except StagesplitError:
            events.warn(f"{show(plan_path)}: request.layer_compute_source '{show(request.layer_compute_source)}' "
                        "leads outside the current folder and the plan's: not read (the plan's layer compute "
                        "figures are used; the new plan records no layer-compute file)")
            request = request.overridden(layer_compute_source=None)
    plan = solve(profile, request=request, events=events)
    want, got = recorded.profile.sha256, plan.profile.sha256
    matches = None if not want or not got else want == got
    differences = []
    if matches is False:
        differences.append(f"profile SHA-256 {got[:12]}... differs from the recorded {want[:12]}...")
    old = [(s.first_layer, s.last_layer, s.device) for s in recorded.stages]
    new = [(s.first_layer, s.last_layer, s.device) for s in plan.stages]
    if recorded.layer_names != plan.layer_names:
        differences.append("the layers differ")
    if old != new:
        differences.append(f"split was {recorded.split_text}, now {plan.split_text}")
    for a, b in zip(recorded.phases, plan.phases):
        if a.value != b.value or a.status != b.status:
            differences.append(f"{a.quantity}: was {a.value} ({a.status}), now {b.value} ({b.status})")
    identical = old == new and recorded.layer_names == plan.layer_names
    return Reproduction(recorded, plan, identical, matches, differences)


def _recorded_path(plan_path: str, location: str, field_: str) -> str:
    """A file a plan records (its profile, a variant, the layer-compute file), checked before it
    is opened: a plan records the path as it was given to solve, relative to the folder solve ran
    in or absolute, so it must lead inside the current folder or the plan's own (a plan from
    someone else names no file elsewhere: ``../../etc/passwd`` is refused unopened)."""
    from .common.safeinput import confined_path
    from .errors import ProfileError
    try:
        return confined_path(location, Path("."), plan_path, field_, "a file", within="the current folder",
                             absolute=True, also=((Path(plan_path).parent, "the plan's folder"),))
    except ProfileError as exc:
        raise StagesplitError(f"{exc}; give the profile after the plan (stagesplit solve --from-plan PLAN "
                              "PROFILE) if it is the one you mean") from None


# -- looking at a profile -----------------------------------------------------------------------

def _model(profile: ProfileLike, layering, shared, layer_compute, debug, events):
    model = analyze(profile, layering=layering, shared=shared, debug=debug, events=events).model
    compute = _layer_compute(layer_compute)
    return model.with_compute(compute, "layer_compute") if compute else copy.copy(model)


def breakdown(profile: ProfileLike, *, target: str | Target | None = None, efficiency: float = 1.0,
              layering: LayerOptions | None = None, shared: str | SharedPolicy = "every",
              layer_compute: Mapping[str, float] | None = None, debug: str | Path | None = None,
              events: Events | None = None):
    """Where the profile's memory and compute go (``Breakdown``: tables and DataFrames)."""
    from .model.roofline import apply_roofline
    from .reporting.breakdown import Breakdown
    events = _events(events)
    efficiency = number("efficiency", efficiency, 0, 1, low_open=True)
    target = _target("target", target)
    model = _model(profile, layering, shared, layer_compute, debug, events)
    apply_roofline(model, target, efficiency)
    return Breakdown.of(model)


def diagnose(profile: ProfileLike, *, plan: Any = None, layers: str | tuple[str, str] | None = None, top: int = 10,
             window: int = 5, layering: LayerOptions | None = None, shared: str | SharedPolicy = "every",
             layer_compute: Mapping[str, float] | None = None, debug: str | Path | None = None,
             events: Events | None = None):
    """The bottleneck tile and step of each stage of ``plan`` (a ``Plan`` or a plan file), or of
    one stage holding ``layers`` ("FIRST:LAST" or a pair of names), or of the whole profile;
    the variables live there, and how well the operations were grouped into layers."""
    from .plan.files import read_plan
    from .plan.records import Plan
    from .reporting.diagnosis import diagnose as diagnose_model
    events = _events(events)
    top, window = integer("top", top, 1), integer("window", window, 0)
    if plan is not None and layers is not None:
        raise OptionError("plan", "give plan or layers, not both")
    if plan is not None and not isinstance(plan, (Plan, str, Path)):
        raise OptionError("plan", f"expected a Plan or a plan file path, got {type(plan).__name__}")
    if layers is not None and not (isinstance(layers, str) or (isinstance(layers, (tuple, list)) and len(layers) == 2
                                                                and all(isinstance(x, str) for x in layers))):
        raise OptionError("layers", f"expected 'FIRST:LAST' or a pair of layer names, got {short_repr(layers)}")
    model = _model(profile, layering, shared, layer_compute, debug, events)
    names = model.layers.names
    stages = None
    if plan is not None:
        where = "plan" if isinstance(plan, Plan) else str(plan)
        plan = plan if isinstance(plan, Plan) else read_plan(plan)
        if plan.layer_names != names:
            made_for = plan.profile.name or plan.profile.path or "another profile"
            raise StagesplitError(f"{show(where)}: the plan was made for {show(made_for)} with {len(plan.layer_names)} "
                                  f"layers ({show(', '.join(plan.layer_names[:4]))}...), but this profile "
                                  f"({show(model.profile.info.name or 'unnamed')}) has {len(names)} "
                                  f"({show(', '.join(names[:4]))}...): diagnose the plan with the profile and layer "
                                  "options it was solved with")
        ours = model.profile.info.sha256
        if plan.profile.sha256 and ours and plan.profile.sha256 != ours:
            events.warn(f"{show(where)} was made for {show(plan.profile.name or plan.profile.path or 'a profile')} "
                        f"(SHA-256 {plan.profile.sha256[:12]}...), not this file (SHA-256 {ours[:12]}...): the layers "
                        "have the same names, so its split is diagnosed on this profile's figures")
        stages = [(s.first_layer, s.last_layer, s.in_flight, s.capacity_bytes or None) for s in plan.stages]
        if not stages:
            raise StagesplitError(f"{show(where)}: the plan has no stages (no split fitted)")
    elif layers is not None:
        first, sep, last = layers.partition(":") if isinstance(layers, str) else (layers[0], ":", layers[1])
        index = {name: i for i, name in enumerate(names)}
        if not sep or first not in index or last not in index or index[first] > index[last]:
            raise OptionError("layers", f"expected FIRST:LAST with layer names in order (layers: {', '.join(names)}), "
                              f"got '{show(str(layers))}'")
        stages = [(index[first], index[last], 1, None)]
    result = diagnose_model(model, stages, top=top, window=window)
    result.model = model
    return result


# -- reading, converting, capturing, writing ----------------------------------------------------

def convert(profile: str | Path, output: str | Path, *, debug: str | Path | None = None,
            events: Events | None = None) -> Profile:
    """Read a profile (e.g. ``profile.pop`` + ``debug.cbor``) and write it as JSON or compact form."""
    from .io import load_profile, save_profile
    events = _events(events)
    source, output = _path("profile", profile), _path("output", output)
    _check_outputs([("output", output, None)], [source, _path("debug", debug, optional=True)])
    events.start(f"reading {show(source)}")
    loaded = load_profile(source, debug, events.update)
    events.done()
    for message in loaded.info.warnings:
        events.warn(message)
    events.start(f"writing {show(output)}")
    save_profile(loaded, output)
    events.done()
    return loaded


def import_onnx(model: str | Path, output: str | Path | None = None, *, target: str | Target = "a100-80gb",
                batch: int | None = None, dims: Mapping[str, int] | None = None, training: str = "adam",
                dtype: str | None = None, name: str | None = None, layering: LayerOptions | None = None,
                events: Events | None = None):
    """Import an ONNX model as a profile on ``target`` (``OnnxImport``: the profile and per-node
    figures), written to ``output`` when given. With ``layering``, each operation's layer is
    stored in the profile so later commands need no grouping options."""
    from .io import save_profile
    from .io.onnximport import import_onnx as read_onnx
    from .layers import group_layers
    events = _events(events)
    source = _path("model", model)
    output = _path("output", output, optional=True)
    if output is not None:
        _check_outputs([("output", output, None)], [source])
    target = _target("target", target)
    batch = integer("batch", batch, 1, 2**40, optional=True)
    if dims is not None and not isinstance(dims, Mapping):
        raise OptionError("dims", f"expected a mapping of dimension names to sizes, got {short_repr(dims)}")
    dims = {str(k): integer("dims", v, 1, 2**40) for k, v in (dims or {}).items()}
    if name is not None and not isinstance(name, str):
        raise OptionError("name", f"expected a string, got {short_repr(name)}")
    layering = _layering(layering)
    events.start(f"reading {show(source)}")
    result = read_onnx(source, target, batch=batch, dims=dims, training=training, dtype=dtype, name=name)
    events.done()
    if output is not None:                    # the model's external data files are inputs too
        _check_outputs([("output", output, None)], result.external_files)
    events.start(f"grouping {len(result.profile.operations):,} operations into layers")
    layers = group_layers(result.profile, layering)
    events.done()
    if layering is not None and layering != LayerOptions():     # explicit grouping: stored with the operations
        result.profile.operations.layer = [layers.names[lay] if lay >= 0 else None for lay in layers.op_layer]
    result.layers = list(layers.names)
    for message in result.warnings:
        events.warn(message)
    if output is not None:
        events.start(f"writing {show(output)}")
        save_profile(result.profile, output)
        events.done()
    return result


def capture(model: str, output: str | Path | None = None, *, events: Events | None = None, **options: Any) -> Profile:
    """Capture one training step of the model the factory ``model`` names
    (``path/to/file.py:function`` or ``package.module:function``) on CPU under fake tensors
    (see ``stagesplit.capturing.pytorch``), written to ``output`` when given."""
    from .io import save_profile
    from .capturing.pytorch import capture as capture_step
    events = _events(events)
    if not isinstance(model, str):
        raise OptionError("model", f"expected 'path/to/file.py:function' or 'package.module:function', "
                          f"got {short_repr(model)}")
    output = _path("output", output, optional=True)
    if output is not None:
        where = model.rpartition(":")[0]
        _check_outputs([("output", output, None)], [where if where.endswith(".py") else None])
    events.start("importing torch")
    try:
        import torch  # noqa: F401  (the longest part of a capture on a cold start: a phase of its own)
    except ImportError:
        pass                                  # capture_step says how to install it
    events.start(f"capturing one training step of {show(model)}")
    profile = capture_step(model, **options)
    events.done()
    for message in profile.info.warnings:
        events.warn(message)
    if output is not None:
        events.start(f"writing {show(output)}")
        save_profile(profile, output)
        events.done()
    return profile


def synthesize(family: str, output: str | Path | None = None, *, target: str | Target = "ipu-mk2", seed: int = 0,
               layers: int | None = None, piece_bytes: int | None = None, programs_per_op: int | None = None,
               events: Events | None = None) -> Profile:
    """A synthetic profile (labelled synthetic) of ``family`` (bert-base, bert-large, gpt, cnn)."""
    from .io import COMPACT_SUFFIXES, save_profile
    from .io.synth import FAMILIES, synthesize as make, write_synthetic
    events = _events(events)
    if family not in FAMILIES:
        raise OptionError("family", f"expected one of {', '.join(FAMILIES)}, got {short_repr(family)}")
    output = _path("output", output, optional=True)
    target = _target("target", target)
    seed = integer("seed", seed, 0, 2**32 - 1)
    params = {}
    if layers is not None:
        if family not in ("bert-base", "gpt"):
            raise OptionError("layers", f"applies to bert-base and gpt, not {family}")
        params["layers"] = integer("layers", layers, 1, 10_000)
    piece_bytes = integer("piece_bytes", piece_bytes, 1, 2**40, optional=True)
    programs_per_op = integer("programs_per_op", programs_per_op, 1, 1000, optional=True)
    options = dict(seed=seed, piece_bytes=piece_bytes, programs_per_op=programs_per_op, **params)
    events.start(f"synthesizing {family}")
    if output is not None and Path(output).suffix in COMPACT_SUFFIXES:    # streamed: bounded memory at any size
        profile = write_synthetic(output, family, target, **options)
    else:
        profile = make(family, target, **options)
        if output is not None:
            events.start(f"writing {show(output)}")
            save_profile(profile, output)
    events.done()
    return profile


def export(plan: Any, fmt: str, output: str | Path | None = None, *, training: bool = True,
           model: str = "model") -> str:
    """The plan's split in a training framework's own form (``stagesplit.exporters.FORMATS``);
    ``plan`` is a ``Plan`` or a plan file. Written to ``output`` (atomically) when given."""
    from .common.fileio import atomic_write_text
    from .plan.files import read_plan
    from .plan.records import Plan
    from .exporters import export_plan
    source = None
    if isinstance(plan, (str, Path)):
        source = str(plan)
        if output is not None:
            _check_outputs([("output", _path("output", output), None)], [source])
        plan = read_plan(plan)
    elif not isinstance(plan, Plan):
        raise OptionError("plan", f"expected a Plan or a plan file path, got {type(plan).__name__}")
    if not isinstance(training, bool):
        raise OptionError("training", f"expected true or false, got {short_repr(training)}")
    text = export_plan(plan, fmt, source=source, training=training, model=model)
    if output is not None:
        atomic_write_text(_path("output", output), text)
    return text


#: ``report`` solves the plan's request again on the profile (for the frameworks' splits to
#: compare with) only up to this many devices: beyond, the search can take minutes (2,000 layers
#: on 1,024 devices: over one), so the page is drawn from the cost model alone and says so
REPORT_RESOLVE_DEVICES = 64


def _plan_with_model(plan: Any, profile: ProfileLike | None, events: Events, parameter: str = "plan"):
    """A Plan (read from a file if given a path), with the cost model it was solved on and the
    frameworks' splits to compare with: from ``profile`` when given (the recorded request
    solved again on it, which must have the plan's layers; past ``REPORT_RESOLVE_DEVICES``
    devices the cost model alone, with a warning), else what a plan in memory holds. A
    profile whose bytes differ from the ones the plan records (its SHA-256) is warned of."""
    from .plan.build import plan_profile
    from .plan.files import read_plan
    from .plan.records import Plan
    where = None
    if isinstance(plan, (str, Path)):
        where = str(plan)
        plan = read_plan(plan)
    elif not isinstance(plan, Plan):
        raise OptionError(parameter, f"expected a Plan or a plan file path, got {type(plan).__name__}")
    if profile is None:
        return plan
    variants = _variant_sources(profile)
    if plan.variants and variants is None:
        raise StagesplitError(f"{show(where or 'plan')}: the plan was solved on {len(plan.variants)} profile "
                              "variants: give them as the profile (a variants file, or a list of them)")
    if plan.devices > REPORT_RESOLVE_DEVICES and variants is None:
        request = plan.inputs.request
        analysis = analyze(profile, layering=request.layering, shared=request.shared, events=events)
        model = resolve(request, analysis).model
        fresh = copy.copy(plan)
        fresh.layer_names, fresh.profile = list(analysis.layers.names), plan_profile(model)
        fresh.analysis, fresh.baselines, fresh.variant_models = model, [], {}
        events.warn(f"{show(where or 'plan')}: devices: {plan.devices:,} devices, more than the "
                    f"{REPORT_RESOLVE_DEVICES} a report solves the request again for: the page compares the plan "
                    "with no other split")
    else:
        fresh = solve(profile, request=plan.inputs.request.overridden(compare=True), events=events)
    if fresh.layer_names != plan.layer_names:
        made_for = plan.profile.name or plan.profile.path or "another profile"
        raise StagesplitError(f"{show(where or 'plan')}: the plan was made for {show(made_for)} with "
                              f"{len(plan.layer_names)} layers, but {show(str(profile))} has {len(fresh.layer_names)}: "
                              "give the profile the plan was solved on")
    _warn_other_bytes(where, plan, fresh, profile, events)
    plan = copy.copy(plan)
    plan.analysis, plan.baselines, plan.variant_models = fresh.analysis, fresh.baselines, fresh.variant_models
    return plan


def _warn_other_bytes(where: str | None, plan, fresh, profile: ProfileLike, events: Events) -> None:
    """One warning per profile whose SHA-256 differs from the one the plan records: the same
    layers, other figures (the page draws the plan's numbers beside the other profile's)."""
    pairs = [(plan.profile.sha256, fresh.profile.sha256, profile if isinstance(profile, (str, Path)) else None)]
    if plan.variants:
        pairs = [(a.sha256, b.sha256, b.path or b.name) for a, b in zip(plan.variants, fresh.variants)]
    for recorded, now, name in pairs:
        if recorded and now and recorded != now:
            events.warn(f"{show(str(name or 'the profile given'))} is not the profile {show(where or 'the plan')} was solved "
                        f"on: its SHA-256 is {now[:12]}..., the plan records {recorded[:12]}...; the page mixes the "
                        "plan's figures with this profile's")


def report(plan: Any, output: str | Path, profile: ProfileLike | None = None, *, events: Events | None = None) -> str:
    """Write ``plan`` (a ``Plan`` or a plan file) as one self-contained HTML page to ``output``:
    the split and why, memory by stage, the schedule per rank, the layers, the comparison with
    the frameworks' defaults and the export snippets. ``profile`` (the one the plan was solved
    on) adds the why, the per-layer figures and the comparison to a plan read from a file.
    Returns the path written."""
    from .reporting.html import write_report
    events = _events(events)
    output = _path("output", output)
    inputs = [str(plan) if isinstance(plan, (str, Path)) else None] + _profile_files(profile)
    _check_outputs([("output", output, None)], inputs)
    plan = _plan_with_model(plan, profile, events)
    events.start(f"writing {show(output)}")
    write_report(plan, output)
    events.done()
    return output


def plot(plan: Any, profile: ProfileLike | None = None):
    """The plan as a matplotlib Figure (``Plan.plot()``): memory by stage and category against
    capacity, on an IPU the stages' tiles, and each stage's time."""
    from .reporting.plot import plan_figure
    plan = _plan_with_model(plan, profile, Events())
    tiles = None
    if plan.analysis is not None and not plan.profile.one_tile:
        tiles = [plan.stage_model(s).stage_memory(s.first_layer, s.last_layer).total(s.in_flight) for s in plan.stages]
    return plan_figure(plan, tiles)


def targets() -> dict[str, Target]:
    """The shipped device targets by name (configs/targets.yaml)."""
    from .io.targets import known_targets
    return known_targets()
