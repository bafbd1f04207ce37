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
libpva builds a fresh list on every access); every object uses ``__slots__``. A report built
from a profile makes its parts on first access, as libpva reads the file on demand, and hands
out brief variables and operation variables from C arrays (ctypes structs made on access, as
a C++ vector bound into Python does), so that a report of millions of variables costs what a
real reader pays, not the price of a Python object per variable up front.

This module imports only the standard library and numpy at import time.
"""

from __future__ import annotations

import ctypes
import enum
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------
# Per-tile arrays


class Sparse:
    """A per-tile array stored as (tiles, values); ``dense()`` gives the numTiles-long array.
    ``values`` is one value per listed tile or a single value for all of them."""

    __slots__ = ("n", "tiles", "values", "dtype")

    def __init__(self, n: int, tiles: Sequence[int] = (), values: Sequence[float] | float = (), dtype=np.int64):
        self.n = int(n)
        self.tiles = np.asarray(tiles) if len(tiles) else np.zeros(0, np.int64)
        values = np.asarray(values)
        self.values = values if values.shape == self.tiles.shape else np.broadcast_to(values, self.tiles.shape)
        self.dtype = dtype

    def dense(self) -> np.ndarray:
        out = np.zeros(self.n, self.dtype)
        tiles = self.tiles
        if len(tiles) > 1:
            seen = np.zeros(self.n, bool)
            seen[tiles] = True
            if int(np.count_nonzero(seen)) < len(tiles):         # a tile listed twice: add up
                np.add.at(out, tiles, self.values)
                return out
        out[tiles] = self.values
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

    __slots__ = ("_id", "name", "type", "children", "_vars", "_control", "_code", "_detail")

    def __init__(self, _id: Any, name: str, type: Program.Type, children: Sequence[Program] = (),
                 controlCodeByTile: Any = None, codeBytesByTile: Any = None, vars: Any = ()):
        self._id = _id
        self.name = name
        self.type = type
        self.children = list(children)
        self._control = controlCodeByTile
        self._code = codeBytesByTile
        self._vars = vars
        self._detail: Callable[[], dict] | None = None

    def _fill(self) -> None:
        """Make the per-tile fields of a lazy program (see ``make_lazy_program``) on first access."""
        detail, self._detail = self._detail, None
        fields = detail()
        self._control = fields.get("controlCodeByTile")
        self._code = fields.get("codeBytesByTile")
        self._fill_more(fields)

    def _fill_more(self, fields: dict) -> None:
        pass

    @property
    def controlCodeByTile(self):
        if self._detail is not None:
            self._fill()
        return _dense(self._control)

    @property
    def codeBytesByTile(self):
        if self._detail is not None:
            self._fill()
        return _dense(self._code)

    @property
    def vars(self) -> list[Variable]:
        return _variables(self._vars)

    def accept(self, visitor: ProgramVisitor) -> None:
        getattr(visitor, "visit" + self.type.name)(self)

    def __repr__(self) -> str:
        return f"<pva.Program {self.type.name} {self.name!r} _id={self._id!r}>"


class DoExchangeProgram(Program):
    __slots__ = ("_estimated",)

    def __init__(self, *args, estimatedCyclesByTile: Any = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._estimated = estimatedCyclesByTile

    def _fill_more(self, fields: dict) -> None:
        self._estimated = fields.get("estimatedCyclesByTile")

    @property
    def estimatedCyclesByTile(self):
        if self._detail is not None:
            self._fill()
        return _dense(self._estimated)


class OnTileExecuteProgram(Program):
    __slots__ = ("_computeset",)

    def __init__(self, *args, computeset: ComputeSet | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._computeset = computeset if computeset is not None else ComputeSet(self.name, [])

    def _fill_more(self, fields: dict) -> None:
        computeset = fields.get("computeset")
        self._computeset = computeset if computeset is not None else ComputeSet(self.name, [])

    @property
    def computeset(self) -> ComputeSet:
        if self._detail is not None:
            self._fill()
        return self._computeset


def make_program(_id: Any, name: str, type: Program.Type | str, *, estimatedCyclesByTile: Any = None,
                 computeset: ComputeSet | None = None, **kwargs) -> Program:
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



def make_lazy_program(_id: Any, name: str, type: Program.Type, detail: Callable[[], dict]) -> Program:
    """A program whose per-tile fields (the keyword arguments of ``make_program``, returned by
    ``detail``) are made on first access, as libpva reads a program's fields from the file."""
    program = make_program(_id, name, type)
    program._detail = detail
    return program

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


