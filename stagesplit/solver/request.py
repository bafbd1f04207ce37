"""The options of a solve, defined once: what the user chooses, by name (layers and targets),
as one frozen record. The Python API (``stagesplit.solve``), the command line, the solver
settings file and a plan's record of its run all go through ``SolveRequest``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any, Mapping

from ..errors import OptionError
from ..layers import LayerOptions
from ..io.profile import Target


class Objective(str, Enum):
    """What the split minimises first (ties broken by the other two)."""

    COMPUTE = "compute"     #: the slowest stage's time
    MEMORY = "memory"       #: the fullest stage's worst tile
    DEVICES = "devices"     #: the number of devices used


class Schedule(str, Enum):
    """The pipeline schedule, which sets the micro-batches whose stashed activations a stage holds."""

    NONE = "none"
    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"


class SharedPolicy(str, Enum):
    """Where items no layer uses (global buffers, constants) are counted."""

    EVERY = "every"         #: on every stage (safe: an under-estimate gives a plan that does not fit)
    NONE = "none"           #: on no stage (PopLiner's assumption that they spread out)


def _enum(kind: type[Enum], parameter: str, value: Any) -> Enum:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        raise OptionError(parameter, f"expected one of {', '.join(k.value for k in kind)}, got {value!r}") from None


def _integer(parameter: str, value: Any, minimum: int, maximum: int | None = None, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        top = f" and <= {maximum:,}" if maximum is not None else ""
        raise OptionError(parameter, f"expected an integer >= {minimum}{top}, got {value!r}")
    return int(value)


def _number(parameter: str, value: Any, low: float, high: float, *, low_open: bool = False, high_open: bool = False,
            optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise OptionError(parameter, f"expected a number in {left}{low:g}, {high:g}{right}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SolveRequest:
    """Everything a solve depends on besides the profile. Layers are named as ``breakdown``
    shows them; targets by name (``stagesplit targets``), YAML path, or ``Target``."""

    devices: int
    #: one target for every device, or one per device; empty: the profile's own device
    targets: tuple[str | Target, ...] = ()
    objective: Objective = Objective.COMPUTE
    #: use exactly ``devices`` devices (default: at most)
    exact: bool = False
    schedule: Schedule = Schedule.NONE
    #: micro-batches per step; None: the number of devices with a schedule, else 1
    micro_batches: int | None = None
    #: fraction of every device kept free
    headroom: float = 0.0
    #: bytes kept back on every device (CUDA context, workspaces)
    reserve: int = 0
    min_layers: int = 1
    max_layers: int | None = None
    #: a stage starts at each of these layers
    pin_splits: tuple[str, ...] = ()
    #: (layer, device position) pairs
    pin_layers: tuple[tuple[str, int], ...] = ()
    #: add the transfer time of the bytes crossing each cut to stage time
    communication: bool = False
    #: device-to-device bytes per second (default: the target's, else the profile's)
    link_bandwidth: float | None = None
    #: achieved over peak FLOP/s on the target
    efficiency: float = 1.0
    shared: SharedPolicy = SharedPolicy.EVERY
    #: per-layer compute replacing the profile's (in its compute unit)
    layer_compute: tuple[tuple[str, float], ...] = ()
    #: where ``layer_compute`` came from (a file path), for the plan's record
    layer_compute_source: str | None = None
    layering: LayerOptions = field(default_factory=LayerOptions)
    #: CP-SAT seconds per objective phase, and search workers (1 is deterministic)
    time_limit: float = 60.0
    workers: int = 1
    #: also plan PopLiner's greedy split and a uniform split, for comparison
    compare: bool = False
    #: the greedy baseline puts the unlayered operations on the first stage, as PopLiner does
    unlayered_first: bool = False

    def __post_init__(self) -> None:
        from ..common.safeinput import MAX_DEVICES, MAX_MICRO_BATCHES, MAX_TIME_LIMIT, MAX_WORKERS
        set_ = object.__setattr__
        set_(self, "devices", _integer("devices", self.devices, 1, MAX_DEVICES))
        targets = (self.targets,) if isinstance(self.targets, (str, Target)) else tuple(self.targets or ())
        for t in targets:
            if not isinstance(t, (str, Target)):
                raise OptionError("targets", f"expected target names, YAML paths or Target records, got {t!r}")
        if len(targets) not in (0, 1, self.devices):
            raise OptionError("targets", f"give one target or {self.devices} (one per device), got {len(targets)}")
        set_(self, "targets", targets)
        set_(self, "objective", _enum(Objective, "objective", self.objective))
        set_(self, "schedule", _enum(Schedule, "schedule", self.schedule))
        set_(self, "shared", _enum(SharedPolicy, "shared", self.shared))
        set_(self, "micro_batches", _integer("micro_batches", self.micro_batches, 1, MAX_MICRO_BATCHES, optional=True))
        set_(self, "headroom", _number("headroom", self.headroom, 0, 1, high_open=True))
        set_(self, "reserve", _integer("reserve", self.reserve, 0))
        set_(self, "min_layers", _integer("min_layers", self.min_layers, 1))
        set_(self, "max_layers", _integer("max_layers", self.max_layers, 1, optional=True))
        if self.max_layers is not None and self.max_layers < self.min_layers:
            raise OptionError("max_layers", f"expected at least min_layers ({self.min_layers}), got {self.max_layers}")
        pins = (self.pin_splits,) if isinstance(self.pin_splits, str) else tuple(self.pin_splits)
        set_(self, "pin_splits", tuple(str(p) for p in pins))
        layers = self.pin_layers.items() if isinstance(self.pin_layers, Mapping) else self.pin_layers
        pairs = []
        for item in layers:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise OptionError("pin_layers", f"expected (layer name, device position) pairs, got {item!r}")
            pairs.append((str(item[0]), _integer("pin_layers", item[1], 0, self.devices - 1)))
        set_(self, "pin_layers", tuple(pairs))
        set_(self, "link_bandwidth", _number("link_bandwidth", self.link_bandwidth, 1, 1e300, optional=True))
        set_(self, "efficiency", _number("efficiency", self.efficiency, 0, 1, low_open=True))
        compute = self.layer_compute.items() if isinstance(self.layer_compute, Mapping) else self.layer_compute
        set_(self, "layer_compute", tuple((str(k), _number("layer_compute", v, 0, 1e300)) for k, v in compute))
        set_(self, "time_limit", _number("time_limit", self.time_limit, 0, MAX_TIME_LIMIT, low_open=True))
        set_(self, "workers", _integer("workers", self.workers, 1, MAX_WORKERS))
        if not isinstance(self.layering, LayerOptions):
            raise OptionError("layering", f"expected a LayerOptions, got {type(self.layering).__name__}")

    def with_devices(self, devices: int) -> "SolveRequest":
        """The same request for another device count (one target, or the list repeated)."""
        targets = self.targets
        if len(targets) > 1:
            targets = tuple(targets[i % len(targets)] for i in range(devices))
        return replace(self, devices=devices, targets=targets,
                       pin_layers=tuple(p for p in self.pin_layers if p[1] < devices))

    # -- the plan's record ----------------------------------------------------------------------
    def to_record(self) -> dict[str, Any]:
        """Every option as plain JSON values (targets in full), enough to run the solve again."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Enum):
                value = value.value
            elif f.name == "targets":
                value = [_target_record(t) for t in value]
            elif f.name == "layering":
                value = asdict(value)
            elif f.name in ("pin_layers", "pin_splits"):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            elif f.name == "layer_compute":
                value = {k: v for k, v in value}
            out[f.name] = value
        return out

    @classmethod
    def from_record(cls, record: Mapping[str, Any], source: str = "plan") -> "SolveRequest":
        """The request a plan recorded (``to_record``); targets come back in full."""
        from ..io.targets import target_from_mapping
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in record.items() if k in known}
        values["targets"] = tuple(target_from_mapping(t.get("name", "target"), {k: v for k, v in t.items()},
                                                      source, f"inputs.request.targets[{i}]")
                                  if isinstance(t, dict) else t for i, t in enumerate(values.get("targets", ())))
        if "layering" in values:
            values["layering"] = LayerOptions(**values["layering"])
        values["pin_layers"] = tuple(tuple(p) for p in values.get("pin_layers", ()))
        values["pin_splits"] = tuple(values.get("pin_splits", ()))
        values["layer_compute"] = tuple((values.get("layer_compute") or {}).items())
        return cls(**values)


def _target_record(target: str | Target) -> dict[str, Any] | str:
    from ..io.targets import load_target
    t = load_target(target) if isinstance(target, str) else target
    return {"name": t.name, "kind": t.kind, "description": t.description, "tiles": t.tiles,
            "bytes_per_tile": t.bytes_per_tile, "clock_hz": t.clock_hz, "link_bytes_per_s": t.link_bytes_per_s,
            "flops_per_s": t.flops_per_s, "memory_bytes_per_s": t.memory_bytes_per_s}


def request_from_settings(settings, devices: int, **overrides: Any) -> SolveRequest:
    """A request from a solver settings file (``config.SolverSettings``), flags winning."""
    base = dict(objective=settings.objective, exact=settings.stages == "exact", schedule=settings.schedule,
                micro_batches=settings.micro_batches, headroom=settings.headroom, shared=settings.shared,
                time_limit=settings.time_limit, workers=settings.workers, communication=settings.communication)
    base.update({k: v for k, v in overrides.items() if v is not None})
    return SolveRequest(devices=devices, **base)

