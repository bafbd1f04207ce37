"""The one in-memory profile model every reader fills and everything downstream uses.

A profile describes one model compiled (or run) on a single device: the device (``Target``),
the ordered program steps that form the liveness timeline, the variables with their sizes,
tiles and liveness, the programs with their per-tile code costs, and the operations that tie
names, programs and variables together. The PopVision data model is the richest case; a GPU is
a device with one tile, and the per-layer form maps onto the same records.

Everything large is a numpy array; variable-length lists are stored as ``Ragged`` (CSR).
Step intervals are half-open ``[start, end)``; operation step ranges are inclusive
``[first_step, last_step]``, as in libpva.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from ..errors import ProfileError

__all__ = ["AUTOCAST_DTYPES", "COLLECTIVE_GROUPS", "COLLECTIVE_KINDS", "COMPUTE_UNITS", "LAYER_ORDERS", "PARAMETER_DTYPES",
           "PHASE_LABELS", "ROLES", "Collective", "GroundTruth", "LayerGrouping", "Liveness", "Operations",
           "ParallelLayout", "Phase", "Profile", "ProfileInfo", "Programs", "Ragged", "Target", "TileCosts",
           "TrainingPrecision", "Variables", "VertexCode", "batch_of", "gathers_logits", "loss_parallel_of",
           "narrowest_int"]

COMPUTE_UNITS = ("cycles", "flops", "seconds", "none")
LAYER_ORDERS = ("steps", "natural")


class Phase(IntEnum):
    """The part of a training step an operation belongs to (``Operations.phase``).

    Zero-bubble pipeline schedules split each backward into B (gradients with respect to the
    stage's inputs, which the previous stage needs at once) and W (gradients with respect to
    weights, which can wait); activation checkpointing re-runs forward operations inside the
    backward (RECOMPUTE). UNKNOWN where the source does not say."""

    UNKNOWN = 0
    FORWARD = 1
    BACKWARD_INPUT = 2
    BACKWARD_WEIGHT = 3
    OPTIMIZER = 4
    RECOMPUTE = 5

    @property
    def label(self) -> str:
        """The lowercase name the file formats use (``backward_weight``)."""
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Phase:
        return cls[label.upper()]


PHASE_LABELS = tuple(p.label for p in Phase)

#: What a variable is to the training step (``Variables.role``, by index): data-parallel
#: sharding (ZeRO, FSDP) divides parameters, gradients and optimizer state differently, so a
#: profile that is to be sharded must say which is which. ``unknown`` where the source does
#: not say (profiles written before roles existed, PopVision, the per-layer form).
ROLES = ("unknown", "param", "grad", "state", "buffer", "other")


@dataclass(frozen=True)
class Target:
    """The device a profile was captured on, or a device to split onto.

    A GPU is a device with one tile whose ``bytes_per_tile`` is the whole device memory.
    """

    name: str
    tiles: int
    bytes_per_tile: int
    clock_hz: float | None = None
    kind: str = "ipu"
    link_bytes_per_s: float | None = None
    flops_per_s: float | None = None
    description: str = ""
    memory_bytes_per_s: float | None = None

    @property
    def device_bytes(self) -> int:
        return self.tiles * self.bytes_per_tile

    def seconds_per_unit(self, unit: str) -> float | None:
        """Seconds per unit of compute in ``unit``, or None when the target cannot say."""
        if unit == "seconds":
            return 1.0
        if unit == "cycles" and self.clock_hz:
            return 1.0 / self.clock_hz
        if unit == "flops" and self.flops_per_s:
            return 1.0 / self.flops_per_s
        return None


@dataclass
class Ragged:
    """A list of variable-length rows stored as CSR: row ``i`` is ``values[offsets[i]:offsets[i+1]]``."""

    offsets: np.ndarray
    values: np.ndarray

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence], dtype=np.int64, width: int | None = None) -> Ragged:
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = [x for r in rows for x in r]
        shape = (len(flat),) if width is None else (len(flat), width)
        values = np.array(flat, dtype=dtype).reshape(shape) if flat else np.zeros(shape, dtype=dtype)
        return cls(offsets, values)

    @classmethod
    def empty(cls, rows: int, dtype=np.int64, width: int | None = None) -> Ragged:
        shape = (0,) if width is None else (0, width)
        return cls(np.zeros(rows + 1, dtype=np.int64), np.zeros(shape, dtype=dtype))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int | np.integer[Any]) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row_ids(self) -> np.ndarray:
        """The row index of every value (the CSR expanded to COO)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths())

    def tolist(self) -> list[list]:
        return [self[i].tolist() for i in range(len(self))]