def _built(owner: Any, slot: str) -> Any:
    """The value in ``slot``; a callable there (a part built on first access, as libpva reads
    the file on demand) is called once and replaced by what it returns."""
    value = getattr(owner, slot)
    if callable(value):
        value = value()
        setattr(owner, slot, value)
    return value


class LoweredVariables:
    """``allBriefVars``: a sequence, or a callable that builds it on first access."""

    __slots__ = ("_brief",)

    def __init__(self, allBriefVars: Sequence[BriefVar] | Callable[[], Sequence[BriefVar]]):
        self._brief = allBriefVars

    @property
    def allBriefVars(self) -> Sequence[BriefVar]:
        return _built(self, "_brief")


class Variable:
    """A variable as operations and programs list it: only ``_id`` links it to a brief var."""

    __slots__ = ("_id",)

    def __init__(self, _id: int):
        self._id = _id


def _variables(value: Any) -> list[Variable]:
    if callable(value):
        return value()
    if isinstance(value, np.ndarray):
        return list(map(Variable, value.tolist()))
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
                 category: Categories | None = None, total: MemoryTotal | None | bool = None,
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

    def __init__(self, id: int, json: str = "{}", parents: Sequence[DebugContext] = (),
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
    """A compilation. ``tiles``, ``livenessProgramSteps`` and ``programs`` may be given as
    callables: each is built on first access and kept."""

    __slots__ = ("target", "_tiles", "_steps", "loweredVariables", "_programs", "_always_live")

    def __init__(self, target: Target, tiles: Sequence[Tile] | Callable[[], list[Tile]],
                 livenessProgramSteps: Sequence[LivenessStep] | Callable[[], list[LivenessStep]],
                 loweredVariables: LoweredVariables, programs: Sequence[Program] | Callable[[], list[Program]],
                 alwaysLiveVariables: Sequence[NamedVariable] | Callable[[], list[NamedVariable]] = ()):
        self.target = target
        self._tiles = tiles if callable(tiles) else list(tiles)
        self._steps = livenessProgramSteps if callable(livenessProgramSteps) else list(livenessProgramSteps)
        self.loweredVariables = loweredVariables
        self._programs = programs if callable(programs) else list(programs)
        self._always_live = alwaysLiveVariables

    @property
    def tiles(self) -> list[Tile]:
        return _built(self, "_tiles")

    @property
    def livenessProgramSteps(self) -> list[LivenessStep]:
        return _built(self, "_steps")

    @property
    def programs(self) -> list[Program]:
        return _built(self, "_programs")

    @property
    def alwaysLiveVariables(self) -> list[NamedVariable]:
        v = self._always_live
        return list(v() if callable(v) else v)


class Report:
    """A report; ``operations`` may be a callable that builds them on first access."""

    __slots__ = ("compilation", "_ops")

    def __init__(self, compilation: Compilation, operations: Sequence[Operation] | Callable[[], list[Operation]]):
        self.compilation = compilation
        self._ops = operations if callable(operations) else list(operations)

    @property
    def _operations(self) -> list[Operation]:
        return _built(self, "_ops")


class OperationAnalysis:
    def __init__(self, report: Report):
        self.operations = report._operations


# ----------------------------------------------------------------------------------------------
# C-backed arrays: how a report built from a profile hands out its millions of variables


class _VariableRecord(ctypes.Structure):
    """An operation's variable as a C struct: ``_id``."""

    _fields_ = [("_id", ctypes.c_int64)]


def _c_variables(ids: np.ndarray) -> Sequence[Variable]:
    """Operation variables backed by one C array, as libpva's are by C++ memory: a sequence
    that makes each element's Python object on access, with the ``_id`` attribute."""
    ids = np.ascontiguousarray(ids, np.int64)
    if len(ids) == 0:
        return []
    return (_VariableRecord * len(ids)).from_buffer(ids.copy())


def _c_brief_vars(columns: np.ndarray, classes: dict[int, EquivalenceClass]) -> Sequence[BriefVar]:
    """Brief variables backed by one C array of (id, bytes, tileId, equivalence class id):
    ``equivalenceClass.steps`` looks the class up in ``classes``. Like a C++ vector bound
    into Python: len(), indexing and iteration, each element made on access."""

    class EquivalenceClassRecord(ctypes.Structure):
        _fields_ = [("id", ctypes.c_int64)]

        @property
        def steps(self) -> list[Interval]:
            return classes[self.id].steps

    class BriefVarRecord(ctypes.Structure):
        _fields_ = [("id", ctypes.c_int64), ("bytes", ctypes.c_int64), ("tileId", ctypes.c_int64),
                    ("equivalenceClass", EquivalenceClassRecord)]

    columns = np.ascontiguousarray(columns, np.int64)
    if len(columns) == 0:
        return []
    return (BriefVarRecord * len(columns)).from_buffer(columns)


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


def _read_report_file(profile_path: str) -> Report | None:
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


def _by_program(program: np.ndarray, n: int) -> tuple[np.ndarray | None, list[int]]:
    """(order, offsets): rows order[offsets[q]:offsets[q + 1]] belong to program q; order is
    None when the rows are already in program order."""
    if len(program) < 2 or bool(np.all(program[1:] >= program[:-1])):      # narrow dtypes are fine here
        needles = np.arange(n + 1, dtype=program.dtype if np.iinfo(program.dtype).max >= n else np.int64)
        return None, np.searchsorted(program, needles).tolist()
    order = np.argsort(program, kind="stable")
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(program, minlength=n), out=offsets[1:])
    return order, offsets.tolist()


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

    Like libpva, which reads the file on demand, the report builds its programs, tiles, steps,
    brief variables and operations on first access; the checks below run at once.
    """
    from stagesplit.io.synth import ground_truth as computed_ground_truth

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
        has = np.flatnonzero(np.bincount(np.asarray(costs.program, np.int64), minlength=n_prog))
        bad = [int(q) for q in has if kinds[q] is not allowed]
        if bad:
            raise ValueError(f"program {bad[0]} ({pr.kind[bad[0]]}) has {what}: a pva report holds it only for "
                             f"{allowed.name} programs")

    check(pr.exchange_code, Program.Type.DoExchange, "exchange code")
    check(pr.vertex_state, Program.Type.OnTileExecute, "vertex state")
    check(pr.vertex_code, Program.Type.OnTileExecute, "vertex code")

    def mirrored(tiles: np.ndarray, values: np.ndarray, dtype=np.int64) -> Sparse:
        if ipus == 1:                                  # narrow dtypes are fine here: dense() widens
            return Sparse(NT, tiles, values, dtype)
        tiles = np.asarray(tiles, np.int64)            # a compact file's tiles may be int8/int16
        all_tiles = np.concatenate([tiles + k * T for k in range(ipus)])
        all_values = np.concatenate([np.asarray(values, dtype) * (k + 1) for k in range(ipus)])
        return Sparse(NT, all_tiles, all_values, dtype)

    programs: list[Program] = []

    def build_programs() -> list[Program]:
        if programs:
            return programs
        cats = dict(pr.categories())
        cats["vertex_code"] = pr.vertex_code
        index: dict[str, tuple] = {}                    # per category, made on the first program's access

        def entries(cat: str, q: int):
            if cat not in index:
                index[cat] = _by_program(cats[cat].program, n_prog)
            order, offsets = index[cat]
            if order is None:                          # already in program order: a slice, no copy
                return cats[cat], slice(offsets[q], offsets[q + 1])
            return cats[cat], order[offsets[q]:offsets[q + 1]]

        def detail(q: int) -> dict:
            kind = kinds[q]
            ctl, e = entries("control_code", q)
            control = mirrored(ctl.tile[e], ctl.bytes[e])
            costs_tiles = [ctl.tile[e]]
            cycles = float(pr.cycles[q])
            fields: dict[str, Any] = {"controlCodeByTile": control}
            if kind is Program.Type.DoExchange:
                ex, e = entries("exchange_code", q)
                fields["codeBytesByTile"] = mirrored(ex.tile[e], ex.bytes[e])
                costs_tiles.append(ex.tile[e])
            else:
                fields["codeBytesByTile"] = control
            vertices = []
            if kind is Program.Type.OnTileExecute:
                codes, e = entries("vertex_code", q)
                types, tiles_of = codes.vertex_type[e], codes.tile[e]
                for t in np.flatnonzero(np.bincount(types)) if len(types) else ():
                    present = np.zeros(T, bool)
                    present[tiles_of[types == t]] = True
                    tiles = np.flatnonzero(present)
                    vertices.append(ComputeSetVertices(VertexType(pr.vertex_types[t], 0),
                                                       mirrored(tiles, np.ones(len(tiles), np.int64))))
                    costs_tiles.append(tiles)
                st, e = entries("vertex_state", q)
                nz = np.flatnonzero(st.bytes[e] > 0) + e.start if isinstance(e, slice) else e[st.bytes[e] > 0]
                if len(nz):
                    size = int(np.gcd.reduce(np.asarray(st.bytes[nz], np.int64)))
                    vertices.append(ComputeSetVertices(VertexType(STATE_VERTEX, size),
                                                       mirrored(st.tile[nz], st.bytes[nz] // size)))
                    costs_tiles.append(st.tile[nz])
            first_tile = min((int(a.min()) for a in costs_tiles if len(a)), default=0)
            estimate = None
            if not math.isnan(cycles) and kind in (Program.Type.DoExchange, Program.Type.OnTileExecute):
                estimate = mirrored(np.array([first_tile]), np.array([cycles]), np.float64)
            if kind is Program.Type.DoExchange:
                fields["estimatedCyclesByTile"] = estimate
            elif kind is Program.Type.OnTileExecute:
                fields["computeset"] = ComputeSet(pr.name[q], vertices, estimate)
            return fields

        for q in range(n_prog):
            programs.append(make_lazy_program(("prog", q), pr.name[q], kinds[q], lambda q=q: detail(q)))
        return programs

    def build_tiles() -> list[Tile]:
        vc = pr.vertex_code
        ntypes = max(len(pr.vertex_types), 1)
        code_size = np.zeros(T * ntypes, np.int64)
        for start in range(0, len(vc), 1 << 21):      # in chunks: no large temporaries
            part = slice(start, start + (1 << 21))
            key = vc.tile[part].astype(np.int64)       # narrow dtypes would overflow
            key *= ntypes
            key += vc.vertex_type[part]
            values = vc.bytes[part]
            larger = values > code_size[key]            # one size per (tile, type) as a rule; else the largest
            if larger.any():
                np.maximum.at(code_size, key[larger], values[larger])
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
        return tiles

    def build_steps() -> list[LivenessStep]:
        trace = _Trace(p, ipus)
        by_name: dict[str, Program] = {}
        for prog in build_programs():
            by_name.setdefault(prog.name, prog)
        steps = []
        for i, name in enumerate(p.steps):
            prog = by_name.get(name) or make_program(("step", i), name, Program.Type.Sync)
            steps.append(LivenessStep(prog, (lambda t, i=i: trace.bytes(i, t)), (lambda t, i=i: trace.variables(i, t)),
                                      (lambda i=i: trace.total(i))))
        return steps

    v = p.variables
    n = len(v)
    ids = var_id_start + var_id_step * np.arange(n * ipus, dtype=np.int64).reshape(n, ipus)

    def build_brief() -> Sequence[BriefVar]:
        ncls = len(p.liveness)
        classes = [EquivalenceClass(class_id_start + c, [Interval(int(s), int(e)) for s, e in p.liveness.intervals[c]])
                   for c in range(ncls)]
        classes.append(EquivalenceClass(class_id_start + ncls, [Interval(0, S)]))      # always live
        classes.append(EquivalenceClass(class_id_start + ncls + 1, []))                # never live
        cls_index = np.where(v.always_live, ncls, np.where(np.asarray(v.live_class) >= 0, v.live_class, ncls + 1))
        columns = np.empty((n, ipus, 4), np.int64)                 # brief variables of all IPUs interleaved
        for k in range(ipus):
            columns[:, k, 0] = ids[:, k]
            columns[:, k, 1] = np.asarray(v.bytes, np.int64) * (k + 1)
            columns[:, k, 2] = np.asarray(v.tile, np.int64) + k * T
            columns[:, k, 3] = class_id_start + cls_index
        return _c_brief_vars(columns.reshape(n * ipus, 4), {c.id: c for c in classes})

    def always_live_variables() -> list[NamedVariable]:
        return [NamedVariable(p.variable_name(j), int(v.bytes[j])) for j in np.flatnonzero(v.always_live)]

    def build_operations() -> list[Operation]:
        ops = p.operations
        progs = build_programs()
        operations = []
        per_ipu = np.arange(ipus, dtype=np.int64)
        for i in range(len(ops)):
            did = int(ops.debug_id[i]) if ops.debug_id[i] >= 0 else 10**6 + i
            doc = {"inputs": list(ops.inputs[i])} if ops.inputs[i] else {}
            rows = (np.asarray(ops.vars[i], np.int64)[:, None] * ipus + per_ipu).reshape(-1)
            operations.append(Operation(
                ops.name[i], [progs[q] for q in ops.programs[i].tolist()], int(ops.first_step[i]),
                int(ops.last_step[i]), lambda rows=rows: _c_variables(ids.reshape(-1)[rows]),
                DebugContext(did, json.dumps(doc))))
        return operations

    target = Target(tilesPerIpu=T, bytesPerTile=p.target.bytes_per_tile, numIPUs=ipus,
                    clockFrequency=p.target.clock_hz or 1.33e9)
    comp = Compilation(target, build_tiles, build_steps, LoweredVariables(build_brief), build_programs,
                       always_live_variables)
    return Report(comp, build_operations)


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
