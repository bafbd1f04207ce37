"""A test double of Graphcore's libpva (the Python module ``pva``), for tests and benchmarks.

It imitates the shapes stagesplit relies on (see shared/reference/libpva-api.md): attributes
versus methods (``op.programs()`` and ``step.notAlwaysLiveMemoryForTile(t)`` are methods,
the rest attributes), per-tile arrays with ``target.numTiles`` entries (tiles of ALL IPUs),
equivalence-class step intervals with an EXCLUSIVE ``end``, operation step indices that are
INCLUSIVE, ``_id`` attributes on programs and operation variables, ``debugContext.id`` and
``debugContext.json``, program subclasses per type (only DoExchange programs have
``estimatedCyclesByTile``, only OnTileExecute programs a ``computeset``), and
``pva.Program.Type`` / ``pva.ProgramVisitor``.

Reports are registered under a path (``register``); ``openReport(path, debug)`` returns the
report registered there and, like libpva, fails when the file does not exist. A report can
also live in a file (``write_report_file``: a header, then a stagesplit compact profile) that
``openReport`` reads in any process, building a fresh report on every call as libpva does. Reports can be
built from explicit parts (the classes below) or from a stagesplit Profile
(``report_from_profile``), optionally mirrored onto more IPUs. ``write_debug_cbor`` writes a
small valid debug.cbor. Large per-tile arrays are stored sparse and made dense on access (as
libpva builds a fresh list on every access); every object uses ``__slots__`` so a report can
hold over a million brief variables.

This module imports only the standard library and numpy at import time.
"""

from __future__ import annotations

import enum
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

# ----------------------------------------------------------------------------------------------
# Per-tile arrays


class Sparse:
    """A per-tile array stored as (tiles, values); ``dense()`` gives the numTiles-long array."""

    __slots__ = ("n", "tiles", "values", "dtype")

    def __init__(self, n: int, tiles: Sequence[int] = (), values: Sequence[float] | float = (), dtype=np.int64):
        self.n = int(n)
        self.tiles = np.asarray(tiles, np.int64)
        self.values = np.broadcast_to(np.asarray(values, dtype), self.tiles.shape)
        self.dtype = dtype

    def dense(self) -> np.ndarray:
        out = np.zeros(self.n, self.dtype)
        np.add.at(out, self.tiles, self.values)
        return out


def _dense(value: Any) -> Any:
    return value.dense() if isinstance(value, Sparse) else value


# ----------------------------------------------------------------------------------------------
# Programs


class Program:
    """A compiled program. Use ``make_program`` to get the subclass for a type."""

    class Type(enum.Enum):
        Empty = 0
        Sequence = 1
        Repeat = 2
        RepeatWhileTrue = 3
        RepeatWhileFalse = 4
        If = 5
        Switch = 6
        Call = 7
        Sync = 8
        OnTileExecute = 9
        DoExchange = 10
        GlobalExchange = 11
        StreamCopyBegin = 12
        StreamCopyMid = 13
        StreamCopyEnd = 14
        Copy = 15
        WriteUndef = 16
        Abort = 17

    __slots__ = ("_id", "name", "type", "children", "_vars", "_control", "_code")

    def __init__(self, _id: Any, name: str, type: "Program.Type", children: Sequence["Program"] = (),
                 controlCodeByTile: Any = None, codeBytesByTile: Any = None, vars: Any = ()):
        self._id = _id
        self.name = name
        self.type = type
        self.children = list(children)
        self._control = controlCodeByTile
        self._code = codeBytesByTile
        self._vars = vars

    @property
    def controlCodeByTile(self):
        return _dense(self._control)

    @property
    def codeBytesByTile(self):
        return _dense(self._code)

    @property
    def vars(self) -> list["Variable"]:
        return _variables(self._vars)

    def accept(self, visitor: "ProgramVisitor") -> None:
        getattr(visitor, "visit" + self.type.name)(self)

    def __repr__(self) -> str:
        return f"<pva.Program {self.type.name} {self.name!r} _id={self._id!r}>"


