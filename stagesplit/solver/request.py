"""The options of a solve, defined once: ``SolveRequest``, one frozen record validated once,
that the Python API, the command line, the solver settings file and a plan's record of its
run all build. Layers are named as ``breakdown`` shows them, targets by name (``stagesplit
targets``), YAML path, or ``Target``; ``resolve`` (solver/problem.py) turns names into indices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..common.layerfigures import LayerFigure, figure_record, read_layer_figure
from ..common.limits import (
    MAX_BYTES,
    MAX_CHUNKS_PER_RANK,
    MAX_COMPUTE,
    MAX_DEVICES,
    MAX_MICRO_BATCHES,
    MAX_TIME_LIMIT,
    MAX_WORKERS,
)
from ..common.safeinput import read_yaml_file
from ..common.shippedyaml import read_shipped_yaml
from ..common.text import short_repr
from ..common.validate import boolean, choice, integer, mapping_items, number, pairs, strings
from ..errors import FileOptionError, OptionError, ProfileError
from ..io.profile import Target
from ..io.targets import config_dir, load_target, target_from_mapping, target_record, yaml_number
from ..layers import LayerOptions
from ..model.datasharding import DataLayout
from .options import SETTINGS_KEYS, declared, option_named
from .schedule_kinds import check_chunks_per_rank

if TYPE_CHECKING:
    from ..model.allocator import AllocatorOptions

__all__ = ["Objective", "RecomputeMode", "Schedule", "SharedPolicy", "SolveRequest"]


class Objective(str, Enum):
    """What the split minimises first (ties broken by the other two)."""

    COMPUTE = "compute"     #: the slowest stage's time
    MEMORY = "memory"       #: the fullest stage's worst tile
    DEVICES = "devices"     #: the number of devices used


class Schedule(str, Enum):
    """The pipeline schedule: none, one of torch.distributed.pipelining's schedules (see
    solver/schedule_kinds.py), or ``auto`` (each schedule, and 1 to 4 chunks per rank, is tried and the
    fastest that fits is kept)."""

    NONE = "none"
    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    LOOPED_BFS = "looped-bfs"
    ZB_H1 = "zb-h1"
    ZBV = "zbv"
    DUALPIPEV = "dualpipev"
    AUTO = "auto"

    @property
    def one_stage_per_device(self) -> bool:
        """GPipe, 1F1B and none: the schedules of one stage per device the stage-level model
        (in-flight micro-batches) also expresses, for profiles that do not record phases."""
        return self in (Schedule.NONE, Schedule.ONE_F_ONE_B, Schedule.GPIPE)


class RecomputeMode(str, Enum):
    """Activation recompute (model/recompute.py): none, the same option on every layer, or
    ``auto`` (the solver chooses none, selective or full per layer, with the split). Left unset,
    a plan that fits without recompute has none, and one that does not is solved with auto."""

    AUTO = "auto"
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class SharedPolicy(str, Enum):
    """Where items no layer uses (global buffers, constants) are counted."""

    EVERY = "every"         #: on every stage (safe: an under-estimate gives a plan that does not fit)
    NONE = "none"           #: on no stage (PopLiner's assumption that they spread out)


@dataclass(frozen=True)
class SolveRequest:
    """Everything a solve depends on besides the profile, validated when it is made (and again
    by ``dataclasses.replace``): a bad value raises ``OptionError`` naming the field."""

    # every option's default, help and names are declared once in solver/options.py (``declared``)
    devices: int = field(metadata={"option": option_named("devices")})
    #: one target for every device, or one per device; empty: the profile's own device
    targets: tuple[str | Target, ...] = declared("targets")
    objective: Objective = declared("objective", Objective)
    #: use exactly ``devices`` devices (default: at most)
    exact: bool = declared("exact")
    schedule: Schedule = declared("schedule", Schedule)
    #: micro-batches per step; None: the number of devices with a schedule, else 1
    micro_batches: int | None = declared("micro_batches")
    #: chunks (virtual stages) per device; None: the schedule's own (``resolved_chunks``)
    chunks_per_rank: int | None = declared("chunks_per_rank")
    #: activation recompute per layer; None: none where the plan fits without, else auto
    recompute: RecomputeMode | None = declared("recompute", RecomputeMode)
    #: data-parallel ranks, the ZeRO stage and FSDP2's resharding (model/datasharding.py); the
    #: plan's figures are one rank's
    dp: int = declared("dp")
    zero: int = declared("zero")
    reshard_after_forward: bool = declared("reshard_after_forward")
    headroom: float = declared("headroom")
    #: bytes kept back on every device (CUDA context, workspaces)
    reserve: int = declared("reserve")
    #: on a GPU, what is kept back for the CUDA context and NCCL's buffers: "auto" (priced,
    #: solver/runtime_reserve.py), "off", or bytes in place of the estimate
    runtime_reserve: str | int = declared("runtime_reserve")
    #: whether a GPU plan replays torch's caching allocator ("replay") or not ("off")
    allocator: str = declared("allocator")
    #: the PYTORCH_CUDA_ALLOC_CONF the replay models ("": torch's defaults)
    alloc_conf: str = declared("alloc_conf")
    min_layers: int = declared("min_layers")
    max_layers: int | None = declared("max_layers")
    #: a stage starts at each of these layers
    pin_splits: tuple[str, ...] = declared("pin_splits")
    #: (layer, device position) pairs
    pin_layers: tuple[tuple[str, int], ...] = declared("pin_layers")
    communication: bool = declared("communication")
    #: device-to-device bytes per second (default: the target's, else the profile's)
    link_bandwidth: float | None = declared("link_bandwidth")
    efficiency: float = declared("efficiency")
    shared: SharedPolicy = declared("shared", SharedPolicy)
    #: per-layer compute replacing the profile's (in its compute unit)
    layer_compute: tuple[tuple[str, LayerFigure], ...] = declared("layer_compute")
    layer_compute_source: str | None = declared("layer_compute_source")
    layering: LayerOptions = field(default_factory=LayerOptions)
    time_limit: float = declared("time_limit")
    workers: int = declared("workers")
    #: also price what the user would do otherwise: on a GPU the frameworks' default splits, on
    #: an IPU PopLiner's greedy split and an even one
    compare: bool = declared("compare")
    unlayered_first: bool = declared("unlayered_first")
    #: where values came from that a file gave: (parameter, file, field) for each, e.g.
    #: ("schedule", "solver.yaml", "schedule") or ("layer_regex", "plan.json", "request.layering.layer_regex");
    #: an error about such a value names the file and field (``named``), any other the parameter
    #: (the command line: its flag). Not an option: equal requests may come from different places.
    origins: tuple[tuple[str, str, str], ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.origins, tuple) or not all(isinstance(o, tuple) and len(o) == 3 and
                                                          all(isinstance(x, str) for x in o) for o in self.origins):
            raise OptionError("origins", f"expected (parameter, file, field) triples, got {short_repr(self.origins)}")
        try:
            self._check()
        except OptionError as exc:
            named = self.named(exc)
            if named is exc:
                raise
            raise named from exc

    def named(self, error: OptionError) -> OptionError:
        """``error`` named by the file and field that gave its parameter's value (a
        ``FileOptionError``), or ``error`` itself where no file gave it."""
        for parameter, file, field_ in self.origins:
            if parameter == error.parameter:
                return error.from_file(file, field_)
        return error

    def _check(self) -> None:
        """Every field checked and normalised (names to enums, lists to tuples)."""
        set_ = object.__setattr__
        set_(self, "devices", integer("devices", self.devices, 1, MAX_DEVICES))
        targets = (self.targets,) if isinstance(self.targets, (str, Target)) else \
            strings_or_targets("targets", self.targets)
        if len(targets) not in (0, 1, self.devices):
            raise OptionError("targets", f"give one target or {self.devices} (one per device), got {len(targets)}")
        set_(self, "targets", targets)
        set_(self, "objective", choice(Objective, "objective", self.objective))
        set_(self, "schedule", choice(Schedule, "schedule", self.schedule))
        set_(self, "shared", choice(SharedPolicy, "shared", self.shared))
        if self.recompute is not None:
            set_(self, "recompute", choice(RecomputeMode, "recompute", self.recompute))
        for name in ("exact", "communication", "compare", "unlayered_first"):
            set_(self, name, boolean(name, getattr(self, name)))
        set_(self, "micro_batches", integer("micro_batches", self.micro_batches, 1, MAX_MICRO_BATCHES,
                                            optional=True))
        set_(self, "chunks_per_rank", integer("chunks_per_rank", self.chunks_per_rank, 1, MAX_CHUNKS_PER_RANK,
                                              optional=True))
        if self.chunks_per_rank is not None and self.schedule is Schedule.NONE and self.chunks_per_rank != 1:
            raise OptionError("chunks_per_rank", f"schedule none runs one stage per device: expected 1, got "
                              f"{self.chunks_per_rank} (a looped or V-shaped schedule runs several)")
        if self.chunks_per_rank is not None and self.schedule not in (Schedule.NONE, Schedule.AUTO):
            check_chunks_per_rank(self.schedule.value, self.chunks_per_rank)
        set_(self, "dp", integer("dp", self.dp, 1, int(option_named("dp").high or 1)))
        set_(self, "zero", integer("zero", self.zero, 0, 3))
        reshard: Any = self.reshard_after_forward           # the command line's on/off, or a bool
        if isinstance(reshard, str) and reshard in ("on", "off"):
            set_(self, "reshard_after_forward", reshard == "on")
        set_(self, "reshard_after_forward", boolean("reshard_after_forward", self.reshard_after_forward))
        self.data_layout()                          # zero without dp is refused here, naming zero
        set_(self, "headroom", number("headroom", self.headroom, 0, 1, high_open=True))
        set_(self, "reserve", integer("reserve", self.reserve, 0, MAX_BYTES))
        if self.runtime_reserve is False:          # YAML 1.1 reads a settings file's ``off`` as false
            set_(self, "runtime_reserve", "off")
        if self.runtime_reserve not in ("auto", "off"):
            if not isinstance(self.runtime_reserve, int) or isinstance(self.runtime_reserve, bool):
                raise OptionError("runtime_reserve", f"expected auto, off or a number of bytes, got "
                                  f"{short_repr(self.runtime_reserve)}")
            set_(self, "runtime_reserve", integer("runtime_reserve", self.runtime_reserve, 0, MAX_BYTES))
        if self.allocator not in ("replay", "off"):
            raise OptionError("allocator", f"expected replay or off, got {short_repr(self.allocator)}")
        if not isinstance(self.alloc_conf, str):
            raise OptionError("alloc_conf", f"expected text such as expandable_segments:True, got "
                              f"{short_repr(self.alloc_conf)}")
        if self.alloc_conf.strip():                   # (empty: torch's defaults; nothing to refuse or import)
            self.allocator_options()                  # refuses a setting the replay cannot model
        set_(self, "min_layers", integer("min_layers", self.min_layers, 1))
        set_(self, "max_layers", integer("max_layers", self.max_layers, 1, optional=True))
        if self.max_layers is not None and self.max_layers < self.min_layers:
            raise OptionError("max_layers", f"expected at least min_layers ({self.min_layers}), got {self.max_layers}")
        set_(self, "pin_splits", strings("pin_splits", self.pin_splits, what="layer names"))
        pins = []
        for name, position in pairs("pin_layers", self.pin_layers, what="(layer name, device position) pairs"):
            if not isinstance(name, str):
                raise OptionError("pin_layers", f"expected a layer name, got {short_repr(name)}")
            pins.append((name, integer("pin_layers", position, 0, self.devices - 1)))
        set_(self, "pin_layers", tuple(pins))
        set_(self, "link_bandwidth", number("link_bandwidth", self.link_bandwidth, 1, 1e300, optional=True))
        set_(self, "efficiency", number("efficiency", self.efficiency, 0, 1, low_open=True))
        compute = []
        for name, value in mapping_items("layer_compute", self.layer_compute, what="a mapping of layer names to "
                                         "compute figures"):
            if not isinstance(name, str):
                raise OptionError("layer_compute", f"expected layer names as keys, got {short_repr(name)}")
            compute.append((name, read_layer_figure(value, f"[{name!r}]", _compute_number, _refuse)))
        set_(self, "layer_compute", tuple(compute))
        if self.layer_compute_source is not None and not isinstance(self.layer_compute_source, str):
            raise OptionError("layer_compute_source", f"expected a file path, got {short_repr(self.layer_compute_source)}")
        set_(self, "time_limit", number("time_limit", self.time_limit, 0, MAX_TIME_LIMIT, low_open=True))
        set_(self, "workers", integer("workers", self.workers, 1, MAX_WORKERS))
        if not isinstance(self.layering, LayerOptions):
            raise OptionError("layering", f"expected a LayerOptions, got {type(self.layering).__name__}")

    def data_layout(self) -> DataLayout:
        """The data-parallel layout the request asks for (``DataLayout``: dp ranks, ZeRO stage)."""
        return DataLayout(self.dp, self.zero, self.reshard_after_forward, pipelined=self.schedule is not Schedule.NONE)

    def with_devices(self, devices: int) -> SolveRequest:
        """The same request for another device count (one target, or the list repeated)."""
        targets = self.targets
        if len(targets) > 1:
            targets = tuple(targets[i % len(targets)] for i in range(devices))
        return replace(self, devices=devices, targets=targets,
                       pin_layers=tuple(p for p in self.pin_layers if p[1] < devices),
                       origins=tuple(o for o in self.origins if o[0] != "devices"))

    def overridden(self, **changes: Any) -> SolveRequest:
        """The request with ``changes`` (arguments: no file gave them, so none names them)."""
        return replace(self, **changes, origins=tuple(o for o in self.origins if o[0] not in changes))

    def resolved_targets(self) -> tuple[Target, ...]:
        """The targets as records (names and YAML paths loaded, each distinct one once: a list of
        256 devices names two targets)."""
        loaded: dict[str, Target] = {}
        for t in self.targets:
            if isinstance(t, str) and t not in loaded:
                loaded[t] = load_target(t)
        return tuple(loaded[t] if isinstance(t, str) else t for t in self.targets)

    def allocator_options(self) -> AllocatorOptions:
        """The caching allocator's settings the replay models (``alloc_conf`` read as torch reads it)."""
        # imported here: numpy is not loaded to build the parser
        from ..model.allocator import parse_alloc_conf
        return parse_alloc_conf(self.alloc_conf, parameter="alloc_conf")

    def resolved_chunks(self) -> int:
        """The chunks (virtual stages) each device runs: the count asked for, else the schedule's
        own: one for none, GPipe and 1F1B (and ``auto``, which tries each count itself), the fixed
        count of a V-shaped schedule, two for the looped ones. The one place this default is
        decided: the solve, the plan's record and the micro-batch default all read it here."""
        if self.chunks_per_rank is not None:
            return self.chunks_per_rank
        if self.schedule.one_stage_per_device or self.schedule is Schedule.AUTO:
            return 1
        from .schedule_kinds import ScheduleKind, traits
        return traits(ScheduleKind(self.schedule.value)).fixed_chunks_per_rank or 2

    # -- settings files and the plan's record ---------------------------------------------------
    @classmethod
    def from_settings(cls, path: str | Path | None = None, devices: int = 1, **overrides: Any) -> SolveRequest:
        """A request whose defaults come from a solver settings file (``configs/solver.yaml``
        when ``path`` is None), ``overrides`` that are not None winning. The file's fields are
        this record's (``stages: exact`` is ``exact: true``); a bad one is named in the file."""
        file = Path(path) if path is not None else config_dir() / "solver.yaml"
        data = read_yaml_file(file) if path is not None else read_shipped_yaml(file)     # the shipped one: C-parsed
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ProfileError(file, "", "a mapping of solver settings", type(data).__name__)
        known = SETTINGS_FIELDS
        for key in data:
            if key not in known:
                raise ProfileError(file, str(key), "a known setting (" + ", ".join(known) + ")")
        values = {k: yaml_number(v) for k, v in data.items() if k != "stages"}
        keys = {k: k for k in values}
        if "stages" in data:
            if data["stages"] not in ("at-most", "exact"):
                raise ProfileError(file, "stages", "one of at-most, exact", data["stages"])
            values["exact"], keys["exact"] = data["stages"] == "exact", "stages"
        given = {k: v for k, v in overrides.items() if v is not None}
        combined = {**values, **given}
        origins = tuple((k, str(file), keys[k]) for k in values if k not in given)
        # a value a flag overrides is still checked, alone (schedule auto takes any chunks per rank),
        # so that a bad file is refused; the values used are checked together, the file's with the
        # flags' (a file's chunks_per_rank with --schedule), each error naming where its value came from
        for key in values:
            if key in given:
                alone = {key: values[key]} if key == "schedule" else {"schedule": Schedule.AUTO, key: values[key]}
                cls(devices=1, **alone, origins=((key, str(file), keys[key]),))
        return cls(devices=devices, **combined, origins=origins)

    def to_record(self) -> dict[str, Any]:
        """Every option as plain JSON values (targets in full), enough to run the solve again."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "origins":
                continue
            value = getattr(self, f.name)
            if isinstance(value, Enum):
                value = value.value
            elif f.name == "targets":
                value = [target_record(t) for t in self.resolved_targets()]
            elif f.name == "layering":
                value = value.to_record()
            elif f.name in ("pin_layers", "pin_splits"):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            elif f.name == "layer_compute":
                value = {k: figure_record(v) for k, v in value}
            out[f.name] = value
        return out

    @classmethod
    def from_record(cls, record: Any, source: str, prefix: str = "request") -> SolveRequest:
        """The request a plan recorded (``to_record``), every field checked: a bad one raises
        ``ProfileError`` naming ``source`` (the plan file) and the field (``request.devices``)."""
        if not isinstance(record, Mapping):
            raise ProfileError(source, prefix, "a mapping of solve options", type(record).__name__)
        known = {f.name for f in fields(cls)} - {"origins"}
        unknown = sorted(str(k) for k in record if k not in known)
        if unknown:
            raise ProfileError(source, f"{prefix}.{unknown[0]}", "a known option (" + ", ".join(sorted(known)) + ")")
        if "devices" not in record:
            raise ProfileError(source, f"{prefix}.devices", "the number of devices (an integer >= 1)")
        values = dict(record)
        targets = values.get("targets", ())
        if isinstance(targets, (str, Mapping)) or not isinstance(targets, list):
            raise ProfileError(source, f"{prefix}.targets", "a list of target records", targets)
        values["targets"] = tuple(target_from_mapping(t.get("name", "target"), t, source, f"{prefix}.targets[{i}]")
                                  if isinstance(t, Mapping) else _bad(source, f"{prefix}.targets[{i}]",
                                                                      "a target record (a mapping)", t)
                                  for i, t in enumerate(targets))
        if "layering" in values:
            values["layering"] = LayerOptions.from_record(values["layering"], source, f"{prefix}.layering")
        origins = [(k, source, f"{prefix}.{k}") for k in values]
        if "layering" in values:                 # its errors name the pattern (layer_regex...) or layer_order
            origins += [(name, source, f"{prefix}.layering.{name}") for name in LayerOptions.REGEX_FIELDS]
            origins.append(("layer_order", source, f"{prefix}.layering.order"))
        try:
            return cls(**values, origins=tuple(origins))
        except FileOptionError:
            raise
        except OptionError as exc:
            raise ProfileError(source, f"{prefix}.{exc.parameter}", exc.detail.removeprefix("expected ")) from None


#: the fields a solver settings file may set (solver/options.py; ``stages`` is the file's name for
#: ``exact``, which the file may also set by its own name)
SETTINGS_FIELDS = tuple(k for key in SETTINGS_KEYS for k in ((key, "exact") if key == "stages" else (key,)))


def strings_or_targets(parameter: str, value: Any) -> tuple[str | Target, ...]:
    """Target names, YAML paths or ``Target`` records."""
    if isinstance(value, (bytes, Mapping)) or value is None:
        raise OptionError(parameter, f"expected target names, YAML paths or Target records, got {short_repr(value)}")
    try:
        items = tuple(value)
    except TypeError:
        raise OptionError(parameter, f"expected target names, YAML paths or Target records, "
                          f"got {short_repr(value)}") from None
    for t in items:
        if not isinstance(t, (str, Target)):
            raise OptionError(parameter, f"expected target names, YAML paths or Target records, got {short_repr(t)}")
    return items


def _bad(source: str, path: str, expected: str, got: Any) -> NoReturn:
    raise ProfileError(source, path, expected, got)


def _compute_number(field: str, value: Any) -> float:
    """One number of ``layer_compute``'s ``field`` (``['0']``, ``['0'].forward``)."""
    try:
        return number("layer_compute", value, 0, MAX_COMPUTE)
    except OptionError as exc:
        raise OptionError("layer_compute", exc.detail, subject=field) from None


def _refuse(field: str, expected: str, got: Any) -> NoReturn:
    raise OptionError("layer_compute", f"expected {expected}, got {got}", subject=field)
