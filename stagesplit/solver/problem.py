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

**Profile variants** (``build_variant_problem``): several profiles of the same model compiled
another way (an IPU's ``availableMemoryProportion``), each with its own priced ranges and stage
times (``SplitProblem.variants``). A stage may take any variant that fits it there; which one is
chosen with the split. Every objective is a maximum over stages and each earlier optimum bounds
every stage, so choosing per stage stays exact: a stage's value in a pass is the best of the
variants that fit it and keep the earlier bounds (``choose_variants`` says which a split gets).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..common.text import show
from ..common.validate import choice, integer, number
from ..errors import OptionError, StagesplitError
from ..io.profile import Target
from ..model.costmodel import RangeTable, StageCostModel
from ..model.rangetable import OVER
from ..model.traffic import Traffic
from .request import Objective, Schedule

__all__ = ["BandBytes", "Evaluation", "OBJECTIVES", "SCHEDULES", "SolveOptions", "Split", "SplitProblem", "StageVariant",
           "TIME_SCALE_LIMIT", "VARIANT_ORDER", "bubble_fraction", "build_problem", "build_variant_problem", "choose_variants",
           "evaluate_split", "in_flight", "in_flight_values", "kept_back_from", "resolve_micro_batches", "schedule_note",
           "stage_capacities", "stage_in_flight", "with_devices"]

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
    micro_batches_auto: bool = False                 # M not given: M = devices x chunks per rank (kept so)
    chunks_per_rank: int = 1                         # what a defaulted M multiplies the device count by
    headroom: float = 0.0
    capacities: tuple[int, ...] | None = None       # bytes per tile per device position
    reserve: int = 0                                 # bytes per device kept back (the request's own)
    #: per device position, bytes kept back beyond ``reserve`` for what the profile does not hold (on a
    #: GPU: the CUDA context and NCCL's buffers, solver/runtime_reserve.py); empty: none
    kept_back: tuple[int, ...] = ()
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
        if self.kept_back and (len(self.kept_back) != self.devices or min(self.kept_back) < 0):
            raise OptionError("runtime_reserve", f"expected {self.devices} byte counts >= 0 kept back, one per "
                              f"device, got {len(self.kept_back)}")
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


@dataclass(frozen=True)
class StageVariant:
    """One profile variant of the model: its name (for the plan), the memory proportion it was
    compiled with (None: not given), its priced ranges and its integer stage times (on the
    problem's common time scale: stage time = ``time_up[e] - time_down[a]``)."""

    name: str
    proportion: float | None
    table: RangeTable
    time_up: np.ndarray
    time_down: np.ndarray


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
    #: profile variants a stage may take (``table``, ``time_up`` and ``time_down`` are the first's);
    #: empty: one profile
    variants: tuple[StageVariant, ...] = ()

    @property
    def variant_count(self) -> int:
        return len(self.variants) or 1

    def variant_tables(self) -> list[tuple[RangeTable, np.ndarray, np.ndarray]]:
        """(priced ranges, time_up, time_down) of each variant (the problem's own with none)."""
        if not self.variants:
            return [(self.table, self.time_up, self.time_down)]
        return [(v.table, v.time_up, v.time_down) for v in self.variants]

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
        """The most layers a stage that fits anywhere can hold (the widest variant's band)."""
        return max(t.width for t, _, _ in self.variant_tables())

    def width_for(self, k: int, capacity: int) -> int:
        """The longest stage that fits ``capacity`` with ``k`` in flight in any variant (0: none)."""
        return max(t.width_for(k, capacity) for t, _, _ in self.variant_tables())

    def stage_options(self, position: int, k: int, a: int, e: int) -> list[tuple[int, int, int]]:
        """(variant, time, memory cost) of each variant in which layers a..e-1 fit at
        ``position`` with ``k`` in flight (one entry at most without variants)."""
        out = []
        for v, (table, up, down) in enumerate(self.variant_tables()):
            nbytes = table.bytes_of(k, a, e - 1)
            if nbytes <= int(self.capacity[position]):
                out.append((v, int(up[e] - down[a]), self._memory_cost(position, nbytes)))
        return out

    def _memory_cost(self, position: int, nbytes: int) -> int:
        if self.homogeneous:
            return nbytes
        return math.ceil(nbytes * 1_000_000 / int(self.capacity[position]))

    def stage_bytes(self, k: int, a: int, e: int) -> int:
        """Worst-tile bytes of layers a..e-1 with ``k`` micro-batches in flight (OVER when the
        range is longer than any stage that fits); with variants, the first variant's (as
        ``stage_time``, ``band``, ``mem_cost`` and ``fits``; ``stage_options`` has them all)."""
        return self.table.bytes_of(k, a, e - 1)

    def band(self, k: int) -> np.ndarray:
        """(L, W): bytes of the stage a..a+j with ``k`` in flight, j < ``width`` (OVER past the end)."""
        return self.table.band(k)

    def mem_cost(self, position: int, k: int, a: int, e: int) -> int:
        """Memory objective value of layers a..e-1 at a position: bytes, or ppm of capacity on
        mixed devices."""
        return self._memory_cost(position, self.stage_bytes(k, a, e))

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
            raise OptionError("reserve", f"{options.reserve:,} bytes leaves no memory on a device "
                              f"({int(raw_caps.min()) * target.tiles:,} bytes)")
    return kept_back_from(capacity, options, target.tiles), bool(np.all(raw_caps == raw_caps[0]))


def kept_back_from(capacity: np.ndarray, options: SolveOptions, tiles: int = 1) -> np.ndarray:
    """``capacity`` (bytes per tile per device position) less what ``options`` keeps back per device
    beyond its reserve (``kept_back``, spread over the device's tiles)."""
    if not options.kept_back:
        return capacity
    kept = np.array([-(-int(k) // tiles) for k in options.kept_back], np.int64)
    out: np.ndarray = capacity - kept
    if (out <= 0).any():
        i = int(np.argmin(out))
        raise OptionError("runtime_reserve", f"{options.kept_back[i]:,} bytes kept back for the CUDA context, "
                          f"NCCL's buffers and the allocator leave no memory on device {i} "
                          f"({int(capacity[i]) * tiles:,} bytes after the reserve)")
    return out


#: progress of the pricing: (ranges done, ranges in all)
_Progress = Callable[[int, int], None]


def build_problem(model: StageCostModel, options: SolveOptions, traffic: Traffic | None = None,
                  table: RangeTable | None = None, progress: _Progress | None = None) -> SplitProblem:
    """Price the ranges that can fit (unless ``table`` is given and covers them) and build the
    integer tables."""
    return _build([model], options, traffic, [table], progress)[0]


def build_variant_problem(models: Sequence[StageCostModel], names: Sequence[str],
                          proportions: Sequence[float | None], options: SolveOptions,
                          traffic: Traffic | None = None, tables: Sequence[RangeTable | None] | None = None,
                          progress: _Progress | None = None) -> SplitProblem:
    """The split problem of several profile variants of one model (see the module docstring):
    the same layers and device, each variant's ranges priced (unless its entry of ``tables``
    covers them) and its stage times on one common integer scale. The bytes crossing a cut are
    the model's, not the compile's: the first variant's (or ``traffic``) serve every variant."""
    if not models or not (len(models) == len(names) == len(proportions)):
        raise ValueError("one name and one proportion per variant model")
    first = models[0]
    for name, m in zip(names[1:], models[1:]):
        if m.num_layers != first.num_layers:
            raise StagesplitError(f"variant {show(name)} has {m.num_layers} layers, the first ({show(names[0])}) "
                                  f"{first.num_layers}: variants must be profiles of the same model")
        a, b = m.profile.target, first.profile.target
        if (a.tiles, a.bytes_per_tile) != (b.tiles, b.bytes_per_tile):
            raise StagesplitError(f"variant {show(name)} was compiled for {a.tiles:,} tiles x {a.bytes_per_tile:,} "
                                  f"bytes, the first ({show(names[0])}) for {b.tiles:,} x {b.bytes_per_tile:,}: "
                                  "variants must be compiled for the same device")
    if options.communication and traffic is None:
        traffic = _traffic(first)
    problem, priced, ups, downs = _build(list(models), options, traffic,
                                         list(tables) if tables is not None else [None] * len(models), progress)
    problem.variants = tuple(StageVariant(str(n), None if p is None else float(p), t, up, down)
                             for n, p, t, up, down in zip(names, proportions, priced, ups, downs))
    return problem


def _raw_times(model: StageCostModel, options: SolveOptions,
               traffic: Traffic | None) -> tuple[np.ndarray, np.ndarray, float | None, str]:
    """(each layer's compute, each cut's transfer in compute units, seconds per unit, the unit)."""
    L = model.num_layers
    target = model.profile.target
    compute = np.nan_to_num(model.layer_compute, nan=0.0)
    seconds = target.seconds_per_unit(model.profile.compute_unit)
    time_unit = model.profile.compute_unit
    layer_time = getattr(model, "layer_time_s", None)
    if layer_time is not None:      # roofline seconds on the chosen target (stagesplit/roofline.py)
        compute, seconds, time_unit = np.asarray(layer_time, float), 1.0, "seconds"
    cut_units_raw = np.zeros(L + 1)
    if options.communication:
        traffic = traffic or _traffic(model)
        assert options.link_bytes_per_s is not None       # SolveOptions checks: communication needs it
        cut_seconds = traffic.cut_bytes / float(options.link_bytes_per_s)
        if seconds is None:
            raise StagesplitError(f"communication cost needs compute in time units: the profile's compute is in "
                                  f"{model.profile.compute_unit} and target {target.name} cannot convert it")
        cut_units_raw = cut_seconds / seconds
    return compute, cut_units_raw, seconds, time_unit


def _build(models: list[StageCostModel], options: SolveOptions, traffic: Traffic | None,
           tables: list[RangeTable | None], progress: _Progress | None
           ) -> tuple[SplitProblem, list[RangeTable], list[np.ndarray], list[np.ndarray]]:
    """The problem of ``models`` (one, or the variants of one model), stage times on one scale,
    with each model's priced ranges, ``time_up`` and ``time_down``."""
    model = models[0]
    L = model.num_layers
    options.check_layers(L)
    target = model.profile.target
    n = options.devices
    capacity, homogeneous = stage_capacities(target, options)
    ks = in_flight_values(options.schedule, options.micro_batches, n)
    priced: list[RangeTable] = []
    for m, table in zip(models, tables):
        if table is None or not table.supports(ks) or not table.covers(int(capacity.max())):
            table = m.price_ranges(ks, progress=progress, capacity=int(capacity.max()))
        priced.append(table)
    raws = [_raw_times(m, options, traffic) for m in models]
    units = {raw[3] for raw in raws}
    if len(units) > 1:
        raise StagesplitError(f"the variants give stage times in different units ({', '.join(sorted(units))}): "
                              "variants must be profiles of one kind")
    total = max(float(c.sum() + 2 * cut.sum()) for c, cut, _, _ in raws)
    # integral up to float noise (100 bytes / 1e9 B/s in 1 ns cycles is 99.99999999...)
    integral = all(np.allclose(x, np.round(x), rtol=0, atol=1e-6) for c, cut, _, _ in raws for x in (c, cut))
    scale = 1.0 if (integral and total <= TIME_SCALE_LIMIT) or total == 0 else TIME_SCALE_LIMIT / total
    ups, downs, cuts = [], [], []
    for compute, cut_units_raw, _, _ in raws:
        if integral:
            compute, cut_units_raw = np.round(compute), np.round(cut_units_raw)
        prefix = np.concatenate([[0], np.cumsum(np.round(compute * scale).astype(np.int64))])
        cut_units = np.round(cut_units_raw * scale).astype(np.int64)
        ups.append(prefix + cut_units)
        downs.append(prefix - cut_units)
        cuts.append(cut_units)
    _, _, seconds, time_unit = raws[0]
    problem = SplitProblem(options=options, num_layers=L, capacity=capacity, in_flight_values=ks, table=priced[0],
                           time_up=ups[0], time_down=downs[0], time_scale=scale, homogeneous=homogeneous,
                           seconds_per_unit=seconds, cut_units=cuts[0], time_unit=time_unit)
    return problem, priced, ups, downs


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
    #: with profile variants, the variant each non-empty stage takes (``choose_variants``)
    variants: tuple[int, ...] = ()

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


#: the per-stage quantities a split's variants are chosen by, in order, for each objective (the
#: devices objective fixes the count with the split: then the fastest, then the least memory)
VARIANT_ORDER = {"compute": (1, 2), "memory": (2, 1), "devices": (1, 2)}


def choose_variants(objective: str, options: list[list[tuple[int, int, int]]]) -> list[tuple[int, int, int]]:
    """The variant each stage of one split takes, given each stage's ``(variant, time, memory
    cost)`` options that fit (``SplitProblem.stage_options``): the lexicographic optimum of
    ``objective`` over the split's choices (first the bottleneck of the objective's quantity,
    each stage at its best; then the other quantity's bottleneck within that bound), and within
    both bounds each stage's fastest variant (then the least memory, then the first listed)."""
    first, second = VARIANT_ORDER[getattr(objective, "value", objective)]
    bound1 = max(min(o[first] for o in opts) for opts in options)
    bound2 = max(min(o[second] for o in opts if o[first] <= bound1) for opts in options)
    return [min((o for o in opts if o[first] <= bound1 and o[second] <= bound2), key=lambda o: (o[1], o[2], o[0]))
            for opts in options]


def evaluate_split(problem: SplitProblem, split: Split) -> Evaluation:
    """Check a split against every rule and compute its objective values (with profile
    variants, those of the variants ``choose_variants`` gives its stages)."""
    b = split.bounds
    L, N = problem.num_layers, problem.devices
    if len(b) != N + 1 or b[0] != 0 or b[-1] != L or any(x > y for x, y in zip(b[:-1], b[1:])):
        return Evaluation(False, 0, 0, 0, "bounds are not a split of the layers over the devices")
    stages = split.stages
    ks = stage_in_flight(problem, split)
    options = []
    for (position, first, last), k in zip(stages, ks):
        a, e = first, last + 1
        if not problem.allowed(position, a, e):
            return Evaluation(False, 0, 0, 0, f"stage {position} breaks a layer-count or pin rule")
        fitting = problem.stage_options(position, k, a, e)
        if not fitting:
            return Evaluation(False, 0, 0, 0, f"stage {position} does not fit"
                              + (" with any profile variant" if problem.variants else ""))
        options.append(fitting)
    for i in range(N):
        if b[i] == b[i + 1] and not problem.empty_allowed(i):
            return Evaluation(False, 0, 0, 0, f"position {i} must hold a stage")
    if any(not any(x == j for x in b) for j in problem.options.pinned_splits):
        return Evaluation(False, 0, 0, 0, "a pinned split is missing")
    chosen = choose_variants(problem.options.objective.value, options)
    return Evaluation(True, max(t for _, t, _ in chosen), max(m for _, _, m in chosen), len(stages),
                      variants=tuple(v for v, _, _ in chosen) if problem.variants else ())


def with_devices(options: SolveOptions, devices: int) -> SolveOptions:
    """The same options for another device count: capacities repeat, a defaulted micro-batch
    count follows the count, pins to positions beyond it are dropped."""
    caps = options.capacities
    if caps is not None and len(caps) != devices:
        caps = tuple(caps[i % len(caps)] for i in range(devices))
    micro = devices * options.chunks_per_rank if options.micro_batches_auto else options.micro_batches
    kept = options.kept_back
    if kept and len(kept) != devices:
        kept = tuple(kept[i % len(kept)] for i in range(devices))
    return replace(options, devices=devices, capacities=caps, micro_batches=micro, kept_back=kept,
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
        return (f"`micro_batches` not given: using {o.micro_batches}, the number of devices (the fewest "
                f"micro-batches that fill a {o.micro_batches}-stage {o.schedule.value} pipeline)")
    if o.micro_batches == 1:
        return (f"`schedule='{o.schedule.value}'` with 1 micro-batch holds one micro-batch per stage, the same as "
                "`schedule='none'`: give `micro_batches=M` (at least the number of stages) to model the pipeline")
    return ""


class BandBytes:
    """Worst-tile bytes of every band range of ``problem`` with ``k`` micro-batches in flight, in
    variant ``v``, as an (L, W) array padded to the search's width with OVER; the last few counts
    are kept. The exact DP and CP-SAT read the same arrays."""

    def __init__(self, problem: SplitProblem):
        self.tables = problem.variant_tables()
        self.L, self.W = problem.num_layers, max(problem.width, 1)
        self._kept: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, k: int, v: int = 0) -> np.ndarray:
        band = self._kept.get((k, v))
        if band is None:
            band = self.tables[v][0].band(k)
            if band.shape[1] < self.W:
                band = np.concatenate([band, np.full((self.L, self.W - band.shape[1]), OVER, np.int64)], axis=1)
            if len(self._kept) >= 4 * len(self.tables):
                self._kept.pop(next(iter(self._kept)))
            self._kept[k, v] = band
        return band