class DoExchangeProgram(Program):
    __slots__ = ("_estimated",)

    def __init__(self, *args, estimatedCyclesByTile: Any = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._estimated = estimatedCyclesByTile

    @property
    def estimatedCyclesByTile(self):
        return _dense(self._estimated)


class OnTileExecuteProgram(Program):
    __slots__ = ("computeset",)

    def __init__(self, *args, computeset: "ComputeSet | None" = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.computeset = computeset if computeset is not None else ComputeSet(self.name, [])


def make_program(_id: Any, name: str, type: "Program.Type | str", *, estimatedCyclesByTile: Any = None,
                 computeset: "ComputeSet | None" = None, **kwargs) -> Program:
    """A program of the right subclass for ``type``."""
    type = Program.Type[type] if isinstance(type, str) else type
    if type is Program.Type.DoExchange:
        return DoExchangeProgram(_id, name, type, estimatedCyclesByTile=estimatedCyclesByTile, **kwargs)
    if estimatedCyclesByTile is not None:
        raise TypeError("only DoExchange programs have estimatedCyclesByTile")
    if type is Program.Type.OnTileExecute:
        return OnTileExecuteProgram(_id, name, type, computeset=computeset, **kwargs)
    if computeset is not None:
        raise TypeError("only OnTileExecute programs have a computeset")
    return Program(_id, name, type, **kwargs)


class ProgramVisitor:
    """Base visitor: one no-op ``visit<Type>`` method per program type."""


for _member in Program.Type:
    setattr(ProgramVisitor, "visit" + _member.name, lambda self, program: None)


class VertexType:
    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int):
        self.name = name
        self.size = size


class ComputeSetVertices:
    """One vertex type in a compute set, with its instance count per tile."""

    __slots__ = ("type", "_count")

    def __init__(self, type: VertexType, countByTile: Any):
        self.type = type
        self._count = countByTile

    @property
    def countByTile(self):
        return _dense(self._count)


class ComputeSet:
    __slots__ = ("name", "vertices", "_estimated")

    def __init__(self, name: str, vertices: Sequence[ComputeSetVertices], estimatedCyclesByTile: Any = None):
        self.name = name
        self.vertices = list(vertices)
        self._estimated = estimatedCyclesByTile

    @property
    def estimatedCyclesByTile(self):
        return _dense(self._estimated) if self._estimated is not None else []


# ----------------------------------------------------------------------------------------------
# Variables and liveness


class Interval:
    """Step interval of an equivalence class: ``end`` is EXCLUSIVE."""

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int):
        self.start = start
        self.end = end


class EquivalenceClass:
    __slots__ = ("id", "steps")

    def __init__(self, id: int, steps: Iterable[tuple[int, int] | Interval]):
        self.id = id
        self.steps = [s if isinstance(s, Interval) else Interval(*s) for s in steps]


class BriefVar:
    __slots__ = ("id", "bytes", "tileId", "equivalenceClass")

    def __init__(self, id: int, bytes: int, tileId: int, equivalenceClass: EquivalenceClass):
        self.id = id
        self.bytes = bytes
        self.tileId = tileId
        self.equivalenceClass = equivalenceClass


class LoweredVariables:
    __slots__ = ("allBriefVars",)

    def __init__(self, allBriefVars: Sequence[BriefVar]):
        self.allBriefVars = allBriefVars


class Variable:
    """A variable as operations and programs list it: only ``_id`` links it to a brief var."""

    __slots__ = ("_id",)

    def __init__(self, _id: int):
        self._id = _id


def _variables(value: Any) -> list[Variable]:
    if isinstance(value, np.ndarray):
        return [Variable(i) for i in value.tolist()]
    return [v if isinstance(v, Variable) else Variable(v) for v in value]


class NamedVariable:
    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int):
        self.name = name
        self.size = size


class MemoryStat:
    __slots__ = ("bytes", "_variables")

    def __init__(self, bytes: int, variables: Any = ()):
        self.bytes = bytes
        self._variables = variables

    @property
    def variables(self) -> list[NamedVariable]:
        v = self._variables
        return list(v() if callable(v) else v)


