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

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, cast, overload

from .common.deadline import Deadline
from .common.events import Events
from .common.guards import check_outputs as _check_paths, device_counts as _device_counts, gpu_counts as _gpu_counts
from .common.layering import (
    DEFAULT_CALL_REGEX,
    DEFAULT_FIRST_LAYER_REGEX,
    DEFAULT_LAST_LAYER_REGEX,
    DEFAULT_LAYER_REGEX,
)
from .common.limits import MAX_DEVICES, MAX_GPUS
from .common.text import short_repr, show
from .common.validate import choice, integer, number
from .common.versions import VERSION
from .errors import OptionError, StagesplitError
from .solver.options import SCHEDULE_NAMES, SOLVE_OPTIONS, option_named as solve_option

if TYPE_CHECKING:      # imported where used: the command line imports this module to build its parser
    from .common.layerfigures import LayerFigure
    from .io.profile import Profile, Target
    from .io.variants import ParallelVariants, VariantSource
    from .layers import LayerOptions
    from .model.analysis import Analysis
    from .model.datasharding import DataLayout
    from .solver.request import SharedPolicy, SolveRequest

    # a profile, its path, an analysis, or profile variants (a variants file's path, or the sources);
    # the layout search and breakdown also take one rank's profile at each tensor-parallel degree
    ProfileLike = str | Path | Profile | Analysis | Sequence[VariantSource] | ParallelVariants


#: the layer grouping's default patterns (``LayerOptions``'s fields), for the command line's help
LAYER_DEFAULTS = {"layer_regex": DEFAULT_LAYER_REGEX, "first_layer_regex": DEFAULT_FIRST_LAYER_REGEX,
                  "last_layer_regex": DEFAULT_LAST_LAYER_REGEX, "call_regex": DEFAULT_CALL_REGEX}

__all__ = ["Events", "LAYER_DEFAULTS", "Reproduction", "SCHEDULE_NAMES", "SOLVE_OPTIONS", "VERSION", "analyze",
           "breakdown", "capture", "convert", "diagnose", "export", "export_formats", "import_onnx", "layer_options",
           "layout_comparison", "layout_sweep", "layouts", "load_layer_compute", "plot", "report", "reproduce", "solve",
           "solve_option", "solve_request", "sweep",
           "synthesize", "targets", "capture_inputs", "check_outputs", "device_counts", "gpu_counts", "is_variant_word",
           "is_variants_file", "plan_document", "profile_variants", "target", "write_plan", "write_text"]


def _check_outputs(outputs, inputs) -> None:
    """Every output checked against every file the command reads (``guards.check_outputs``),
    the profiles and debug files a variants file lists included (``io.variants.input_files``):
    the one check every command with an output goes through."""
    from .io.variants import input_files
    if not any(path for _, path, _ in outputs):        # nothing to write: no variants file read for it
        return
    _check_paths(outputs, input_files(inputs))


def check_outputs(outputs: Iterable[tuple[str, str | None, tuple[str, ...] | None]],
                  inputs: Iterable[str | Path | None]) -> None:
    """Refuse, before anything is read or written, an output (name, path, allowed suffixes or
    None) that cannot be written or is also one of ``inputs`` (common/guards.py); a variants
    file among the inputs adds the files it lists."""
    _check_outputs(list(outputs), list(inputs))


def capture_inputs(model: str | None) -> list[str]:
    """The source files a ``capture`` model (``file.py:function`` or ``package.module:function``)
    names, found without running anything."""
    from .common.guards import capture_inputs as find
    return find(model)


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


@overload
def _path(parameter: str, value: Any, *, optional: Literal[False] = False) -> str: ...
@overload
def _path(parameter: str, value: Any, *, optional: bool) -> str | None: ...
def _path(parameter: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, (str, Path)) or not str(value):
        raise OptionError(parameter, f"expected a file path, got {short_repr(value)}")
    return str(value)


def _layering(value: Any) -> LayerOptions | None:
    from .layers import LayerOptions
    if value is not None and not isinstance(value, LayerOptions):
        raise OptionError("layering", f"expected a LayerOptions, got {type(value).__name__}")
    return value


@overload
def _target(parameter: str, value: None) -> None: ...
@overload
def _target(parameter: str, value: str | Target) -> Target: ...
@overload
def _target(parameter: str, value: Any) -> Target | None: ...
def _target(parameter: str, value: Any) -> Target | None:
    from .io.profile import Target
    from .io.targets import load_target
    if value is None or isinstance(value, Target):
        return value
    if isinstance(value, str):
        return load_target(value)
    raise OptionError(parameter, f"expected a target name, a YAML path or a Target, got {short_repr(value)}")


def _layer_compute(value: Any, parameter: str = "layer_compute") -> dict[str, LayerFigure]:
    from .common.layerfigures import read_layer_figure
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise OptionError(parameter, f"expected a mapping of layer names to compute figures, "
                          f"got {short_repr(value)}")

    def check(field: str, value: Any) -> float:
        try:
            return number(parameter, value, 0, 1e30)
        except OptionError as exc:
            raise OptionError(parameter, exc.detail, subject=field) from None

    def refuse(field: str, expected: str, got: Any) -> NoReturn:
        raise OptionError(parameter, f"expected {expected}, got {got}", subject=field)
    return {str(k): read_layer_figure(v, f"[{str(k)!r}]", check, refuse)
            for k, v in value.items()}


# -- analysis -----------------------------------------------------------------------------------