@dataclass
class Liveness:
    """Liveness classes: class ``c`` is live on the half-open step intervals ``intervals[c]``.

    Variables that share a liveness pattern share a class (PopVision's equivalence classes).
    ``intervals.values`` has shape (K, 2): columns are start and end (end exclusive).
    """

    intervals: Ragged

    def __len__(self) -> int:
        return len(self.intervals)


@dataclass
class Variables:
    """Lowered variables: one entry per (tensor piece, tile).

    ``live_class`` indexes ``Liveness``; it is -1 for always-live variables and for variables
    that are never live. ``name`` indexes ``Profile.names`` (-1: unnamed). ``role`` indexes
    ``ROLES`` (int8, one per variable), or is None when the source records no roles at all.
    """

    bytes: np.ndarray
    tile: np.ndarray
    always_live: np.ndarray
    live_class: np.ndarray
    name: np.ndarray
    role: np.ndarray | None = None

    def role_of(self, label: str) -> np.ndarray:
        """A mask of the variables whose role is ``label`` (all false when roles are unknown)."""
        if self.role is None:
            return np.zeros(len(self.bytes), bool)
        return np.asarray(self.role) == ROLES.index(label)

    def __len__(self) -> int:
        return len(self.bytes)


@dataclass
class TileCosts:
    """Sparse per-tile bytes of one code category, owned by programs: (program, tile, bytes)."""

    program: np.ndarray
    tile: np.ndarray
    bytes: np.ndarray

    @classmethod
    def empty(cls) -> TileCosts:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.bytes)


@dataclass
class VertexCode:
    """Vertex code per (program, tile, vertex type). Code is shared on a tile: a stage pays
    for each vertex type present on a tile once, however many programs use it."""

    program: np.ndarray
    tile: np.ndarray
    vertex_type: np.ndarray
    bytes: np.ndarray

    @classmethod
    def empty(cls) -> VertexCode:
        z = np.zeros(0, np.int64)
        return cls(z, z.copy(), z.copy(), z.copy())

    def __len__(self) -> int:
        return len(self.bytes)


@dataclass
class Programs:
    """Compiled programs and their per-tile code costs.

    ``cycles`` is a compute estimate per program (NaN where unknown); ``vertices`` the number
    of vertex instances it runs (used to estimate compute when no cycle estimate exists).
    """

    name: list[str]
    kind: list[str]
    cycles: np.ndarray
    vertices: np.ndarray
    vertex_types: list[str]
    vertex_code: VertexCode
    vertex_state: TileCosts
    exchange_code: TileCosts
    control_code: TileCosts

    def __len__(self) -> int:
        return len(self.name)

    @classmethod
    def empty(cls) -> Programs:
        return cls([], [], np.zeros(0), np.zeros(0, np.int64), [], VertexCode.empty(),
                   TileCosts.empty(), TileCosts.empty(), TileCosts.empty())

    def categories(self) -> dict[str, TileCosts]:
        """The additive code categories (vertex code, which is shared per type, is separate)."""
        return {"vertex_state": self.vertex_state, "exchange_code": self.exchange_code,
                "control_code": self.control_code}


@dataclass
class Operations:
    """High-level operations (framework ops), in program order.

    ``layer`` holds an explicit layer name where the source states one (per-layer profiles,
    PyTorch captures), else None and the layer comes from the layer regex. ``first_step`` and
    ``last_step`` are inclusive; -1 where unknown. ``compute`` is NaN where unknown, in which
    case it is derived from the operation's programs.
    """

    name: list[str]
    debug_id: np.ndarray
    inputs: list[tuple[str, ...]]
    first_step: np.ndarray
    last_step: np.ndarray
    vars: Ragged
    programs: Ragged
    compute: np.ndarray
    layer: list[str | None]
    # None given: __post_init__ fills both in (always arrays after construction)
    bytes_accessed: np.ndarray = None  # type: ignore[assignment]  # bytes read + written per operation; NaN where unknown
    #: the ``Phase`` of every operation (int8; ``Phase.UNKNOWN`` where the source does not say)
    phase: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.bytes_accessed is None:
            self.bytes_accessed = np.full(len(self.name), np.nan)
        if self.phase is None:
            self.phase = np.full(len(self.name), Phase.UNKNOWN, np.int8)

    def __len__(self) -> int:
        return len(self.name)