class LivenessStep:
    """One liveness program step. ``tile_bytes(t)`` gives the not-always-live bytes on tile t
    (a sequence of numTiles values or a callable); ``tile_variables(t)`` the live variables."""

    __slots__ = ("program", "_tile_bytes", "_tile_variables", "_total")

    def __init__(self, program: Program, tile_bytes: Sequence[int] | Callable[[int], int],
                 tile_variables: Callable[[int], list[NamedVariable]] | None = None,
                 total: int | Callable[[], int] | None = None):
        self.program = program
        self._tile_bytes = tile_bytes
        self._tile_variables = tile_variables
        self._total = total

    @property
    def notAlwaysLiveMemory(self) -> MemoryStat:
        total = self._total
        if callable(total):
            total = total()
        elif total is None:
            total = int(np.sum(np.asarray(self._tile_bytes)))
        return MemoryStat(int(total))

    def notAlwaysLiveMemoryForTile(self, tile: int) -> MemoryStat:
        tb = self._tile_bytes
        value = tb(tile) if callable(tb) else tb[tile]
        tv = self._tile_variables
        return MemoryStat(int(value), (lambda: tv(tile)) if tv is not None else ())


# ----------------------------------------------------------------------------------------------
# Tiles and target

CATEGORY_NAMES = ("vertexCode", "internalExchangeCode", "controlCode", "vertexInstanceState", "vectorListDescriptor",
                  "globalExchangeCode", "hostExchangeCode", "constant")


class CategoryMemory:
    __slots__ = ("total",)

    def __init__(self, total: int):
        self.total = total


class Categories:
    """``category.<name>.total``; a category the report lacks is an AttributeError."""

    __slots__ = CATEGORY_NAMES

    def __init__(self, **totals: int):
        for name, total in totals.items():
            setattr(self, name, CategoryMemory(total))


class MemoryTotal:
    __slots__ = ("includingGaps", "excludingGaps")

    def __init__(self, includingGaps: int, excludingGaps: int):
        self.includingGaps = includingGaps
        self.excludingGaps = excludingGaps


class TileVertex:
    """A vertex type present on a tile, with its code size there."""

    __slots__ = ("type", "codeBytes")

    def __init__(self, type: VertexType, codeBytes: int):
        self.type = type
        self.codeBytes = codeBytes


class TileMemory:
    """A tile's memory. Both conventions for ``alwaysLiveBytes`` are possible: with
    ``code_in_always_live`` it already includes the categories (as libpva reports it) and the
    default ``total`` is always-live + not-always-live; without, the default total adds the
    categories. ``total=False`` leaves the ``total`` attribute out (an AttributeError, as for
    a report that lacks it)."""

    __slots__ = ("alwaysLiveBytes", "notAlwaysLiveBytes", "total", "vertices", "category")

    def __init__(self, alwaysLiveBytes: int = 0, notAlwaysLiveBytes: int = 0, vertices: Sequence[TileVertex] = (),
                 category: Categories | None = None, total: "MemoryTotal | None | bool" = None,
                 code_in_always_live: bool = False):
        self.alwaysLiveBytes = alwaysLiveBytes
        self.notAlwaysLiveBytes = notAlwaysLiveBytes
        self.vertices = list(vertices)
        self.category = category if category is not None else Categories()
        if total is False:
            return
        if total is None:
            cats = sum(getattr(self.category, n).total for n in CATEGORY_NAMES if hasattr(self.category, n))
            t = alwaysLiveBytes + notAlwaysLiveBytes + (0 if code_in_always_live else cats)
            total = MemoryTotal(t, t)
        self.total = total


class Tile:
    __slots__ = ("id", "memory")

    def __init__(self, id: int, memory: TileMemory):
        self.id = id
        self.memory = memory


