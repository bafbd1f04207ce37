"""The front door: every command as one Python call taking names, as the command line does.

    plan = stagesplit.solve("profiles/bert-base.stagesplit", devices=4, schedule="1f1b")

``solve``, ``sweep``, ``breakdown`` and ``analyze`` accept a profile path, a loaded ``Profile``
or an ``Analysis`` (profile, layers and cost model, reusable across calls). Options are the
fields of ``options.SolveRequest``; errors are ``StagesplitError``s naming the parameter.
The command line parses its flags into the same request and renders what these return.
"""

from __future__ import annotations

import copy
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .model.analysis import Analysis
from .errors import OptionError, StagesplitError
from .layers import LayerOptions
from .solver.request import SolveRequest
from .io.profile import Profile, Target


def analyze(profile: str | Path | Profile | Analysis, *, layering: LayerOptions | None = None,
            shared: str = "every", debug: str | Path | None = None,
            progress: Callable[[int, int], None] | None = None) -> Analysis:
    """The profile (read from a path if given one), its layers and its cost model."""
    from .io import load_profile
    if isinstance(profile, Analysis):
        if (layering is None or layering == profile.layers.options) and profile.model.shared == str(_value(shared)):
            return profile
        profile = profile.profile
    if isinstance(profile, (str, Path)):
        profile = load_profile(profile, debug, progress)
    elif not isinstance(profile, Profile):
        raise OptionError("profile", f"expected a path, a Profile or an Analysis, got {type(profile).__name__}")
    return Analysis.of(profile, layering, str(_value(shared)))


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def make_request(devices: int | None = None, request: SolveRequest | None = None, **options: Any) -> SolveRequest:
    """A ``SolveRequest`` from keyword options (``target=`` is accepted for one target)."""
    if "target" in options:
        if "targets" in options:
            raise OptionError("target", "give target or targets, not both")
        options["targets"] = options.pop("target")
    if request is not None:
        changes = dict(options)
        if devices is not None:
            changes["devices"] = devices
        return replace(request, **changes) if changes else request
    if devices is None:
        raise OptionError("devices", "expected the number of devices")
    try:
        return SolveRequest(devices=devices, **options)
    except TypeError as exc:              # an unknown keyword: name it, as a parameter error
        raise OptionError(str(exc).rsplit(" ", 1)[-1].strip("'"), "not an option of solve") from None


@dataclass
class Resolved:
    """A request resolved against an analysis: solver options in indices and integers, the
    targets it names, and the cost model with its compute on those targets."""

    request: SolveRequest
    analysis: Analysis
    model: Any
    options: Any
    targets: list[Target]
    target_names: list[str]


def resolve(request: SolveRequest, analysis: Analysis) -> Resolved:
    """Check ``request`` against the profile's layers and targets; names become indices."""
    from .io.targets import load_target
    from .solver.problem import SolveOptions, resolve_micro_batches
    from .model.roofline import apply_roofline
    profile = analysis.profile
    names = analysis.layers.names
    index = {name: i for i, name in enumerate(names)}

    def layer(name: str, parameter: str) -> int:
        if name not in index:
            from .common.safeinput import show
            raise OptionError(parameter, f"no layer named '{show(name)}' (layers: {', '.join(names)})")
        return index[name]

    targets = [load_target(t) if isinstance(t, str) else t for t in request.targets]
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
    target_names = [t.name for t in targets] or [profile.target.name] * request.devices
    link = request.link_bandwidth or (targets[0].link_bytes_per_s if targets else None) or \
        profile.target.link_bytes_per_s
    micro_batches, micro_auto = resolve_micro_batches(request.schedule.value, request.micro_batches, request.devices)
    options = SolveOptions(
        devices=request.devices, objective=request.objective.value, exact=request.exact,
        schedule=request.schedule.value, micro_batches=micro_batches, micro_batches_auto=micro_auto,
        headroom=request.headroom, capacities=capacities, reserve=request.reserve, min_layers=request.min_layers,
        max_layers=request.max_layers, pinned_splits=tuple(sorted({layer(x, "pin_splits") for x in request.pin_splits})),
        pinned_layers=tuple((layer(n, "pin_layers"), p) for n, p in request.pin_layers),
        communication=request.communication, link_bytes_per_s=link, time_limit=request.time_limit,
        workers=request.workers)
    options.check(len(names))
    model = analysis.model
    if request.layer_compute:
        model = model.with_compute(dict(request.layer_compute), request.layer_compute_source or "layer_compute")
    else:
        model = copy.copy(model)                      # the roofline below is attached to this copy only
    apply_roofline(model, targets[0] if targets else None, request.efficiency)
    return Resolved(request, analysis, model, options, targets, target_names)