@dataclass
class GroundTruth:
    """What the profile itself says the memory was (PopVision's own totals), for comparison.

    Per tile: ``always_live`` and ``not_always_live`` (peak over steps) variable bytes and the
    profile's memory categories. ``step_tiles``/``step_bytes`` give the not-always-live bytes
    at every step for a few tiles (usually the most loaded ones).
    """

    always_live: np.ndarray
    not_always_live: np.ndarray
    categories: dict[str, np.ndarray] = field(default_factory=dict)
    step_tiles: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_bytes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    def tile_total(self) -> np.ndarray:
        total = self.always_live + self.not_always_live
        for values in self.categories.values():
            total = total + values
        return total


@dataclass(frozen=True)
class LayerGrouping:
    """How the profile's source grouped operations into layers, recorded so that every later
    command groups the same way unless told otherwise.

    ``layer_regex`` and the other patterns are what ``layers.LayerOptions`` holds; ``layers``
    are the layer names in order and ``module_paths`` each layer's module path (None where it
    has none). ``method`` says how the layers were found: ``module-tree`` (the repeated blocks
    of the model's module stacks; ``layer_regex`` then reads the same layers from the names)
    or ``regex`` (the user's layer regex). ``traced_stages``: the layers are one stack's blocks, but a
    torch-pipelining export traces the model's stages with ``pipeline()`` instead of building them from
    its modules (it is not a Hugging Face causal language model: BERT, MPNet), so a tensor its layers
    share past a neighbour crosses every stage boundary between them."""

    method: str
    layer_regex: str
    first_layer_regex: str
    last_layer_regex: str
    call_regex: str
    order: str = "steps"
    layers: tuple[str, ...] = ()
    module_paths: tuple[str | None, ...] = ()
    traced_stages: bool = False

    def module_path_of(self, layer: str) -> str | None:
        """The recorded module path of ``layer`` (None when not recorded)."""
        try:
            return self.module_paths[self.layers.index(layer)]
        except ValueError:
            return None