class Target:
    __slots__ = ("tilesPerIpu", "numTiles", "numIPUs", "bytesPerTile", "bytesPerIPU", "totalMemory", "numReplicas",
                 "ipusPerReplica", "tilesPerReplica", "clockFrequency", "type")

    def __init__(self, tilesPerIpu: int, bytesPerTile: int, numIPUs: int = 1, numReplicas: int = 1,
                 clockFrequency: float = 1.33e9, type: str = "IPU"):
        self.tilesPerIpu = tilesPerIpu
        self.numIPUs = numIPUs
        self.numTiles = tilesPerIpu * numIPUs
        self.bytesPerTile = bytesPerTile
        self.bytesPerIPU = bytesPerTile * tilesPerIpu
        self.totalMemory = self.bytesPerIPU * numIPUs
        self.numReplicas = numReplicas
        self.ipusPerReplica = max(1, numIPUs // max(numReplicas, 1))
        self.tilesPerReplica = self.ipusPerReplica * tilesPerIpu
        self.clockFrequency = float(clockFrequency)
        self.type = type


# ----------------------------------------------------------------------------------------------
# Operations and the report


class Location:
    __slots__ = ("fileName", "functionName", "lineNumber")

    def __init__(self, fileName: str = "", functionName: str = "", lineNumber: int = 0):
        self.fileName = fileName
        self.functionName = functionName
        self.lineNumber = lineNumber


class DebugContext:
    __slots__ = ("id", "json", "parents", "location")

    def __init__(self, id: int, json: str = "{}", parents: Sequence["DebugContext"] = (),
                 location: Location | None = None):
        self.id = id
        self.json = json
        self.parents = list(parents)
        self.location = location if location is not None else Location()


class Operation:
    """An operation of OperationAnalysis: ``programs()`` is a METHOD, ``vars`` an attribute;
    ``firstStepIndex``/``lastStepIndex`` are INCLUSIVE."""

    __slots__ = ("name", "_programs", "firstStepIndex", "lastStepIndex", "_vars", "debugContext")

    def __init__(self, name: str, programs: Sequence[Program], firstStepIndex: int, lastStepIndex: int,
                 vars: Any = (), debugContext: DebugContext | None = None):
        self.name = name
        self._programs = list(programs)
        self.firstStepIndex = firstStepIndex
        self.lastStepIndex = lastStepIndex
        self._vars = vars
        self.debugContext = debugContext if debugContext is not None else DebugContext(0)

    def programs(self) -> list[Program]:
        return list(self._programs)

    @property
    def vars(self) -> list[Variable]:
        return _variables(self._vars)


class Compilation:
    __slots__ = ("target", "tiles", "livenessProgramSteps", "loweredVariables", "programs", "_always_live")

    def __init__(self, target: Target, tiles: Sequence[Tile], livenessProgramSteps: Sequence[LivenessStep],
                 loweredVariables: LoweredVariables, programs: Sequence[Program],
                 alwaysLiveVariables: Sequence[NamedVariable] | Callable[[], list[NamedVariable]] = ()):
        self.target = target
        self.tiles = list(tiles)
        self.livenessProgramSteps = list(livenessProgramSteps)
        self.loweredVariables = loweredVariables
        self.programs = list(programs)
        self._always_live = alwaysLiveVariables

    @property
    def alwaysLiveVariables(self) -> list[NamedVariable]:
        v = self._always_live
        return list(v() if callable(v) else v)


class Report:
    __slots__ = ("compilation", "_operations")

    def __init__(self, compilation: Compilation, operations: Sequence[Operation]):
        self.compilation = compilation
        self._operations = list(operations)


class OperationAnalysis:
    def __init__(self, report: Report):
        self.operations = report._operations


# ----------------------------------------------------------------------------------------------
# Registry

_REGISTRY: dict[str, Report] = {}
opened: list[tuple[str, str | None]] = []


def _key(path: str | os.PathLike) -> str:
    return str(Path(path).resolve())


def register(path: str | os.PathLike, report: Report, placeholder: bool = True) -> Path:
    """Make ``openReport(path)`` return ``report``; write a placeholder file there if asked."""
    path = Path(path)
    if placeholder and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"fake profile.pop: the report is registered in the fake pva module\n")
    _REGISTRY[_key(path)] = report
    return path


def reset() -> None:
    _REGISTRY.clear()
    opened.clear()


def openReport(profile_path: str, debug_path: str | None = None) -> Report:
    if not isinstance(profile_path, str) or (debug_path is not None and not isinstance(debug_path, str)):
        raise TypeError("openReport(): incompatible function arguments (expected str paths)")
    if not os.path.isfile(profile_path):
        raise RuntimeError(f"Failed to open report {profile_path}: file not found")
    if debug_path is not None and not os.path.isfile(debug_path):
        raise RuntimeError(f"Failed to open debug information {debug_path}: file not found")
    report = _REGISTRY.get(_key(profile_path))
    if report is None:
        report = _read_report_file(profile_path)
    if report is None:
        raise RuntimeError(f"{profile_path} is not a valid profile report")
    opened.append((profile_path, debug_path))
    return report


# ----------------------------------------------------------------------------------------------
# Report files: a profile.pop this double can open in any process

#: first line of a report file; the second is a JSON object of ``report_from_profile`` options,
#: the rest the bytes of a stagesplit compact profile (``.stagesplit``)
FILE_MAGIC = b"fake-pva profile.pop v1\n"
_FILE_OPTIONS = ("ipus", "var_id_start", "var_id_step", "class_id_start", "code_in_always_live", "extra_total")


