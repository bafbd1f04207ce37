"""The split problem in integers: what every solver (CP-SAT, the exact oracle, the greedy
baseline) works on, so they optimise exactly the same thing.

Layers ``0..L-1`` are cut into at most (or exactly) N contiguous stages, one per device
position ``0..N-1`` in device order; with "at most", a position may stay empty. A non-empty
stage at position ``i`` holding layers ``a..e-1`` must fit: its worst tile, with ``k``
micro-batches' stashed activations in flight, stays within the position's per-tile capacity.

* Stage time = compute of its layers (+ transfer time of the bytes crossing its two cuts when
  communication is on), in integer time units.
* Stage memory cost = worst-tile bytes (or parts per million of capacity on mixed devices).
* In-flight micro-batches ``k``: 1 with no schedule; M for GPipe; for 1F1B, stage ``s`` of a
  P-stage pipeline holds ``min(M, P - s)``, i.e. one more than the stages after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..common.validate import choice, integer, number
from ..errors import OptionError, StagesplitError
from ..io.profile import Target
from ..model.costmodel import RangeTable, StageCostModel
from ..model.traffic import Traffic
from .request import Objective, Schedule

__all__ = ["Evaluation", "OBJECTIVES", "SCHEDULES", "SolveOptions", "Split", "SplitProblem", "TIME_SCALE_LIMIT",
           "bubble_fraction", "build_problem", "evaluate", "in_flight", "in_flight_values", "resolve_micro_batches",
           "schedule_note", "stage_capacities", "stage_in_flight", "with_devices"]

OBJECTIVES = tuple(o.value for o in Objective)
SCHEDULES = tuple(s.value for s in Schedule)
TIME_SCALE_LIMIT = 10**9


@dataclass(frozen=True)
class SolveOptions:
    """A ``SolveRequest`` resolved against one profile (``api.resolve``): layer names become
    indices, targets become per-position capacities, the micro-batch count is chosen. Its own
    invariants are checked when it is made; what needs the layer count (pins) once, when the
    problem is built (``check_layers``)."""

    devices: int
    objective: Objective = Objective.COMPUTE
    exact: bool = False
    schedule: Schedule = Schedule.NONE
    micro_batches: int = 1
    micro_batches_auto: bool = False                 # M not given: M = devices x chunks per device (kept so)
    chunks_per_device: int = 1                       # what a defaulted M multiplies the device count by
    headroom: float = 0.0
    capacities: tuple[int, ...] | None = None       # bytes per tile per device position
    reserve: int = 0                                 # bytes per device kept back (CUDA context, workspaces)
    min_layers: int = 1
    max_layers: int | None = None
    pinned_splits: tuple[int, ...] = ()              # a stage starts at each of these layers
    pinned_layers: tuple[tuple[int, int], ...] = ()  # (layer, device position)
    communication: bool = False
    link_bytes_per_s: float | None = None
    time_limit: float = 60.0
    workers: int = 1

    def __post_init__(self) -> None:
        # the record's own invariants (it is also built directly, in layer indices, by tools and tests)
        object.__setattr__(self, "objective", choice(Objective, "objective", self.objective))
        object.__setattr__(self, "schedule", choice(Schedule, "schedule", self.schedule))
        integer("devices", self.devices, 1)
        integer("micro_batches", self.micro_batches, 1)
        number("headroom", self.headroom, 0, 1, high_open=True)
        integer("reserve", self.reserve, 0)
        integer("min_layers", self.min_layers, 1)
        if self.max_layers is not None and integer("max_layers", self.max_layers, 1) < self.min_layers:
            raise OptionError("max_layers", f"expected at least min_layers ({self.min_layers}), got {self.max_layers}")
        if self.capacities is not None and len(self.capacities) != self.devices:
            raise OptionError("targets", f"{len(self.capacities)} device capacities given for {self.devices} devices")

    def check_layers(self, num_layers: int) -> None:
        """Raise OptionError for pins that cannot be used with ``num_layers`` layers."""
        for j in self.pinned_splits:
            if not 0 < j < num_layers:
                raise OptionError("pin_splits", f"a split before layer index {j}: expected 1..{num_layers - 1} "
                                  "(a stage cannot start at the first layer's position twice)")
        for layer, position in self.pinned_layers:
            if not 0 <= layer < num_layers or not 0 <= position < self.devices:
                raise OptionError("pin_layers", f"layer {layer} pinned to stage {position}: expected a layer in "
                                  f"0..{num_layers - 1} and a stage in 0..{self.devices - 1}")
        if self.communication and not self.link_bytes_per_s:
            raise OptionError("link_bandwidth", "communication cost needs a link bandwidth: the target has none; "
                              "give one")


def in_flight(schedule: str, micro_batches: int, stage: int, stages: int) -> int:
    """Micro-batches whose stashed activations stage ``stage`` (0-based) of ``stages`` holds."""
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return max(1, min(micro_batches, stages - stage))
    return 1


def in_flight_values(schedule: str, micro_batches: int, max_stages: int) -> tuple[int, ...]:
    """Every in-flight count a stage can have in a pipeline of at most ``max_stages`` stages."""
    if schedule == "gpipe":
        return (micro_batches,)
    if schedule == "1f1b":
        return tuple(range(1, min(micro_batches, max_stages) + 1))
    return (1,)


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle share of a synchronous pipeline step (GPipe and 1F1B alike): (P-1)/(M+P-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


@dataclass
class SplitProblem:
    """Integer tables shared by all solvers. ``table`` gives the worst-tile bytes of layers a..b
    with k micro-batches in flight, on the band of ranges that can fit (``stage_bytes``,
    ``band``); a range outside it does not fit any position (it reads as ``OVER``)."""

    options: SolveOptions
    num_layers: int
    capacity: np.ndarray                 # (N,) bytes per tile, after headroom
    in_flight_values: tuple[int, ...]
    table: RangeTable                    # covers capacity.max()
    time_up: np.ndarray                  # (L+1,) prefix compute + cut cost: stage time = up[e] - down[a]
    time_down: np.ndarray
    time_scale: float                    # time units per profile compute unit
    homogeneous: bool
    seconds_per_unit: float | None
    cut_units: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    time_unit: str = "cycles"            # the user's unit of stage time (the profile's compute unit)

    def user_value(self, quantity: str, value: int | None) -> float | int | None:
        """A solver-side objective value in the user's units: stage time in ``time_unit``
        (transfers included), memory in bytes per tile (a fraction of capacity on mixed
        devices), devices as a count."""
        if value is None:
            return None
        scale = self.objective_scale(quantity)
        return int(value) if scale == 1 else float(value) / scale

    def objective_scale(self, quantity: str) -> float:
        """Solver units per user unit (see ``user_value``)."""
        if quantity == "time":
            return float(self.time_scale)
        if quantity == "memory" and not self.homogeneous:
            return 1_000_000.0
        return 1

    @property
    def devices(self) -> int:
        return self.options.devices

    def k_index(self, k: int) -> int:
        """Index of an in-flight count in ``in_flight_values``."""
        return self.in_flight_values.index(k)

    def stage_time(self, a: int, e: int) -> int:
        """Integer time of the stage holding layers a..e-1 (e > a)."""
        return int(self.time_up[e] - self.time_down[a])

    @property
    def width(self) -> int:
        """The most layers a stage that fits anywhere can hold (the band's width)."""
        return self.table.width

    def stage_bytes(self, k: int, a: int, e: int) -> int:
        """Worst-tile bytes of layers a..e-1 with ``k`` micro-batches in flight (OVER when the
        range is longer than any stage that fits)."""
        return self.table.bytes_of(k, a, e - 1)

    def band(self, k: int) -> np.ndarray:
        """(L, W): bytes of the stage a..a+j with ``k`` in flight, j < ``width`` (OVER past the end)."""
        return self.table.band(k)

    def mem_cost(self, position: int, k: int, a: int, e: int) -> int:
        """Memory objective value of layers a..e-1 at a position: bytes, or ppm of capacity on
        mixed devices."""
        nbytes = self.stage_bytes(k, a, e)
        if self.homogeneous:
            return nbytes
        return math.ceil(nbytes * 1_000_000 / int(self.capacity[position]))

    def fits(self, position: int, k: int, a: int, e: int) -> bool:
        """Whether layers a..e-1 fit at ``position`` with ``k`` micro-batches in flight."""
        return self.stage_bytes(k, a, e) <= int(self.capacity[position])

    def allowed(self, position: int, a: int, e: int) -> bool:
        """Layer-count, pinned-split and pinned-layer rules for a non-empty stage."""
        o = self.options
        n = e - a
        if n < o.min_layers or (o.max_layers is not None and n > o.max_layers):
            return False
        if any(a < j < e for j in o.pinned_splits):
            return False
        for layer, pos in o.pinned_layers:
            if (a <= layer < e) != (pos == position):
                return False
        return True

    def empty_allowed(self, position: int) -> bool:
        """Whether device position ``position`` may hold no stage."""
        return not self.options.exact and all(pos != position for _, pos in self.options.pinned_layers)


def stage_capacities(target: Target, options: SolveOptions) -> tuple[np.ndarray, bool]:
    """(bytes per tile each device position offers after headroom and reserve, whether the
    devices are all alike)."""
    n = options.devices
    raw_caps = np.array(options.capacities if options.capacities else [target.bytes_per_tile] * n, np.int64)
    capacity = np.floor(raw_caps * (1.0 - options.headroom)).astype(np.int64)
    if options.reserve:             # per device; spread over its tiles (a GPU is one tile)
        capacity = capacity - -(-int(options.reserve) // target.tiles)
        if (capacity <= 0).any():
            raise StagesplitError(f"--reserve {options.reserve:,} bytes leaves no memory on a device "
                                  f"({int(raw_caps.min()) * target.tiles:,} bytes)")
    return capacity, bool(np.all(raw_caps == raw_caps[0]))


def build_problem(model: StageCostModel, options: SolveOptions, traffic: Traffic | None = None,
                  table: RangeTable | None = None, progress=None) -> SplitProblem:
    """Price the ranges that can fit (unless ``table`` is given and covers them) and build the
    integer tables."""
    L = model.num_layers
    options.check_layers(L)
    target = model.profile.target
    n = options.devices
    capacity, homogeneous = stage_capacities(target, options)
    ks = in_flight_values(options.schedule, options.micro_batches, n)
    if table is None or not table.supports(ks) or not table.covers(int(capacity.max())):
        table = model.price_ranges(ks, progress=progress, capacity=int(capacity.max()))

    compute = np.nan_to_num(model.layer_compute, nan=0.0)
    seconds = target.seconds_per_unit(model.profile.compute_unit)
    time_unit = model.profile.compute_unit
    layer_time = getattr(model, "layer_time_s", None)
    if layer_time is not None:      # roofline seconds on the chosen target (stagesplit/roofline.py)
        compute, seconds, time_unit = np.asarray(layer_time, float), 1.0, "seconds"
    cut_seconds = np.zeros(L + 1)
    if options.communication:
        traffic = traffic or _traffic(model)
        cut_seconds = traffic.cut_bytes / float(options.link_bytes_per_s)
        if seconds is None:
            raise StagesplitError(f"communication cost needs compute in time units: the profile's compute is in "
                                  f"{model.profile.compute_unit} and target {target.name} cannot convert it")
    cut_units_raw = cut_seconds / seconds if options.communication else np.zeros(L + 1)
    total = float(compute.sum() + 2 * cut_units_raw.sum())
    # integral up to float noise (100 bytes / 1e9 B/s in 1 ns cycles is 99.99999999...)
    integral = all(np.allclose(x, np.round(x), rtol=0, atol=1e-6) for x in (compute, cut_units_raw))
    if integral:
        compute, cut_units_raw = np.round(compute), np.round(cut_units_raw)
    scale = 1.0 if (integral and total <= TIME_SCALE_LIMIT) or total == 0 else TIME_SCALE_LIMIT / total
    prefix = np.concatenate([[0], np.cumsum(np.round(compute * scale).astype(np.int64))])
    cut_units = np.round(cut_units_raw * scale).astype(np.int64)
    return SplitProblem(options=options, num_layers=L, capacity=capacity, in_flight_values=ks, table=table,
                        time_up=prefix + cut_units, time_down=prefix - cut_units, time_scale=scale,
                        homogeneous=homogeneous, seconds_per_unit=seconds,
                        cut_units=cut_units, time_unit=time_unit)


def _traffic(model: StageCostModel) -> Traffic:
    from ..model.traffic import layer_traffic
    return layer_traffic(model)


@dataclass(frozen=True)
class Split:
    """A solution: the first layer of each device position's stage, and where the last one
    ends. ``starts[i] == starts[i+1]`` means position i is empty."""

    bounds: tuple[int, ...]

    @property
    def stages(self) -> list[tuple[int, int, int]]:
        """(position, first layer, last layer) of every non-empty stage."""
        return [(i, a, e - 1) for i, (a, e) in enumerate(zip(self.bounds[:-1], self.bounds[1:])) if e > a]

    @property
    def devices_used(self) -> int:
        return len(self.stages)


@dataclass(frozen=True)
class Evaluation:
    """The objective values of a split: (bottleneck time, worst memory cost, devices used)."""

    feasible: bool
    time: int
    memory: int
    devices: int
    reason: str = ""

    def key(self, objective: str) -> tuple[int, int]:
        if objective == "compute":
            return (self.time, self.memory)
        if objective == "memory":
            return (self.memory, self.time)
        return (self.devices, self.time)


def stage_in_flight(problem: SplitProblem, split: Split) -> list[int]:
    """In-flight micro-batches of each non-empty stage of ``split``, in stage order."""
    o = problem.options
    stages = split.stages
    return [in_flight(o.schedule, o.micro_batches, s, len(stages)) for s in range(len(stages))]


def evaluate(problem: SplitProblem, split: Split) -> Evaluation:
    """Check a split against every rule and compute its objective values."""
    b = split.bounds
    L, N = problem.num_layers, problem.devices
    if len(b) != N + 1 or b[0] != 0 or b[-1] != L or any(x > y for x, y in zip(b[:-1], b[1:])):
        return Evaluation(False, 0, 0, 0, "bounds are not a split of the layers over the devices")
    stages = split.stages
    ks = stage_in_flight(problem, split)
    times, mems = [], []
    for (position, first, last), k in zip(stages, ks):
        a, e = first, last + 1
        if not problem.allowed(position, a, e):
            return Evaluation(False, 0, 0, 0, f"stage {position} breaks a layer-count or pin rule")
        if not problem.fits(position, k, a, e):
            return Evaluation(False, 0, 0, 0, f"stage {position} does not fit")
        times.append(problem.stage_time(a, e))
        mems.append(problem.mem_cost(position, k, a, e))
    for i in range(N):
        if b[i] == b[i + 1] and not problem.empty_allowed(i):
            return Evaluation(False, 0, 0, 0, f"position {i} must hold a stage")
    if any(not any(x == j for x in b) for j in problem.options.pinned_splits):
        return Evaluation(False, 0, 0, 0, "a pinned split is missing")
    return Evaluation(True, max(times), max(mems), len(stages))


def with_devices(options: SolveOptions, devices: int) -> SolveOptions:
    """The same options for another device count: capacities repeat, a defaulted micro-batch
    count follows the count, pins to positions beyond it are dropped."""
    caps = options.capacities
    if caps is not None and len(caps) != devices:
        caps = tuple(caps[i % len(caps)] for i in range(devices))
    micro = devices * options.chunks_per_device if options.micro_batches_auto else options.micro_batches
    return replace(options, devices=devices, capacities=caps, micro_batches=micro,
                   pinned_layers=tuple(p for p in options.pinned_layers if p[1] < devices))


def resolve_micro_batches(schedule: str, micro_batches: int | None, devices: int) -> tuple[int, bool]:
    """The micro-batch count to use and whether it was defaulted: with a schedule and no count
    given, the number of devices, the fewest micro-batches that fill a pipeline of that many
    stages (one micro-batch would make any schedule the same as none)."""
    if micro_batches is None:
        return (devices, True) if schedule != "none" else (1, False)
    return micro_batches, False


def schedule_note(options: SolveOptions) -> str:
    """What the user should know about the micro-batch count ('' when nothing)."""
    o = options
    if o.schedule == "none":
        return ""
    if o.micro_batches_auto:
        return (f"--micro-batches not given: using {o.micro_batches}, the number of devices (the fewest "
                f"micro-batches that fill a {o.micro_batches}-stage {o.schedule.value} pipeline)")
    if o.micro_batches == 1:
        return (f"--schedule {o.schedule.value} with 1 micro-batch holds one micro-batch per stage, the same as "
                f"--schedule none: give --micro-batches M (at least the number of stages) to model the pipeline")
    return ""