def analyze(profile: ProfileLike, *, layering: LayerOptions | None = None, shared: str | SharedPolicy = "every",
            debug: str | Path | None = None, events: Events | None = None,
            layout: DataLayout | None = None) -> Analysis:
    """The profile (read from a path if given one), its layers and its cost model. Warnings of
    the profile and of the grouping go to ``events``. ``layout``: data parallelism
    (model/datasharding.py): the cost model is then one data-parallel rank's, its profile that
    rank's (``shard_profile``), so that every schedule, recompute and the solver see its figures."""
    from .io import load_profile
    from .io.profile import Profile
    from .model.analysis import Analysis
    from .solver.request import SharedPolicy
    events = _events(events)
    layering = _layering(layering)
    shared = choice(SharedPolicy, "shared", shared)
    if isinstance(profile, Analysis):
        if (layering is None or layering == profile.layers.options) and profile.model.shared == shared.value \
                and (layout is None or not layout.sharded) and profile.layout is None:
            return profile
        profile = profile.source if profile.source is not None else profile.profile
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
    source = None
    if layout is not None and layout.sharded:
        from .model.datasharding import shard_profile
        events.start(f"sharding for {layout.dp} data-parallel ranks (ZeRO {layout.zero})")
        source, profile = profile, shard_profile(profile, layers, layout)
    events.start(f"building the cost model ({len(layers.names):,} layers, {len(profile.variables):,} variables)")
    kept = None
    if source is not None:
        from .model.datasharding import kept_unsharded
        kept = kept_unsharded(source, layers, layout)
    analysis = Analysis(profile, layers, StageCostModel(profile, layers, shared=shared.value, kept_unsharded=kept),
                        layout=layout if source is not None else None, source=source)
    events.done()
    for message in list(profile.info.warnings) + list(analysis.layers.warnings):
        events.warn(message)
    return analysis


def _request(devices: Any, request: SolveRequest | None, options: dict[str, Any]) -> SolveRequest:
    """A ``SolveRequest`` from keyword options (``target=`` is accepted for one target)."""
    from .solver.request import SolveRequest
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


def solve_request(settings: str | Path | None, devices: int, **options: Any) -> SolveRequest:
    """The request a solve command makes: the values of a solver settings file (configs/solver.yaml
    where ``settings`` is None), ``options`` that are not None winning; a bad value is named by
    the file and field that gave it, else by its parameter."""
    from .solver.request import SolveRequest
    return SolveRequest.from_settings(settings, devices, **options)


def layer_options(**fields: Any) -> LayerOptions:
    """``LayerOptions`` (how operations are grouped into layers) from its fields, checked."""
    from .layers import LayerOptions
    return LayerOptions(**fields)


def load_layer_compute(path: str | Path) -> dict[str, LayerFigure]:
    """A YAML/JSON file's mapping of layer names to compute (``solve``'s ``layer_compute``): each a
    number, or its ``forward``, ``backward`` and ``optimizer`` parts (a (forward, backward, optimizer)
    tuple here)."""
    from .io.targets import load_layer_compute as load
    return load(_path("layer_compute", path))


def resolve(request: SolveRequest, analysis: Analysis):
    """``request`` resolved against ``analysis`` (``plan.engine.resolve``): the cost model timed on
    the first target, the solver's options and the plan's record of the inputs."""
    from .plan.engine import resolve as resolve_request
    return resolve_request(request, analysis)


# -- solving ------------------------------------------------------------------------------------