@dataclass
class Solved:
    """What ``solve_request`` returns: the plan, the greedy/uniform baselines (``compare``),
    warnings for the user, and what it was solved from."""

    plan: Any
    baselines: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    resolved: Resolved | None = None
    table: Any = None


def price(resolved: Resolved, max_devices: int | None = None, progress: Callable[[int, int], None] | None = None):
    """Every layer range priced once, for every in-flight count the request can need."""
    from .solver.advise import price as price_ranges
    return price_ranges(resolved.model, resolved.options, max_devices=max_devices, progress=progress)


def solve_request(profile: str | Path | Profile | Analysis, request: SolveRequest, *, table=None,
                  progress: Callable[[int, int], None] | None = None,
                  log: Callable[[str], None] | None = None) -> Solved:
    """Solve ``request`` on ``profile`` and describe the result (see ``solve``)."""
    from .solver.advise import advise
    analysis = analyze(profile, layering=request.layering, shared=request.shared.value)
    resolved = resolve(request, analysis)
    if table is None:
        table = price(resolved, progress=progress)
    advice = advise(resolved.model, resolved.options, table=table, compare=request.compare,
                    target_names=resolved.target_names, log=log, unlayered_first=request.unlayered_first,
                    profile_path=_path_of(profile))
    for plan in [advice.plan] + advice.baselines:
        record_request(plan, request, resolved.targets or [analysis.profile.target])
    return Solved(advice.plan, advice.baselines, list(analysis.profile.info.warnings) + list(analysis.layers.warnings)
                  + advice.warnings, resolved, table)


def solve(profile: str | Path | Profile | Analysis, devices: int | None = None, *,
          request: SolveRequest | None = None, **options: Any):
    """Split ``profile`` into pipeline stages for ``devices`` devices and return the ``Plan``.

    Options (see ``SolveRequest``): ``target``/``targets``, ``objective`` ("compute", "memory",
    "devices"), ``exact``, ``schedule`` ("none", "1f1b", "gpipe"), ``micro_batches``,
    ``headroom``, ``reserve``, ``min_layers``, ``max_layers``, ``pin_splits`` (layer names),
    ``pin_layers`` ({layer name: device position}), ``communication``, ``link_bandwidth``,
    ``efficiency``, ``shared``, ``layer_compute`` ({layer name: compute}), ``layering``,
    ``time_limit``, ``workers``, ``compare``. With ``compare``, ``plan.baselines`` holds the
    greedy and uniform plans. ``plan.warnings`` lists what the command line would print.
    """
    solved = solve_request(profile, make_request(devices, request, **options))
    solved.plan.baselines = solved.baselines
    solved.plan.warnings = solved.warnings
    return solved.plan


def sweep(profile: str | Path | Profile | Analysis, devices: Iterable[int] | str, *,
          request: SolveRequest | None = None, on_row: Callable | None = None,
          progress: Callable[[int, int], None] | None = None, **options: Any):
    """Solve for each device count in ``devices`` (a range like ``range(1, 17)``, a list, or
    the command line's "1..16" / "2,4,8"), pricing every layer range once."""
    from .solver.advise import sweep as sweep_counts
    from .common.guards import device_counts
    from .common.safeinput import MAX_DEVICES
    counts = device_counts(devices, MAX_DEVICES) if isinstance(devices, str) else [int(n) for n in devices]
    if not counts:
        raise OptionError("devices", "expected at least one device count")
    req = make_request(max(counts), request, **options)
    analysis = analyze(profile, layering=req.layering, shared=req.shared.value)
    resolved = resolve(req, analysis)
    table = price(resolved, max_devices=max(counts), progress=progress)
    result = sweep_counts(resolved.model, resolved.options, counts, table=table, profile_path=_path_of(profile),
                          target_names=resolved.target_names, on_row=on_row)
    for row in result:
        record_request(row.plan, req.with_devices(row.devices), resolved.targets or [analysis.profile.target])
    return result


def breakdown(profile: str | Path | Profile | Analysis, *, target: str | Target | None = None,
              efficiency: float = 1.0, layering: LayerOptions | None = None, shared: str = "every",
              layer_compute: Mapping[str, float] | None = None):
    """Where the profile's memory and compute go (``Breakdown``: tables and DataFrames)."""
    from .reporting.breakdown import Breakdown
    from .io.targets import load_target
    from .solver.request import _number
    from .model.roofline import apply_roofline
    analysis = analyze(profile, layering=layering, shared=shared)
    model = analysis.model.with_compute(dict(layer_compute), "layer_compute") if layer_compute else \
        copy.copy(analysis.model)
    apply_roofline(model, load_target(target) if isinstance(target, str) else target,
                   _number("efficiency", efficiency, 0, 1, low_open=True))
    return Breakdown.of(model)