def write_report_file(path: str | os.PathLike, profile: Any, **options: Any) -> Path:
    """Write a profile.pop holding ``profile`` (a stagesplit Profile, or the path of a compact
    ``.stagesplit`` file, copied byte for byte); ``openReport`` turns it into
    ``report_from_profile(profile, **options)``."""
    unknown = set(options) - set(_FILE_OPTIONS)
    if unknown:
        raise TypeError(f"write_report_file(): unknown report options {sorted(unknown)}")
    if "extra_total" in options and options["extra_total"] is not None:
        options["extra_total"] = [int(x) for x in options["extra_total"]]
    if isinstance(profile, (str, os.PathLike)):
        body = Path(profile).read_bytes()
    else:
        import tempfile
        from stagesplit.io.compact import write_compact
        with tempfile.TemporaryDirectory() as tmp:
            compact = Path(tmp) / "profile.stagesplit"
            write_compact(profile, compact)
            body = compact.read_bytes()
    if not body.startswith(b"PK"):
        raise ValueError("write_report_file(): the profile must be a stagesplit compact file (a zip)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    with part.open("wb") as handle:
        handle.write(FILE_MAGIC)
        handle.write(json.dumps(options, sort_keys=True).encode() + b"\n")
        handle.write(body)
    os.replace(part, path)
    return path


def _read_report_file(profile_path: str) -> "Report | None":
    """The report in a file written by ``write_report_file``; None for any other file."""
    with open(profile_path, "rb") as handle:
        if handle.read(len(FILE_MAGIC)) != FILE_MAGIC:
            return None
        header = handle.readline()
        body = handle.read()
    from stagesplit.io.compact import read_compact
    try:
        options = json.loads(header)
        profile = read_compact(profile_path, raw=body)
    except Exception as exc:                # libpva: a damaged file is a RuntimeError
        raise RuntimeError(f"{profile_path} is not a valid profile report: {exc}") from None
    return report_from_profile(profile, **options)


# ----------------------------------------------------------------------------------------------
# A report from a stagesplit Profile

_TO_CATEGORY = {"vertex_code": "vertexCode", "internal_exchange_code": "internalExchangeCode",
                "control_code": "controlCode", "vertex_instance_state": "vertexInstanceState",
                "vector_list_descriptor": "vectorListDescriptor", "global_exchange_code": "globalExchangeCode",
                "host_exchange_code": "hostExchangeCode", "constant": "constant"}
STATE_VERTEX = "stagesplit::VertexState"


def _by_program(program: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(program, kind="stable")
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(program, minlength=n), out=offsets[1:])
    return order, offsets


class _Trace:
    """Not-always-live bytes per (tile, step) of a profile, computed lazily per tile; IPU k of
    a mirrored report holds the first IPU's variables with (k + 1) times the bytes."""

    def __init__(self, profile, ipus: int):
        p = profile
        self.p = p
        self.T = p.target.tiles
        self.S = p.num_steps
        self.ipus = ipus
        v = p.variables
        nal = np.flatnonzero(~v.always_live & (v.live_class >= 0))
        iv = p.liveness.intervals
        cls = v.live_class[nal]
        lengths = iv.lengths()[cls]
        self.row_var = np.repeat(nal, lengths)
        start = np.repeat(iv.offsets[cls], lengths) + (np.arange(lengths.sum()) -
                                                        np.repeat(np.cumsum(lengths) - lengths, lengths))
        ivs = iv.values.reshape(-1, 2)[start]
        self.row_start, self.row_end = ivs[:, 0], ivs[:, 1]
        self.row_tile = v.tile[self.row_var]
        self.row_bytes = v.bytes[self.row_var]
        self._cache: dict[int, np.ndarray] = {}
        self._totals: np.ndarray | None = None

    def column(self, tile: int) -> np.ndarray:
        base, k = tile % self.T, tile // self.T
        col = self._cache.get(base)
        if col is None:
            rows = np.flatnonzero(self.row_tile == base)
            diff = np.zeros(self.S + 1, np.int64)
            np.add.at(diff, self.row_start[rows], self.row_bytes[rows])
            np.add.at(diff, self.row_end[rows], -self.row_bytes[rows])
            col = self._cache[base] = np.cumsum(diff)[: self.S]
        return col * (k + 1)

    def bytes(self, step: int, tile: int) -> int:
        return int(self.column(tile)[step])

    def variables(self, step: int, tile: int) -> list[NamedVariable]:
        base, k = tile % self.T, tile // self.T
        rows = np.flatnonzero((self.row_tile == base) & (self.row_start <= step) & (step < self.row_end))
        return [NamedVariable(self.p.variable_name(int(self.row_var[r])), int(self.row_bytes[r]) * (k + 1))
                for r in rows]

    def total(self, step: int) -> int:
        if self._totals is None:
            diff = np.zeros(self.S + 1, np.int64)
            np.add.at(diff, self.row_start, self.row_bytes)
            np.add.at(diff, self.row_end, -self.row_bytes)
            self._totals = np.cumsum(diff)[: self.S] * sum(range(1, self.ipus + 1))
        return int(self._totals[step])


def report_from_profile(profile, ipus: int = 1, var_id_start: int = 1000,
                        var_id_step: int = 3, class_id_start: int = 500,
                        code_in_always_live: bool = False, extra_total: Sequence[int] | None = None) -> Report:
    """A pva-shaped report holding ``profile`` (a stagesplit Profile).

    The profile's device is one IPU of ``profile.target.tiles`` tiles. With ``ipus`` > 1 the
    report spans that many IPUs: IPU k (k >= 1) mirrors the first IPU with every variable,
    code size, count, cycle estimate and ground-truth figure multiplied by (k + 1), so a reader
    that fails to keep to the first IPU gets different numbers.

    Representation: variable ids are ``var_id_start + var_id_step * j`` (brief variables of all
    IPUs interleaved); liveness class c is equivalence class ``class_id_start + c``; always-live
    variables share a class covering every step; never-live ones a class with no step. Vertex
    code becomes, per vertex type, one instance per tile (size 0) plus a code size in the
    tiles' memory; vertex state becomes instances of ``STATE_VERTEX`` (which has no code) of
    size gcd(state bytes). A program's cycles become a per-tile estimate on its first tile
    (DoExchange and OnTileExecute programs only). ``codeBytesByTile`` of programs other than
    DoExchange holds their control code (libpva reports code for every program; only
    DoExchange's is exchange code). Program ``vertices`` counts are not carried.

    Ground truth (the profile's own, or one computed from it): with ``code_in_always_live``
    each tile's ``alwaysLiveBytes`` includes its categories (libpva's convention) and its
    ``total.excludingGaps`` is always-live + not-always-live; without, the categories are
    separate. Either way the total is the sum of the profile's figures (its ``other`` category,
    memory in no category, only there), plus ``extra_total[t]`` bytes on tile t when given.
    """
    from stagesplit.synth import ground_truth as computed_ground_truth

    p = profile
    T, S = p.target.tiles, p.num_steps
    NT = T * ipus
    pr = p.programs
    n_prog = len(pr)
    kinds = []
    for i, kind in enumerate(pr.kind):
        try:
            kinds.append(Program.Type[kind])
        except KeyError:
            raise ValueError(f"program {i} has kind {kind!r}, which is not a pva.Program.Type") from None

    def check(costs, allowed: Program.Type, what: str) -> None:
        bad = [int(q) for q in np.unique(costs.program) if kinds[q] is not allowed]
        if bad:
            raise ValueError(f"program {bad[0]} ({pr.kind[bad[0]]}) has {what}: a pva report holds it only for "
                             f"{allowed.name} programs")

    check(pr.exchange_code, Program.Type.DoExchange, "exchange code")
    check(pr.vertex_state, Program.Type.OnTileExecute, "vertex state")
    check(pr.vertex_code, Program.Type.OnTileExecute, "vertex code")

    def mirrored(tiles: np.ndarray, values: np.ndarray, dtype=np.int64) -> Sparse:
        tiles = np.asarray(tiles, np.int64)            # a compact file's tiles may be int8/int16
        all_tiles = np.concatenate([tiles + k * T for k in range(ipus)])
        all_values = np.concatenate([np.asarray(values, dtype) * (k + 1) for k in range(ipus)])
        return Sparse(NT, all_tiles, all_values, dtype)

    cat_index = {cat: _by_program(costs.program, n_prog) for cat, costs in pr.categories().items()}
    vc = pr.vertex_code
    vc_order, vc_offsets = _by_program(vc.program, n_prog)

    def entries(cat: str, q: int):
        costs = pr.categories()[cat] if cat != "vertex_code" else vc
        order, offsets = cat_index[cat] if cat != "vertex_code" else (vc_order, vc_offsets)
        e = order[offsets[q]:offsets[q + 1]]
        return costs, e

    programs: list[Program] = []
    for q in range(n_prog):
        kind = kinds[q]
        ctl, e = entries("control_code", q)
        control = mirrored(ctl.tile[e], ctl.bytes[e])
        costs_tiles = [ctl.tile[e]]
        cycles = float(pr.cycles[q])
        kwargs: dict[str, Any] = {"controlCodeByTile": control}
        if kind is Program.Type.DoExchange:
            ex, e = entries("exchange_code", q)
            kwargs["codeBytesByTile"] = mirrored(ex.tile[e], ex.bytes[e])
            costs_tiles.append(ex.tile[e])
        else:
            kwargs["codeBytesByTile"] = control
        vertices = []
        if kind is Program.Type.OnTileExecute:
            codes, e = entries("vertex_code", q)
            for t in np.unique(codes.vertex_type[e]):
                tiles = np.unique(codes.tile[e][codes.vertex_type[e] == t])
                vertices.append(ComputeSetVertices(VertexType(pr.vertex_types[t], 0),
                                                   mirrored(tiles, np.ones(len(tiles), np.int64))))
                costs_tiles.append(tiles)
            st, e = entries("vertex_state", q)
            nz = e[st.bytes[e] > 0]
            if len(nz):
                size = int(np.gcd.reduce(st.bytes[nz]))
                vertices.append(ComputeSetVertices(VertexType(STATE_VERTEX, size),
                                                   mirrored(st.tile[nz], st.bytes[nz] // size)))
                costs_tiles.append(st.tile[nz])
        all_tiles = np.concatenate(costs_tiles)
        first_tile = int(all_tiles.min()) if len(all_tiles) else 0
        estimate = None
        if not math.isnan(cycles) and kind in (Program.Type.DoExchange, Program.Type.OnTileExecute):
            estimate = mirrored(np.array([first_tile]), np.array([cycles]), np.float64)
        if kind is Program.Type.DoExchange:
            programs.append(make_program(("prog", q), pr.name[q], kind, estimatedCyclesByTile=estimate, **kwargs))
        elif kind is Program.Type.OnTileExecute:
            cs = ComputeSet(pr.name[q], vertices, estimate)
            programs.append(make_program(("prog", q), pr.name[q], kind, computeset=cs, **kwargs))
        else:
            programs.append(make_program(("prog", q), pr.name[q], kind, **kwargs))

    # tiles: vertex code sizes and ground truth
    ntypes = max(len(pr.vertex_types), 1)
    code_size = np.zeros(T * ntypes, np.int64)
    np.maximum.at(code_size, vc.tile.astype(np.int64) * ntypes + vc.vertex_type, vc.bytes)   # narrow dtypes overflow
    present = np.flatnonzero(code_size)
    per_tile_types: list[list[tuple[int, int]]] = [[] for _ in range(T)]
    for key, size in zip(present.tolist(), code_size[present].tolist()):
        per_tile_types[key // ntypes].append((key % ntypes, size))
    gt = p.ground_truth if p.ground_truth is not None else computed_ground_truth(p)
    cats = {_TO_CATEGORY[name]: values for name, values in gt.categories.items() if name in _TO_CATEGORY}
    other = gt.categories.get("other", np.zeros(T, np.int64))    # memory in no category: only in the total
    tiles = []
    for g in range(NT):
        t, m = g % T, g // T + 1
        in_cats = sum(int(values[t]) for values in cats.values())
        al = int(gt.always_live[t]) + (in_cats if code_in_always_live else 0)
        whole = int(gt.always_live[t]) + int(gt.not_always_live[t]) + in_cats + int(other[t]) \
            + (int(extra_total[t]) if extra_total is not None else 0)
        tiles.append(Tile(g, TileMemory(
            alwaysLiveBytes=al * m, notAlwaysLiveBytes=int(gt.not_always_live[t]) * m,
            vertices=[TileVertex(VertexType(pr.vertex_types[vt], 0), size * m) for vt, size in per_tile_types[t]],
            category=Categories(**{name: int(values[t]) * m for name, values in cats.items()}),
            total=MemoryTotal(whole * m, whole * m))))

    # liveness steps
    trace = _Trace(p, ipus)
    by_name: dict[str, Program] = {}
    for prog in programs:
        by_name.setdefault(prog.name, prog)
    steps = []
    for i, name in enumerate(p.steps):
        prog = by_name.get(name) or make_program(("step", i), name, Program.Type.Sync)
        steps.append(LivenessStep(prog, (lambda t, i=i: trace.bytes(i, t)), (lambda t, i=i: trace.variables(i, t)),
                                  (lambda i=i: trace.total(i))))

    # variables
    v = p.variables
    n = len(v)
    ncls = len(p.liveness)
    classes = [EquivalenceClass(class_id_start + c, [Interval(int(s), int(e)) for s, e in p.liveness.intervals[c]])
               for c in range(ncls)]
    always = EquivalenceClass(class_id_start + ncls, [Interval(0, S)])
    never = EquivalenceClass(class_id_start + ncls + 1, [])
    cls_of = [always if a else (classes[c] if c >= 0 else never)
              for a, c in zip(v.always_live.tolist(), v.live_class.tolist())]
    ids = var_id_start + var_id_step * np.arange(n * ipus, dtype=np.int64).reshape(n, ipus)
    id_list = ids.tolist()
    nbytes, tile_list = v.bytes.tolist(), v.tile.tolist()
    brief: list[BriefVar] = []
    append = brief.append
    for j in range(n):
        row = id_list[j]
        for k in range(ipus):
            append(BriefVar(row[k], nbytes[j] * (k + 1), tile_list[j] + k * T, cls_of[j]))

    def always_live_variables() -> list[NamedVariable]:
        return [NamedVariable(p.variable_name(j), int(v.bytes[j])) for j in np.flatnonzero(v.always_live)]

    # operations
    ops = p.operations
    operations = []
    for i in range(len(ops)):
        did = int(ops.debug_id[i]) if ops.debug_id[i] >= 0 else 10**6 + i
        doc = {"inputs": list(ops.inputs[i])} if ops.inputs[i] else {}
        operations.append(Operation(
            ops.name[i], [programs[q] for q in ops.programs[i].tolist()], int(ops.first_step[i]),
            int(ops.last_step[i]), ids[ops.vars[i]].reshape(-1), DebugContext(did, json.dumps(doc))))

    target = Target(tilesPerIpu=T, bytesPerTile=p.target.bytes_per_tile, numIPUs=ipus,
                    clockFrequency=p.target.clock_hz or 1.33e9)
    comp = Compilation(target, tiles, steps, LoweredVariables(brief), programs, always_live_variables)
    return Report(comp, operations)


# ----------------------------------------------------------------------------------------------
# debug.cbor

_INTERNABLE = ("opName", "opType", "op_name", "op_type", "input", "output", "inputs", "outputs", "layer", "category")


def write_debug_cbor(path: str | os.PathLike, contexts: Sequence[dict], intern_all: bool = False) -> Path:
    """Write a valid debug.cbor holding ``contexts`` (maps with plain strings).

    ``name`` and the location's ``fileName``/``functionName`` become string-table indices as
    in Poplar's files; with ``intern_all`` the per-layer string fields do too."""
    import cbor2

    table: list[str] = []
    index: dict[str, int] = {}

    def intern(s: str) -> int:
        if s not in index:
            index[s] = len(table)
            table.append(s)
        return index[s]

    out = []
    for ctx in contexts:
        rec = dict(ctx)
        if isinstance(rec.get("name"), str):
            rec["name"] = intern(rec["name"])
        if isinstance(rec.get("location"), dict):
            loc = dict(rec["location"])
            for key in ("fileName", "functionName"):
                if isinstance(loc.get(key), str):
                    loc[key] = intern(loc[key])
            rec["location"] = loc
        if intern_all:
            for key in _INTERNABLE:
                value = rec.get(key)
                if isinstance(value, str):
                    rec[key] = intern(value)
                elif isinstance(value, list):
                    rec[key] = [intern(x) if isinstance(x, str) else x for x in value]
        out.append(rec)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        cbor2.dump({"stringTable": table, "contexts": out}, handle)
    return path