#: the collectives a capture records (torch's ``_c10d_functional`` operations, ``wait_tensor`` aside)
COLLECTIVE_KINDS = ("all_reduce", "all_reduce_coalesced", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
                    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast")


@dataclass(frozen=True)
class Collective:
    """One collective one rank runs in the step: at operation ``step`` (its index), of ``kind``
    (``COLLECTIVE_KINDS``), moving a buffer of ``bytes`` (the whole buffer: an all-gather's
    output, a reduction's input), in a group of ``group_size`` ranks, in ``phase`` (forward,
    loss, backward, recompute, optimizer), so that the step's time can price it. ``group``: the
    mesh dimension the group spans, ``tp`` (tensor parallelism: on every layer's critical path) or
    ``cp`` (context parallelism's ring exchange: overlapped with the attention)."""

    step: int
    kind: str
    bytes: int
    group_size: int
    phase: str
    group: str = "tp"


def gathers_logits(styles: Sequence[tuple[str, str]]) -> bool:
    """Whether a tensor-parallel plan's (module, style) pairs gather a head's output onto every rank
    (``colwise_gather_output``: a Hugging Face plan's head)."""
    return any(style == "colwise_gather_output" for _, style in styles)


def loss_parallel_of(styles: Sequence[tuple[str, str]]) -> bool:
    """Whether a tensor-parallel plan keeps a head's logits split on the vocabulary, its step run under
    torch's ``loss_parallel()`` (``colwise_loss_parallel``: torchtitan's and Megatron's head)."""
    return any(style == "colwise_loss_parallel" for _, style in styles)


@dataclass(frozen=True)
class ParallelLayout:
    """The layout a profile's one rank was captured in (absent: the whole model on one device).

    ``tensor_parallel`` ranks share every layer, with ``sequence_parallel`` between the blocks;
    ``plan`` says where the plan came from, ``styles`` each planned module's style and
    ``additions`` what sequence parallelism added (module, what); ``heads`` the heads and
    key/value heads a rank really holds per sharded attention; ``collectives`` what the rank
    communicates. ``context_parallel`` ranks share each sequence (the rank holds one shard of
    it, attention runs as a ring over the ranks' key/value blocks), ``cp_load_balanced`` where the
    shards are torch's head and tail chunks."""

    tensor_parallel: int = 1
    sequence_parallel: bool = False
    plan: str = ""
    styles: tuple[tuple[str, str], ...] = ()
    additions: tuple[tuple[str, str], ...] = ()
    heads: tuple[tuple[str, int, int], ...] = ()
    collectives: tuple[Collective, ...] = ()
    context_parallel: int = 1
    cp_load_balanced: bool = False
    #: ranks the routed experts are split over, and each experts module with its expert count
    expert_parallel: int = 1
    experts: tuple[tuple[str, int], ...] = ()


#: the mesh dimensions a recorded collective may span
COLLECTIVE_GROUPS = ("tp", "cp", "ep")

#: the dtypes a captured step's parameters may be held in, and the ones autocast may compute in
PARAMETER_DTYPES = ("float32", "bfloat16", "float16")
AUTOCAST_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class TrainingPrecision:
    """How the captured step held its numbers, which the exports must set for the program that runs
    to be the one priced: parameters in ``parameters``; under ``autocast`` (a dtype, "" for none)
    torch's autocast computes in it; with ``master_weights`` each gradient is accumulated in a
    float32 copy and the optimizer updates float32 master weights (Megatron's ``--bf16``,
    DeepSpeed's ``bf16``)."""

    parameters: str = "float32"
    autocast: str = ""
    master_weights: bool = False

    def describe(self) -> str:
        """The precision in words, as the capture's description says it."""
        if self.autocast:
            return f"amp ({self.autocast} autocast, {self.parameters} parameters)"
        if self.master_weights:
            return f"{self.parameters} parameters with float32 gradients and master weights"
        return self.parameters


@dataclass
class ProfileInfo:
    """Descriptive fields: where the profile came from."""

    name: str = ""
    source: str = ""
    description: str = ""
    synthetic: bool = False
    compute_source: str = ""
    warnings: list[str] = field(default_factory=list)
    #: the grouping the source used (captures record theirs), or None
    layer_grouping: LayerGrouping | None = None
    #: the parallel layout of the rank the profile holds (captures at a tensor-parallel degree), or None
    parallel_layout: ParallelLayout | None = None
    #: the precision the step was captured in (a capture records it), or None where unknown
    precision: TrainingPrecision | None = None
    #: the samples per batch the step was captured with (a capture records its inputs' leading
    #: dimension, which the layout search scales activations and work from), or None where unknown
    batch_size: int | None = None
    #: SHA-256 of the file the profile was read from, computed from the same bytes as it was
    #: read (None for a profile built in memory)
    sha256: str | None = field(default=None, compare=False)
    #: the file it was read from (None for a profile built in memory)
    path: str | None = field(default=None, compare=False)


def batch_of(shapes: Iterable[Sequence[Any]]) -> int | None:
    """The samples per batch of a step whose inputs have ``shapes``: the leading dimension every input
    of one or more dimensions shares, where one of them has two or more (batch first, as Hugging Face,
    timm, torchvision and their ONNX exports take their inputs). None where there is no such dimension
    (inputs of several leading sizes, vectors alone, a dimension unknown or empty): the profile then
    records no batch, and the layout search takes the size it is given."""
    shaped = [tuple(s) for s in shapes if len(s) >= 1]
    leading = {s[0] for s in shaped}
    if len(leading) != 1 or not any(len(s) >= 2 for s in shaped):
        return None
    size = leading.pop()
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else None


@dataclass
class Profile:
    """A profile: the device, the steps, and the variables, liveness, programs and operations of one
    compiled (or captured) step, with what its source recorded about it."""

    target: Target
    steps: list[str]
    names: list[str]
    variables: Variables
    liveness: Liveness
    programs: Programs
    operations: Operations
    compute_unit: str = "cycles"
    ground_truth: GroundTruth | None = None
    info: ProfileInfo = field(default_factory=ProfileInfo)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def variable_name(self, v: int) -> str:
        """Variable ``v``'s name, or var#v when it has none."""
        idx = int(self.variables.name[v])
        return self.names[idx] if idx >= 0 else f"var#{v}"

    def validate(self, source: str | None = None) -> Profile:
        """Check every cross-reference and range; raise ProfileError naming the first bad field."""
        _validate(self, source)
        return self


def narrowest_int(values: np.ndarray) -> np.ndarray:
    """Integers in the narrowest of int8/int16/int32/int64 that holds them all: how the compact
    writer stores profile arrays and the PopVision reader keeps its per-program costs (tens of
    millions of entries). Users widen before arithmetic."""
    values = np.asarray(values)
    if values.size == 0:
        return values.astype(np.int32)
    low, high = int(values.min()), int(values.max())
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return values.astype(dtype)
    return values.astype(np.int64, copy=False)


# --------------------------------------------------------------------------------------------
# Validation. Field paths use the JSON format's names so a message points into the user's file.

def _first_bad(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if len(bad) else None


def _check_range(source, values: np.ndarray, low: int, high: int, path_of, expected: str) -> None:
    """Every value in low..high (inclusive); two reductions, and a mask only when one is not
    (a profile's per-program code arrays run to tens of millions of entries)."""
    if len(values) and (values.min() < low or values.max() > high):
        _check(source, (values < low) | (values > high), path_of, expected, values)


def _check(source, mask: np.ndarray, path_of, expected: str, values: np.ndarray) -> None:
    i = _first_bad(mask)
    if i is not None:
        raise ProfileError(source, path_of(i), expected, values[i].item() if hasattr(values[i], "item") else values[i])


def _row_path(ragged: Ragged, prefix: str, member: str):
    def path(k: int) -> str:                           # the row is found only when there is an error
        r = int(np.searchsorted(ragged.offsets, k, side="right")) - 1
        return f"{prefix}[{r}].{member}[{k - int(ragged.offsets[r])}]"
    return path


def _validate(p: Profile, source: str | None) -> None:
    t = p.target
    if t.tiles < 1:
        raise ProfileError(source, "target.tiles", "an integer >= 1", t.tiles)
    if t.bytes_per_tile < 1:
        raise ProfileError(source, "target.bytes_per_tile", "an integer >= 1", t.bytes_per_tile)
    if p.compute_unit not in COMPUTE_UNITS:
        raise ProfileError(source, "compute_unit", "one of " + ", ".join(COMPUTE_UNITS), p.compute_unit)
    steps = p.num_steps
    v = p.variables
    n = len(v)
    for name in ("tile", "always_live", "live_class", "name"):
        if len(getattr(v, name)) != n:
            raise ProfileError(source, f"variables.{name}", f"{n} entries (one per variable)", len(getattr(v, name)))
    _check(source, v.bytes < 0, lambda i: f"variables[{i}].bytes", "an integer >= 0", v.bytes)
    if v.role is not None:
        if len(v.role) != n:
            raise ProfileError(source, "variables.role", f"{n} entries (one per variable)", len(v.role))
        _check_range(source, np.asarray(v.role), 0, len(ROLES) - 1, lambda i: f"variables[{i}].role",
                     "one of " + ", ".join(ROLES))
    _check(source, (v.tile < 0) | (v.tile >= t.tiles), lambda i: f"variables[{i}].tile",
           f"a tile index in 0..{t.tiles - 1}", v.tile)
    _check(source, (v.live_class < -1) | (v.live_class >= len(p.liveness)),
           lambda i: f"variables[{i}].live", "a valid liveness class", v.live_class)
    _check(source, (v.name < -1) | (v.name >= len(p.names)), lambda i: f"variables[{i}].name",
           "a valid name index", v.name)
    iv = p.liveness.intervals.values
    if len(iv):
        starts, ends = iv[:, 0], iv[:, 1]
        path = _row_path(p.liveness.intervals, "liveness", "intervals")
        _check(source, (starts < 0) | (starts > steps), path, f"an interval start in 0..{steps}", starts)
        _check(source, (ends < starts) | (ends > steps), path,
               f"an interval end >= its start and <= {steps} (the number of steps)", ends)
        # a variable is live on the union of its intervals: overlaps would count its bytes twice
        rows = p.liveness.intervals.row_ids()
        overlap = np.zeros(len(iv), bool)
        overlap[1:] = (rows[1:] == rows[:-1]) & (starts[1:] < ends[:-1])
        _check(source, overlap, path, "intervals sorted by start, each starting at or after the end of the one "
               "before", starts)

    pr = p.programs
    np_ = len(pr)
    if len(pr.kind) != np_ or len(pr.cycles) != np_ or len(pr.vertices) != np_:
        raise ProfileError(source, "programs", "name, type, cycles and vertices for every program")
    for cat, costs in list(pr.categories().items()) + [("vertex_code", pr.vertex_code)]:
        _check_range(source, costs.program, 0, np_ - 1, lambda i, c=cat: f"programs.{c}[{i}].program",
                     f"a program index in 0..{np_ - 1}")
        _check_range(source, costs.tile, 0, t.tiles - 1, lambda i, c=cat: f"programs.{c}[{i}].tile",
                     f"a tile index in 0..{t.tiles - 1}")
        if len(costs.bytes) and costs.bytes.min() < 0:
            _check(source, costs.bytes < 0, lambda i, c=cat: f"programs.{c}[{i}].bytes", "an integer >= 0",
                   costs.bytes)
    vt = pr.vertex_code.vertex_type
    _check_range(source, vt, 0, len(pr.vertex_types) - 1, lambda i: f"programs.vertex_code[{i}].vertex_type",
                 "a known vertex type")

    ops = p.operations
    no = len(ops)
    for name in ("debug_id", "first_step", "last_step", "compute"):
        if len(getattr(ops, name)) != no:
            raise ProfileError(source, f"operations.{name}", f"{no} entries (one per operation)")
    if len(ops.inputs) != no or len(ops.layer) != no or len(ops.vars) != no or len(ops.programs) != no:
        raise ProfileError(source, "operations", "inputs, layer, vars and programs for every operation")
    fs, ls = ops.first_step, ops.last_step
    known = fs >= 0
    _check(source, (fs < -1) | (fs >= max(steps, 0)) & known, lambda i: f"operations[{i}].first_step",
           f"a step index in 0..{steps - 1} (or -1 if unknown)", fs)
    _check(source, known & ((ls < fs) | (ls >= steps)), lambda i: f"operations[{i}].last_step",
           f"a step index >= first_step and <= {steps - 1} (inclusive)", ls)
    _check(source, ~known & (ls != -1), lambda i: f"operations[{i}].last_step",
           "-1 when first_step is unknown", ls)
    _check_range(source, ops.vars.values, 0, n - 1, _row_path(ops.vars, "operations", "vars"),
                 f"a variable index in 0..{n - 1}")
    _check_range(source, ops.programs.values, 0, np_ - 1, _row_path(ops.programs, "operations", "programs"),
                 f"a program index in 0..{np_ - 1}")
    comp = ops.compute
    _check(source, comp < 0, lambda i: f"operations[{i}].compute", "a number >= 0", comp)
    if len(ops.bytes_accessed) != no:
        raise ProfileError(source, "operations.bytes_accessed", f"{no} entries (one per operation)")
    _check(source, ops.bytes_accessed < 0, lambda i: f"operations[{i}].bytes_accessed", "a number >= 0 (or null)",
           ops.bytes_accessed)
    if len(ops.phase) != no:
        raise ProfileError(source, "operations.phase", f"{no} entries (one per operation)", len(ops.phase))
    _check_range(source, np.asarray(ops.phase), min(Phase), max(Phase), lambda i: f"operations[{i}].phase",
                 "one of " + ", ".join(f"{p.value} ({p.label})" for p in Phase))
    if p.info.layer_grouping is not None:
        _validate_grouping(p.info.layer_grouping, source)
    if p.info.parallel_layout is not None:
        _validate_layout(p.info.parallel_layout, p.num_steps, source)
    if p.info.precision is not None:
        _validate_precision(p.info.precision, source)
    if p.info.batch_size is not None and (isinstance(p.info.batch_size, bool) or not isinstance(p.info.batch_size, int)
                                          or p.info.batch_size < 1):
        raise ProfileError(source, "batch_size", "a whole number of samples >= 1 (or absent)", p.info.batch_size)

    gt = p.ground_truth
    if gt is not None:
        for name, arr in [("always_live", gt.always_live), ("not_always_live", gt.not_always_live)] + [
                (f"categories.{k}", a) for k, a in gt.categories.items()]:
            if len(arr) != t.tiles:
                raise ProfileError(source, f"ground_truth.{name}", f"{t.tiles} values (one per tile)", len(arr))
        if gt.step_bytes.size and gt.step_bytes.shape != (len(gt.step_tiles), steps):
            raise ProfileError(source, "ground_truth.step_trace.bytes",
                               f"one row of {steps} values per traced tile", gt.step_bytes.shape)
        _check(source, (gt.step_tiles < 0) | (gt.step_tiles >= t.tiles), lambda i: f"ground_truth.step_trace.tiles[{i}]",
               f"a tile index in 0..{t.tiles - 1}", gt.step_tiles)


def _validate_grouping(g: LayerGrouping, source: str | None) -> None:
    where = "layer_grouping"
    for name in ("method", "layer_regex", "first_layer_regex", "last_layer_regex", "call_regex", "order"):
        if not isinstance(getattr(g, name), str):
            raise ProfileError(source, f"{where}.{name}", "a string", getattr(g, name))
    if g.order not in LAYER_ORDERS:
        raise ProfileError(source, f"{where}.order", "one of " + ", ".join(LAYER_ORDERS), g.order)
    if len(g.module_paths) != len(g.layers):
        raise ProfileError(source, f"{where}.layers", "a module path (or null) for every layer",
                           f"{len(g.module_paths)} paths for {len(g.layers)} layers")
    seen: set[str] = set()
    for i, (name, path) in enumerate(zip(g.layers, g.module_paths)):
        if not isinstance(name, str) or not name:
            raise ProfileError(source, f"{where}.layers[{i}].name", "a non-empty string", name)
        if name in seen:
            raise ProfileError(source, f"{where}.layers[{i}].name", "a layer name not given before", name)
        seen.add(name)
        if path is not None and (not isinstance(path, str) or not path):
            raise ProfileError(source, f"{where}.layers[{i}].module_path", "a non-empty string or null", path)


def _validate_precision(precision: TrainingPrecision, source: str | None) -> None:
    where = "precision"
    if precision.parameters not in PARAMETER_DTYPES:
        raise ProfileError(source, f"{where}.parameters", "one of " + ", ".join(PARAMETER_DTYPES), precision.parameters)
    if precision.autocast not in ("", *AUTOCAST_DTYPES):
        raise ProfileError(source, f"{where}.autocast", "one of " + ", ".join(AUTOCAST_DTYPES) + " (or absent)",
                           precision.autocast)
    if not isinstance(precision.master_weights, bool):
        raise ProfileError(source, f"{where}.master_weights", "true or false", precision.master_weights)
    if precision.master_weights and (precision.parameters == "float32" or precision.autocast):
        raise ProfileError(source, f"{where}.master_weights", "false with float32 parameters or autocast (master "
                           "weights are float32 copies of low-precision parameters)", precision.master_weights)


def _validate_layout(layout: ParallelLayout, steps: int, source: str | None) -> None:
    where = "parallel_layout"
    if layout.tensor_parallel < 1:
        raise ProfileError(source, f"{where}.tensor_parallel", "a whole number >= 1", layout.tensor_parallel)
    if layout.expert_parallel < 1:
        raise ProfileError(source, f"{where}.expert_parallel", "a whole number >= 1", layout.expert_parallel)
    if layout.context_parallel < 1:
        raise ProfileError(source, f"{where}.context_parallel", "a whole number >= 1", layout.context_parallel)
    for k, c in enumerate(layout.collectives):
        path = f"{where}.collectives[{k}]"
        if not 0 <= c.step < steps:
            raise ProfileError(source, f"{path}.step", f"an operation index in 0..{steps - 1}", c.step)
        if c.kind not in COLLECTIVE_KINDS:
            raise ProfileError(source, f"{path}.kind", "one of " + ", ".join(COLLECTIVE_KINDS), c.kind)
        if c.bytes < 0:
            raise ProfileError(source, f"{path}.bytes", "a byte count >= 0", c.bytes)
        if c.group_size < 1:
            raise ProfileError(source, f"{path}.group_size", "a whole number >= 1", c.group_size)
        if c.group not in COLLECTIVE_GROUPS:
            raise ProfileError(source, f"{path}.group", "one of " + ", ".join(COLLECTIVE_GROUPS), c.group)