def diagnose(profile: Any, *, plan: Any = None, layers: str | tuple[str, str] | None = None, top: int = 10,
             window: int = 5, layering: LayerOptions | None = None, shared: str = "every",
             layer_compute: Mapping[str, float] | None = None):
    """The bottleneck tile and step of each stage of ``plan`` (a ``Plan`` or a plan file), or of
    one stage holding ``layers`` ("FIRST:LAST" or a pair of names), or of the whole profile;
    the variables live there, and how well the operations were grouped into layers."""
    from .model.costmodel import StageCostModel
    from .reporting.diagnosis import diagnose as diagnose_model
    from .common.safeinput import show
    if isinstance(profile, StageCostModel):
        model = profile
    else:
        model = analyze(profile, layering=layering, shared=shared).model
    if layer_compute:
        model = model.with_compute(dict(layer_compute), "layer_compute")
    names = model.layers.names
    if plan is not None and layers is not None:
        raise OptionError("plan", "give plan or layers, not both")
    stages = None
    if plan is not None:
        from .plan.records import Plan, read_plan
        where = "plan" if isinstance(plan, Plan) else str(plan)
        plan = plan if isinstance(plan, Plan) else read_plan(plan)
        if plan.layer_names != names:
            raise StagesplitError(f"{show(where)}: the plan's layers ({', '.join(plan.layer_names[:6])}...) are not this "
                                  f"profile's ({', '.join(names[:6])}...): use the same profile and layer options")
        stages = [(s.first_layer, s.last_layer, s.in_flight, s.capacity_bytes or None) for s in plan.stages]
        if not stages:
            raise StagesplitError(f"{show(where)}: the plan has no stages (no split fitted)")
    elif layers is not None:
        first, sep, last = layers.partition(":") if isinstance(layers, str) else (*layers[:1], ":", *layers[1:2])
        index = {name: i for i, name in enumerate(names)}
        if not sep or first not in index or last not in index or index[first] > index[last]:
            raise OptionError("layers", f"expected FIRST:LAST with layer names in order (layers: {', '.join(names)}), "
                              f"got '{show(str(layers))}'")
        stages = [(index[first], index[last], 1, None)]
    from .solver.request import _integer
    return diagnose_model(model, stages, top=_integer("top", top, 1), window=_integer("window", window, 0))


def record_request(plan, request: SolveRequest, targets: list[Target] | None = None) -> None:
    """Record in the plan everything needed to run it again (``solve --from-plan``): the
    request, the devices' targets in full, the layer-compute file's hash, and versions."""
    from .solver.request import _target_record
    record = request.to_record()
    if targets:
        record["resolved_targets"] = [_target_record(t) for t in targets]
    if request.layer_compute_source and Path(request.layer_compute_source).is_file():
        from .common.fileio import file_sha256
        record["layer_compute_sha256"] = file_sha256(request.layer_compute_source)
    plan.inputs["request"] = record
    plan.run["versions"] = versions()


def versions() -> dict[str, str]:
    """Versions of stagesplit and what its answers depend on."""
    from importlib import metadata
    from . import __version__
    out = {"stagesplit": __version__, "python": platform.python_version()}
    for package in ("numpy", "ortools"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


@dataclass
class Reproduction:
    """``reproduce``'s answer: the plan recorded, the plan now, and whether they agree."""

    recorded: Any
    plan: Any
    identical: bool
    profile_matches: bool | None
    differences: list[str]


def reproduce(plan_path: str | Path, profile: str | Path | Profile | Analysis | None = None) -> Reproduction:
    """Run a plan's recorded request again on its profile (the recorded path unless
    ``profile`` is given) and compare the split and objective values."""
    from .plan.records import read_plan
    recorded = read_plan(plan_path)
    record = recorded.inputs.get("request")
    if not isinstance(record, dict):
        raise StagesplitError(f"{plan_path}: the plan has no recorded request (inputs.request): it was written by "
                              "an older stagesplit; solve again to record one")
    request = SolveRequest.from_record(record, str(plan_path))
    if profile is None:
        profile = recorded.profile.get("path")
        if not profile:
            raise StagesplitError(f"{plan_path}: the plan records no profile path: give the profile")
    solved = solve_request(profile, request)
    plan = solved.plan
    plan.baselines, plan.warnings = solved.baselines, solved.warnings
    want, got = recorded.profile.get("sha256"), plan.profile.get("sha256")
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


def _path_of(profile: Any) -> str | None:
    return str(profile) if isinstance(profile, (str, Path)) else None