def solve(profile: ProfileLike, devices: int | None = None, *, request: SolveRequest | None = None,
          events: Events | None = None, debug: str | Path | None = None, **options: Any):
    """Split ``profile`` into pipeline stages for ``devices`` devices and return the ``Plan``.

    Options are ``SolveRequest``'s fields: ``target``/``targets``, ``objective`` ("compute",
    "memory", "devices"), ``exact``, ``schedule`` ("none", "gpipe", "1f1b", "interleaved-1f1b",
    "looped-bfs", "zb-h1", "zbv", "dualpipev", "auto"), ``chunks_per_rank``, ``recompute``
    ("auto", "none", "selective", "full"), ``micro_batches``,
    ``headroom``, ``reserve``, ``runtime_reserve`` ("auto", "off" or bytes), ``min_layers``, ``max_layers``, ``pin_splits`` (layer names),
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


def layouts(profile: ProfileLike, *, gpus: int, global_batch: int, target: str, gpus_per_node: int | None = None,
            tp_profiles: Mapping[int, ProfileLike] | None = None, micro_batch_size: int | None = None,
            sequence_length: int | None = None, tp: int | None = None, pp: int | None = None, dp: int | None = None,
            zero: int | None = None, reshard_after_forward: bool = True, schedule: str | Sequence[str] | None = None,
            time_limit: float = 60.0, events: Events | None = None, runtime_reserve: str | int = "auto",
            captured_batch: int | None = None, cp: int | None = None,
            cp_profiles: Mapping[int, ProfileLike] | None = None, ep: int | None = None,
            ep_profiles: Mapping[int, ProfileLike] | None = None,
            layer_compute: Mapping[str, LayerFigure] | str | Path | None = None,
            tp_layer_compute: Mapping[int, Mapping[str, LayerFigure] | str | Path] | None = None,
            chunks_per_rank: int | None = None):
    """The fastest layout of ``gpus`` GPUs for a global batch of ``global_batch`` samples
    (plan/layouts.py): ``profile`` is one rank's at tensor-parallel degree 1, captured with a
    micro-batch of ``captured_batch`` samples (default: the batch the capture recorded, its
    ``info.batch_size``; for profiles that record none, ``micro_batch_size`` where that is given,
    else 1); ``micro_batch_size`` fixes the samples per micro-batch (None: searched, the profiles'
    activations and work scaled to each size: model/batchscale.py); ``tp_profiles`` one rank's at each other
    degree; ``target`` a GPU target with a node (configs/targets.yaml); ``tp``, ``pp``, ``dp``,
    ``zero`` fix a degree (None: searched); ``cp_profiles`` one rank's at each context-parallel
    degree (as ``capture(cp=...)`` writes it, at the tensor-parallel degree it records), ``cp``
    fixes that degree; ``ep_profiles`` one rank's at each expert-parallel degree (``capture(ep=...)``;
    the expert-parallel ranks are taken from the data x context ranks), ``ep`` fixes it;
    ``runtime_reserve`` as ``solve`` takes it; ``layer_compute`` measured per-layer compute as
    ``solve`` takes it ({layer name: compute}, or the YAML/JSON file's path), measured on one rank at
    tensor-parallel degree 1 at the captured micro-batch size, ``tp_layer_compute`` the same measured
    on a rank of another degree ({degree: mapping or path}): each combination's rank takes its own
    degree's figures, else degree 1's, scaled by its capture (plan/layouts.py's
    ``rank_layer_compute``; docs/layouts.md); ``chunks_per_rank`` the chunks (virtual stages) per device
    of a looped schedule, as solve takes it (default: the schedule's own), as a published configuration's
    virtual pipeline size fixes it. ``schedule``: one schedule, ``auto``, or several (a list, or names
    separated by commas: each combination searched under each, and each looped one at 2 to 4 chunks
    per device unless ``chunks_per_rank`` fixes it, every (combination, schedule, chunks) a row with
    floors of its own; default: plan/layouts.py's ``DEFAULT_SCHEDULES``, 1F1B and interleaved 1F1B). A ``LayoutPlan``: the best row, its pipeline plan,
    every combination's row with why it loses, tokens/s per GPU and MFU. The command line's solve
    with an automatic layout is this function too; its ``plan`` is the plan that solve writes."""
    from .plan.layouts import search
    gpus = integer("gpus", gpus, 1, MAX_GPUS)
    rank, degrees, req, deadline, events = _layout_inputs(
        profile, gpus, global_batch=global_batch, target=target, gpus_per_node=gpus_per_node,
        tp_profiles=tp_profiles, micro_batch_size=micro_batch_size, sequence_length=sequence_length, tp=tp, pp=pp,
        dp=dp, zero=zero, reshard_after_forward=reshard_after_forward, schedule=schedule, time_limit=time_limit,
        events=events, runtime_reserve=runtime_reserve, captured_batch=captured_batch, cp=cp,
        cp_profiles=cp_profiles, ep=ep, ep_profiles=ep_profiles, layer_compute=layer_compute,
        tp_layer_compute=tp_layer_compute, chunks_per_rank=chunks_per_rank)
    with deadline.final():          # no solve's one-second floor runs past the search's limit
        return search(rank, degrees, req, deadline, events)


def layout_comparison(profile: ProfileLike, *, gpus: int, global_batch: int, target: str, **options):
    """``layouts`` (the same options), then the layouts a user would otherwise take priced with the
    same model (plan/layout_compare.py: NeMo auto-configurator's grid, torchtitan's preset, Megatron's
    published Llama configurations, pure pipeline, pure FSDP), the one time limit shared. A ``Comparison``: the search's plan and a row per
    compared layout."""
    from .plan.layout_compare import compare
    from .plan.layouts import search
    gpus = integer("gpus", gpus, 1, MAX_GPUS)
    rank, degrees, req, deadline, events = _layout_inputs(profile, gpus, global_batch=global_batch, target=target,
                                                          **_layout_defaults(options))
    chosen = search(rank, degrees, req, deadline.part(deadline.left() / 2), events)
    return compare(rank, degrees, req, chosen, deadline, events)


def _layout_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """``layouts``' keyword options with their defaults, an unknown one refused."""
    defaults: dict[str, Any] = dict(gpus_per_node=None, tp_profiles=None, micro_batch_size=None, sequence_length=None,
                                    tp=None, pp=None, dp=None, zero=None, reshard_after_forward=True, schedule=None,
                                    time_limit=60.0, events=None, runtime_reserve="auto", captured_batch=None,
                                    cp=None, cp_profiles=None, ep=None, ep_profiles=None, layer_compute=None,
                                    tp_layer_compute=None, chunks_per_rank=None)
    for key in options:
        if key not in defaults:
            raise OptionError(key, "not an option of the layout search")
    return defaults | dict(options)


def layout_sweep(profile: ProfileLike, *, gpus: Iterable[int] | str, global_batch: int, target: str,
                 gpus_per_node: int | None = None, tp_profiles: Mapping[int, ProfileLike] | None = None,
                 micro_batch_size: int | None = None, sequence_length: int | None = None, tp: int | None = None,
                 pp: int | None = None, dp: int | None = None, zero: int | None = None,
                 reshard_after_forward: bool = True, schedule: str | Sequence[str] | None = None, time_limit: float = 60.0,
                 events: Events | None = None, runtime_reserve: str | int = "auto", captured_batch: int | None = None,
                 cp: int | None = None, cp_profiles: Mapping[int, ProfileLike] | None = None,
                 ep: int | None = None, ep_profiles: Mapping[int, ProfileLike] | None = None,
                 layer_compute: Mapping[str, LayerFigure] | str | Path | None = None,
                 tp_layer_compute: Mapping[int, Mapping[str, LayerFigure] | str | Path] | None = None,
                 chunks_per_rank: int | None = None):
    """``layouts`` for each GPU count of ``gpus`` (a list, or the command line's "8..64": the
    powers of two between the bounds, or "8,16,24"), the profiles read once and the one time
    limit split across the counts (plan/layouts.py's ``sweep_gpus``). A ``GpuSweep``: a row per
    count with its ``LayoutPlan``, and the fewest GPUs that fit."""
    from .plan.layouts import sweep_gpus
    if isinstance(gpus, str):
        counts = _gpu_counts(gpus, MAX_GPUS)
    elif isinstance(gpus, Iterable) and not isinstance(gpus, (bytes, Mapping)):
        counts = [integer("gpus", n, 1, MAX_GPUS) for n in gpus]
    else:
        raise OptionError("gpus", f"expected GPU counts (a list, or '8..64'), got {short_repr(gpus)}")
    if not counts:
        raise OptionError("gpus", "expected at least one GPU count")
    rank, degrees, req, deadline, events = _layout_inputs(
        profile, max(counts), global_batch=global_batch, target=target, gpus_per_node=gpus_per_node,
        tp_profiles=tp_profiles, micro_batch_size=micro_batch_size, sequence_length=sequence_length, tp=tp, pp=pp,
        dp=dp, zero=zero, reshard_after_forward=reshard_after_forward, schedule=schedule, time_limit=time_limit,
        events=events, runtime_reserve=runtime_reserve, captured_batch=captured_batch, cp=cp,
        cp_profiles=cp_profiles, ep=ep, ep_profiles=ep_profiles, layer_compute=layer_compute,
        tp_layer_compute=tp_layer_compute, chunks_per_rank=chunks_per_rank)
    with deadline.final():
        return sweep_gpus(rank, degrees, req, counts, deadline, events)


def _layout_inputs(profile: ProfileLike, gpus: int, *, global_batch: int, target: str, gpus_per_node: int | None,
                   tp_profiles: Mapping[int, ProfileLike] | None, micro_batch_size: int | None,
                   sequence_length: int | None, tp: int | None, pp: int | None, dp: int | None, zero: int | None,
                   reshard_after_forward: bool, schedule: str | Sequence[str] | None, time_limit: float,
                   events: Events | None,
                   runtime_reserve: str | int = "auto", captured_batch: int | None = None,
                   cp: int | None = None, cp_profiles: Mapping[int, ProfileLike] | None = None,
                   ep: int | None = None, ep_profiles: Mapping[int, ProfileLike] | None = None,
                   layer_compute: Mapping[str, LayerFigure] | str | Path | None = None,
                   tp_layer_compute: Mapping[int, Mapping[str, LayerFigure] | str | Path] | None = None,
                   chunks_per_rank: int | None = None):
    """What the layout search takes, checked and read: each degree's rank (made when the search
    needs it), the degrees, the request for ``gpus`` GPUs, the one deadline (started before the
    profiles are read: it covers the whole command) and the events."""
    from .io.targets import load_target
    from .io.topology import node_of
    from .plan.layouts import LayoutRequest, search_deadline
    from .solver.request import Schedule, SolveRequest
    events = _events(events)
    global_batch = integer("global_batch", global_batch, 1, 2**40)
    micro_batch_size = integer("micro_batch_size", micro_batch_size, 1, 2**40, optional=True)
    captured_batch = integer("captured_batch", captured_batch, 1, 2**40, optional=True)
    sequence_length = integer("sequence_length", sequence_length, 1, 2**40, optional=True)
    fixed = {name: integer(name, value, 1, MAX_GPUS if name == "dp" else MAX_DEVICES, optional=True)
             for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp), ("ep", ep))}
    zero = integer("zero", zero, 0, 3, optional=True)
    time_limit = number("time_limit", time_limit, 0, 1e9, low_open=True)
    if schedule is None:                # the layout search's own list (plan/layouts.py)
        from .plan.layouts import DEFAULT_SCHEDULES
        schedule = DEFAULT_SCHEDULES
    names = schedule.split(",") if isinstance(schedule, str) else list(schedule) \
        if isinstance(schedule, (list, tuple)) else [schedule]
    names = list(dict.fromkeys(choice(Schedule, "schedule", name).value for name in names))
    if "none" in names:
        raise OptionError("schedule", "the layout search solves a pipeline schedule (1f1b, gpipe, zbv, ..., or auto "
                          "for each), not none")
    if len(names) > 1 and "auto" in names:
        raise OptionError("schedule", "auto searches every schedule itself: give it alone, or a list of schedules")
    # checked as solve checks it (its count, and that the schedule runs that many chunks per device); with
    # several schedules the count is each looped one's (the others run their own)
    from .solver.schedule_kinds import traits
    looped = [n for n in names if n == "auto" or traits(n).fixed_chunks_per_rank is None]
    chunks_per_rank = SolveRequest(devices=1, schedule=Schedule(looped[0] if looped else names[0]),
                                   chunks_per_rank=chunks_per_rank).chunks_per_rank
    schedule = ",".join(names)
    if not isinstance(target, str):
        raise OptionError("target", "expected a target name or a YAML target file")
    node = node_of(target)
    if gpus_per_node is not None:
        node = replace(node, gpus_per_node=integer("gpus_per_node", gpus_per_node, 1, MAX_DEVICES))
    deadline = search_deadline(time_limit)      # the whole search, reading the profiles included
    measured = _measured_compute(layer_compute, tp_layer_compute)
    sources: dict[Any, Any] = _by_degree(profile, events)
    for degree, other in (tp_profiles or {}).items():
        degree = integer("tp_profiles", degree, 2, MAX_DEVICES)
        if degree in sources:
            raise OptionError("tp_profiles", f"degree {degree} is given twice: the profile holds a variant of it")
        sources[degree] = other
    read = {t: analyze(p, events=events) for t, p in sources.items()}
    for t, a in read.items():              # a profile that records its degree (capture --tp) must match
        layout = getattr(a.profile.info, "parallel_layout", None)
        recorded = getattr(layout, "tensor_parallel", t)
        if recorded != t or getattr(layout, "context_parallel", 1) != 1:
            where = show(str(a.profile.info.path or a.profile.info.name or "the profile"))
            what = (f"of context-parallel degree {getattr(layout, 'context_parallel', 1)} (give it as a "
                    "context-parallel profile)"
                    if recorded == t else f"of tensor-parallel degree {recorded}, given as degree {t}")
            raise OptionError("tp_profiles" if t > 1 else "profile", f"{where} is one rank {what}")
    def checked_rank(parameter: str, degree: Any, other: Any, kind: str, short: str) -> tuple[int, Any, Any]:
        """A rank's profile given at ``degree`` of ``kind`` parallelism, read and checked against what
        its capture recorded."""
        n = integer(parameter, degree, 2, MAX_DEVICES)
        a = analyze(other, events=events)
        layout = getattr(a.profile.info, "parallel_layout", None)
        if layout is None or getattr(layout, f"{kind}_parallel") != n:
            where = show(str(a.profile.info.path or a.profile.info.name or "the profile"))
            raise OptionError(parameter, f"{where} is not one rank of {kind}-parallel degree {n} (capture it "
                              f"with {short}={n})")
        return n, a, layout
    for degree, other in (cp_profiles or {}).items():   # keyed (tp, cp) by what the capture recorded
        c, a, layout = checked_rank("cp_profiles", degree, other, "context", "cp")
        read[(layout.tensor_parallel, c)] = a
    for degree, other in (ep_profiles or {}).items():   # keyed (tp, cp, ep) by what the capture recorded
        e, a, layout = checked_rank("ep_profiles", degree, other, "expert", "ep")
        read[(layout.tensor_parallel, layout.context_parallel, e)] = a

    captured_batch, captured_from, recorded_batch = _captured_batch(captured_batch, micro_batch_size, read)
    # the layout search's alone: imported here (with decimal, 2 ms of every command otherwise)
    from fractions import Fraction
    scaled: dict[tuple[Any, Fraction], Any] = {}

    def rank(t, layout: DataLayout, ratio: Fraction = Fraction(1)):
        # each combination's rank made when the search needs it, not kept (a 70B profile is large);
        # the profile at each micro-batch size scaled once (model/batchscale.py)
        if ratio == 1:
            return _with_layers(read[t].profile, read[t], layout) if layout.sharded else read[t]
        # (the profile kept, not its analysis: a 70B analysis is large)
        if (t, ratio) not in scaled:
            from .model.batchscale import scale_batch
            scaled[t, ratio] = scale_batch(read[t].profile, ratio)
        return _with_layers(scaled[t, ratio], read[t], layout)
    req = LayoutRequest(gpus=gpus, global_batch=global_batch, target=load_target(target), node=node,
                        micro_batch_size=micro_batch_size, sequence_length=sequence_length, tp=fixed["tp"],
                        pp=fixed["pp"], dp=fixed["dp"], cp=fixed["cp"], ep=fixed["ep"], zero=zero,
                        reshard_after_forward=bool(reshard_after_forward),
                        schedule=schedule, time_limit=time_limit,
                        runtime_reserve=_checked_runtime_reserve(runtime_reserve), captured_batch=captured_batch,
                        captured_from=captured_from, recorded_batch=recorded_batch, layer_compute=measured, chunks_per_rank=chunks_per_rank)
    return rank, sorted(read, key=lambda k: (k, 1, 1) if isinstance(k, int) else (*k, 1)[:3]), req, deadline, events


def _captured_batch(given: int | None, micro_batch_size: int | None, read: Mapping[Any, Analysis]
                    ) -> tuple[int, str, int | None]:
    """The samples per micro-batch the profiles were captured at, where that figure comes from, and
    the batch their captures recorded (None: none, or several): ``given``; else the recorded one
    (profiles recording different ones refused, as one size scales them all); else, for profiles
    that record none, ``micro_batch_size`` where that is fixed, else 1."""
    recorded: dict[int, str] = {}
    for a in read.values():
        if a.profile.info.batch_size is not None:
            recorded.setdefault(a.profile.info.batch_size,
                                str(a.profile.info.path or a.profile.info.name or "the profile"))
    if given is not None:
        return given, "given", next(iter(recorded)) if len(recorded) == 1 else None
    if len(recorded) > 1:
        (one, first), (other, second) = sorted(recorded.items())[:2]
        raise OptionError("captured_batch", f"the profiles were captured at different batches ({show(first)} at "
                          f"{one}, {show(second)} at {other}): capture them at one size, or give the size "
                          "they all stand for")
    if recorded:
        size = next(iter(recorded))
        return size, "recorded", size
    return (micro_batch_size if micro_batch_size is not None else 1), "assumed", None


def _with_layers(profile: Profile, read: Analysis, layout: DataLayout) -> Analysis:
    """``analyze(profile, layout=layout)`` with the layers (and shared policy) of ``read``, the
    analysis of the profile as read: a rank's profile sharded
    (model/datasharding.py) or scaled to another micro-batch size (model/batchscale.py) keeps every
    operation's name, inputs, layer and steps, which are all the grouping reads, so its layers are the
    read profile's (the grouping of a 405B capture's 52,000 operations takes seconds per combination)."""
    from .model.analysis import Analysis
    from .model.costmodel import StageCostModel
    from .model.datasharding import kept_unsharded, shard_profile
    layers, shared = read.layers, read.model.shared
    if not layout.sharded:
        return Analysis(profile, layers, StageCostModel(profile, layers, shared=shared))
    rank = shard_profile(profile, layers, layout)
    model = StageCostModel(rank, layers, shared=shared, kept_unsharded=kept_unsharded(profile, layers, layout))
    return Analysis(rank, layers, model, layout=layout, source=profile)


def _measured_compute(layer_compute: Any, tp_layer_compute: Any) -> tuple:
    """The layout search's measured per-layer compute (plan/layouts.py's ``Measured``), each given
    as ``solve``'s ``layer_compute`` is (a mapping, checked as solve checks it) or as the path of its
    YAML/JSON file (read as solve reads its file, and recorded in the plan)."""
    def one(parameter: str, value: Any) -> tuple[tuple[tuple[str, LayerFigure], ...], str | None]:
        if isinstance(value, (str, Path)):
            path = _path(parameter, value)
            return tuple(load_layer_compute(path).items()), path
        return tuple(_layer_compute(value, parameter).items()), None
    out = []
    if layer_compute is not None:
        figures, source = one("layer_compute", layer_compute)
        if figures:
            out.append((1, figures, source))
    if tp_layer_compute is not None:
        if not isinstance(tp_layer_compute, Mapping):
            raise OptionError("tp_layer_compute", f"expected a mapping of tensor-parallel degrees to measured "
                              f"per-layer compute, got {short_repr(tp_layer_compute)}")
        for degree, value in tp_layer_compute.items():
            if degree == 1:
                raise OptionError("tp_layer_compute", "degree 1's measured compute is `layer_compute` (the figures "
                                  "every other degree's ranks are scaled from)")
            degree = integer("tp_layer_compute", degree, 2, MAX_DEVICES)
            figures, source = one("tp_layer_compute", value)
            if figures:
                out.append((degree, figures, source))
    return tuple(out)


def _by_degree(profile: Any, events: Events) -> dict[int, Any]:
    """The profiles the layout search's ``profile`` gives, by tensor-parallel degree: each
    variant of a file (or ``ParallelVariants``) holding one per degree at its degree, else the
    one profile as degree 1 (read here once where it is a path; ``analyze`` takes it as read)."""
    from .io import load_variants
    from .io.variants import ParallelVariants
    found = profile
    if isinstance(profile, (str, Path)):
        path = _path("profile", profile)
        events.start(f"reading {show(path)}")
        found = load_variants(path, None, events.update)
        events.done()
    if isinstance(found, ParallelVariants):
        if len(found.profiles) > 1:
            return dict(zip(found.degrees, found.profiles))
        found = found.profiles[0]
    return {1: found}


def _degree_of(profile: Any, degree: int, events: Events) -> Any:
    """A plan's profile given again: from a file holding one rank per tensor-parallel degree (as
    the layout search takes it), the rank of the plan's degree; anything else as it is."""
    from .io.variants import ParallelVariants, is_variants_file
    if isinstance(profile, (str, Path)) and not is_variants_file(profile) and Path(profile).suffix != ".pop":
        profile = _by_degree(profile, events)
        if len(profile) == 1:
            return next(iter(profile.values()))
    elif isinstance(profile, ParallelVariants):
        profile = dict(zip(profile.degrees, profile.profiles))
    else:
        return profile
    if degree not in profile:
        raise StagesplitError(f"the plan is of tensor-parallel degree {degree}; the profile holds a rank at degrees "
                              f"{', '.join(map(str, profile))} only")
    return profile[degree]


def _checked_runtime_reserve(value: str | int) -> str | int:
    """``runtime_reserve`` as solve checks it (auto, off, or bytes)."""
    from .solver.request import SolveRequest
    return SolveRequest(devices=1, runtime_reserve=value).runtime_reserve


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
    """``solve`` once its request is made: the profile (or its variants) read and analysed here,
    the search (plan/engine.py) bounded by one deadline from the time limit."""
    from .plan import engine
    variants = _variant_sources(profile)
    if variants is not None:
        return _solve_variants(variants, req, events, debug)
    analysis = analyze(profile, layering=req.layering, shared=req.shared, debug=debug, events=events,
                       layout=req.data_layout())
    return engine.solve(analysis, req, Deadline.after(req.time_limit), events)


def _variant_sources(profile: Any):
    """The profile variants ``profile`` names (a variants file, or a list of them), or None for
    one profile."""
    from .io.profile import Profile
    from .io.variants import (
        VariantSource,
        check_variants,
        is_variants_file,
        read_variants_file,
        variants_from_arguments,
    )
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
    from .plan import engine
    if debug is not None:
        raise OptionError("debug", "with profile variants, give each profile.pop's debug.cbor in a variants file "
                          "(its debug field)")
    engine.check_variants_request(req)            # before any profile is read
    analyses = [analyze(s.profile, layering=req.layering, shared=req.shared, debug=s.debug, events=events,
                         layout=req.data_layout())
                for s in sources]
    names = [s.name for s in sources]
    check_same_layers(names, [a.layers.names for a in analyses])
    return engine.solve_variants(analyses, names, [s.proportion for s in sources], req,
                                 Deadline.after(req.time_limit), events)


def sweep(profile: ProfileLike, devices: Iterable[int] | str, *, request: SolveRequest | None = None,
          events: Events | None = None, on_row: Callable | None = None, debug: str | Path | None = None,
          **options: Any):
    """Solve for each device count in ``devices`` (a range like ``range(1, 17)``, a list, or
    the command line's "1..16" / "2,4,8"), pricing every layer range once."""
    events = _events(events)
    if isinstance(devices, str):
        counts = _device_counts(devices, MAX_DEVICES)
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
    from .plan import engine
    if _variant_sources(profile) is not None:
        raise OptionError("profile", "profile variants are solved by solve (one device count at a time), not sweep: "
                          "sweep one variant, or solve the variants for each count")
    analysis = analyze(profile, layering=req.layering, shared=req.shared, debug=debug, events=events,
                       layout=req.data_layout())
    return engine.sweep(analysis, req, counts, events, on_row)


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
        # every variant has a path (checked above); solve checks the proportions (check_variants)
        profile = [VariantSource(_recorded_path(plan_path, cast(str, v.path), f"variants[{i}].path"),
                                 v.proportion, v.name)  # type: ignore[arg-type]
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
    plan = solve(_degree_of(profile, recorded.profile.tensor_parallel, events), request=request, events=events)
    want, got = recorded.profile.sha256, plan.profile.sha256
    matches = None if not want or not got else want == got
    differences = []
    if matches is False:
        assert want is not None and got is not None     # both recorded (matches says so)
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

def _model(profile: ProfileLike, layering, shared, layer_compute, debug, events, layout=None):
    model = analyze(profile, layering=layering, shared=shared, debug=debug, events=events, layout=layout).model
    compute = _layer_compute(layer_compute)
    return model.with_compute(compute, "layer_compute") if compute else model


def breakdown(profile: ProfileLike, *, target: str | Target | None = None, efficiency: float = 1.0,
              layering: LayerOptions | None = None, shared: str | SharedPolicy = "every",
              layer_compute: Mapping[str, LayerFigure] | None = None, debug: str | Path | None = None,
              events: Events | None = None, dp: int | None = None, zero: int | None = None,
              reshard_after_forward: bool | str | None = None):
    """Where the profile's memory and compute go (``Breakdown``: tables and DataFrames). ``dp``
    (with ``zero`` and ``reshard_after_forward``, as ``solve`` takes them): every figure is one
    of ``dp`` data-parallel ranks', and a table shows what each category becomes on such a rank
    under each ZeRO stage. A file holding one rank at each tensor-parallel degree (or a
    ``ParallelVariants``): a table shows what each category becomes at each degree, the other
    tables being the lowest degree's."""
    from .reporting.breakdown import Breakdown
    from .solver.request import SolveRequest
    events = _events(events)
    efficiency = number("efficiency", efficiency, 0, 1, low_open=True)
    options: dict[str, Any] = {k: v for k, v in (("dp", dp), ("zero", zero),
                                                 ("reshard_after_forward", reshard_after_forward)) if v is not None}
    layout: DataLayout = SolveRequest(devices=1, **options).data_layout()     # checked as solve checks them
    target = _target("target", target)
    degrees: dict[int, Any] = {}
    if isinstance(profile, (str, Path)) and debug is None or _is_parallel_variants(profile):
        degrees = _by_degree(profile, events)        # a file of one profile: that profile, read once
        profile = next(iter(degrees.values()))
    analysis = analyze(profile, layering=layering, shared=shared, debug=debug, events=events, layout=layout)
    compute = _layer_compute(layer_compute)
    model = analysis.model.with_compute(compute, "layer_compute") if compute else analysis.model
    one_device = analysis.source if analysis.source is not None else analysis.profile
    ranks: tuple = ()
    if len(degrees) > 1:             # one rank at each tensor-parallel degree: what each category becomes
        ranks = tuple((d, model if p is profile else analyze(p, layering=layering, shared=shared, events=Events(),
                                                              layout=layout).model)
                      for d, p in degrees.items())
    return Breakdown.of(model.on(target, efficiency), layout.dp if layout.sharded else None, one_device, ranks)


def _is_parallel_variants(profile: Any) -> bool:
    from .io.variants import ParallelVariants
    return isinstance(profile, ParallelVariants)


def diagnose(profile: ProfileLike, *, plan: Any = None, layers: str | tuple[str, str] | None = None, top: int = 10,
             window: int = 5, layering: LayerOptions | None = None, shared: str | SharedPolicy = "every",
             layer_compute: Mapping[str, LayerFigure] | None = None, debug: str | Path | None = None,
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
    if plan is not None:
        where = "plan" if isinstance(plan, Plan) else str(plan)
        plan = plan if isinstance(plan, Plan) else read_plan(plan)
    # a plan solved for data-parallel ranks is diagnosed on one rank's figures, as it was solved
    layout = plan.inputs.request.data_layout() if plan is not None else None
    model = _model(profile, layering, shared, layer_compute, debug, events, layout)
    names = model.layers.names
    stages = None
    if plan is not None:
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
    if layering is not None and layering != type(layering)():     # explicit grouping: stored with the operations
        result.profile.operations.layer = [layers.names[lay] if lay >= 0 else None for lay in layers.op_layer]
    result.layers = list(layers.names)
    for message in result.warnings:
        events.warn(message)
    if output is not None:
        events.start(f"writing {show(output)}")
        save_profile(result.profile, output)
        events.done()
    return result


def capture(model: str, output: str | Path | None = None, *, optimizer: str = "adam", dtype: str = "float32",
            amp: bool = False, target: str | Target | None = None, allocator_round: int = 512,
            name: str | None = None, layer_regex: str | None = None, torch_logs: bool = False,
            tp: int | Sequence[int] = 1, sequence_parallel: bool = False, tp_plan: str | Path | None = None,
            events: Events | None = None, kernels: str = "cpu", cp: int = 1, ep: int = 1,
            master_weights: bool = False, loss_parallel: bool = False) -> Profile | ParallelVariants:
    """Capture one training step of the model the factory ``model`` names
    (``path/to/file.py:function`` or ``package.module:function``) on CPU under fake tensors
    (see ``stagesplit.capturing.pytorch``), written to ``output`` when given. ``optimizer``:
    adam, adamw, sgd or none; ``dtype``: the parameters' and activations' dtype, with ``amp``
    the forward under autocast; ``target``: the device (default a100-80gb); ``allocator_round``:
    storages rounded up to this many bytes; ``name``: the profile's (default: the factory's);
    ``layer_regex``: group by this pattern instead of the module tree; ``torch_logs``: let
    torch's logging through. ``tp``: capture rank 0 of this many tensor-parallel ranks, the
    plan from ``tp_plan`` (a YAML file: module pattern -> style) or the model's declaration, with
    ``sequence_parallel`` between the blocks (``stagesplit.capturing.tensorparallel``), and with
    ``loss_parallel`` the plan's gathered head kept split on the vocabulary, the loss computed on the
    split under torch's ``loss_parallel()`` (torchtitan's and Megatron's way; a Hugging Face plan
    gathers the logits); the profile's ``info.parallel_layout`` says which plan was used. ``tp`` a list of degrees: one
    rank at each, in one ``ParallelVariants`` written as one file (``sequence_parallel`` and
    ``tp_plan`` for the degrees of 2 or more). ``kernels``: cpu (what the CPU
    kernels the capture runs keep) or cuda (attention as the GPU target's CUDA kernels keep it,
    docs/gpu.md). ``cp``: capture rank 0 of this many context-parallel ranks (the sequence sharded,
    attention as torch's ring attention on the GPU's kernels: ``stagesplit.capturing.contextparallel``,
    docs/layouts.md). ``ep``: rank 0 of this many expert-parallel ranks of a mixture-of-experts
    model (its routed experts split, the tokens' all-to-alls added: composed from rules,
    ``stagesplit.capturing.expertparallel``). ``master_weights``: the parameters in ``dtype``
    (bfloat16 when float32) with no autocast, float32 gradients and float32 master copies the
    optimizer updates, as Megatron's ``--bf16`` and FSDP2's mixed precision train
    (``stagesplit.capturing.masterweights``); not with ``amp``."""
    from .capturing.kernels import KERNELS
    from .capturing.pytorch import capture as capture_step
    from .io import save_profile
    events = _events(events)
    if not isinstance(model, str):
        raise OptionError("model", f"expected 'path/to/file.py:function' or 'package.module:function', "
                          f"got {short_repr(model)}")
    if kernels not in KERNELS:
        raise OptionError("kernels", f"expected one of {', '.join(KERNELS)}, got {short_repr(kernels)}")
    output = _path("output", output, optional=True)
    if isinstance(tp, (list, tuple)):
        from .capturing.pytorch import check_degrees
        tp = [integer("tp", d, 1, 4096) for d in tp]
        tp = list(check_degrees(tp)) if len(tp) > 1 else tp[0]
    else:
        tp = integer("tp", tp, 1, 4096)
    cp = integer("cp", cp, 1, 4096)
    ep = integer("ep", ep, 1, 4096)
    tp_plan = _path("tp_plan", tp_plan, optional=True)
    if output is not None:
        where = model.rpartition(":")[0]
        _check_outputs([("output", output, None)], [where if where.endswith(".py") else None])
    events.start("importing torch")
    try:
        import torch  # noqa: F401  (the longest part of a capture on a cold start: a phase of its own)
    except ImportError:
        pass                                  # capture_step says how to install it
    degrees = f" at tensor-parallel degrees {', '.join(map(str, sorted(tp)))}" if isinstance(tp, list) else ""
    events.start(f"capturing one training step of {show(model)}{degrees}")
    profile = capture_step(model, optimizer=optimizer, dtype=dtype, amp=amp, target=target,
                           allocator_round=allocator_round, name=name, layer_regex=layer_regex, torch_logs=torch_logs,
                           tp=tp, sequence_parallel=bool(sequence_parallel), tp_plan=tp_plan, kernels=kernels,
                           cp=cp, ep=ep, master_weights=bool(master_weights), loss_parallel=bool(loss_parallel))
    events.done()
    for message in dict.fromkeys(m for p in _profiles_of(profile) for m in p.info.warnings):
        events.warn(message)
    if output is not None:
        events.start(f"writing {show(output)}")
        save_profile(profile, output)
        events.done()
    return profile


def _profiles_of(found: Any) -> tuple[Profile, ...]:
    """A profile, or each of a ``ParallelVariants``'s."""
    from .io.variants import ParallelVariants
    return found.profiles if isinstance(found, ParallelVariants) else (found,)


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
    options: dict[str, Any] = dict(seed=seed, piece_bytes=piece_bytes, programs_per_op=programs_per_op, **params)
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
    from .exporters import export_plan
    from .plan.files import read_plan
    from .plan.records import Plan
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
    named = profile                   # (a path stays the name messages give)
    if variants is None:
        profile = _degree_of(profile, plan.profile.tensor_parallel, events)
    if plan.devices > REPORT_RESOLVE_DEVICES and variants is None:
        request = plan.inputs.request
        analysis = analyze(profile, layering=request.layering, shared=request.shared, events=events,
                           layout=request.data_layout())
        model = resolve(request, analysis).model
        fresh = replace(plan, layer_names=list(analysis.layers.names), profile=plan_profile(model), analysis=model,
                        baselines=[], variant_models={})
        events.warn(f"{show(where or 'plan')}: devices: {plan.devices:,} devices, more than the "
                    f"{REPORT_RESOLVE_DEVICES} a report solves the request again for: the page compares the plan "
                    "with no other split")
    else:
        fresh = solve(profile, request=plan.inputs.request.overridden(compare=True), events=events)
    if fresh.layer_names != plan.layer_names:
        made_for = plan.profile.name or plan.profile.path or "another profile"
        raise StagesplitError(f"{show(where or 'plan')}: the plan was made for {show(made_for)} with "
                              f"{len(plan.layer_names)} layers, but {show(str(named))} has {len(fresh.layer_names)}: "
                              "give the profile the plan was solved on")
    _warn_other_bytes(where, plan, fresh, named, events)
    return replace(plan, analysis=fresh.analysis, baselines=fresh.baselines, variant_models=fresh.variant_models)


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
    from .reporting.plot import figure_of
    return figure_of(_plan_with_model(plan, profile, Events()))


# -- what the command line needs besides the commands (it imports nothing else of the package) ------

def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader never sees half of it)."""
    from .common.fileio import atomic_write_text
    atomic_write_text(_path("output", path), text)


def write_plan(plan: Any, path: str | Path) -> None:
    """Write ``plan`` as a plan file (.json, or .yaml/.yml), atomically."""
    from .plan.files import write_plan as write
    write(plan, _path("out", path))


def plan_document(plan: Any) -> dict[str, Any]:
    """``plan`` as the plain JSON document a plan file holds."""
    from .plan.files import plan_document as document
    return document(plan)


def target(name: str | Target) -> Target:
    """The device target ``name`` names (a shipped one, or a YAML file)."""
    return _target("target", name)


def gpu_counts(text: str) -> list[int]:
    """The command line's GPU counts ("8..64": the powers of two between the bounds; "8,16,24"), checked."""
    return _gpu_counts(text, MAX_GPUS)


def device_counts(text: str) -> list[int]:
    """``1..16`` or ``2,4,8``: device counts in 1..MAX_DEVICES, checked before any list is built."""
    return _device_counts(text, MAX_DEVICES)


def is_variant_word(word: str) -> bool:
    """Whether ``word`` names a profile variant (``PROFILE=PROPORTION``)."""
    from .io.variants import variant_argument
    return variant_argument(word) is not None


def is_variants_file(path: str | Path) -> bool:
    """Whether ``path`` is a variants file (a YAML list of profile variants)."""
    from .io.variants import is_variants_file as is_file
    return is_file(path)


def profile_variants(source: str | Path | list[str]) -> list[Any]:
    """The profile variants a variants file, or a list of ``PROFILE=PROPORTION`` words, names."""
    from .io.variants import read_variants_file, variants_from_arguments
    if isinstance(source, (str, Path)):
        return list(read_variants_file(source))
    return list(variants_from_arguments(source))


def export_formats() -> dict[str, str]:
    """The export formats (``export``'s ``fmt``) by name, with what each writes."""
    from .exporters import FORMATS
    return {name: f.description for name, f in FORMATS.items()}


def targets() -> dict[str, Target]:
    """The shipped device targets by name (configs/targets.yaml)."""
    from .io.targets import known_targets
    return known_targets()
