"""Read a PopVision ``profile.pop`` (and its ``debug.cbor``) into a Profile through libpva.

libpva (the Python module ``pva``) ships only with Graphcore's Poplar SDK. Where the SDK is
installed, ``stagesplit convert profile.pop debug.cbor -o model.stagesplit`` writes a compact
file that stagesplit reads anywhere. Everything is read with single passes over libpva's
objects into numpy columns; no per-variable Python objects are kept.

A large report is read on two cores: after ``openReport`` the process forks (see ``forked``),
the child reads the tiles, every program's per-tile costs and the ground truth, and the parent
reads the variables and operations meanwhile; the child's arrays come back through a pipe
(no pickle). Where fork is unavailable, or the child fails, everything is read in one process;
the Profile is the same either way, errors included (the program side's come first).

How the report maps onto the Profile:

* **Target**: ``tilesPerIpu`` tiles of ``bytesPerTile`` bytes at ``clockFrequency`` Hz. Only
  the first IPU's tiles (tile index < ``tilesPerIpu``) are read: per-tile arrays are cut to
  that length and variables on other tiles are dropped. A report of several IPUs or replicas
  gets a warning in ``info.warnings`` saying so.
* **Steps**: ``livenessProgramSteps[i].program.name``.
* **Variables** come from ``loweredVariables.allBriefVars``. Variables with the same
  equivalence class share one liveness pattern; each class's step intervals (end exclusive,
  as in the Profile) are read once, clipped to ``[0, num_steps]``, empty intervals dropped,
  sorted, and identical patterns share one liveness class. **Always-live rule**: a variable
  whose class's intervals together cover every step ``[0, num_steps)`` is always live (a
  report with no steps makes every variable always live); a class with no interval left is
  never live (``live_class`` -1, it costs nothing); any other class is not always live.
* **Programs**: ``compilation.programs`` in order (a program an operation refers to that is
  not in that list is appended). Kind is ``type.name``. Control code is
  ``controlCodeByTile``, counted for childless programs only (a parent's figure includes its
  children's). Exchange code is ``codeBytesByTile`` of DoExchange programs. For OnTileExecute
  programs, each ``computeset.vertices`` entry puts, on every tile where ``countByTile > 0``,
  the code of that vertex type on that tile (``tiles[t].memory.vertices[].codeBytes``) and
  ``countByTile[t] * type.size`` bytes of vertex state. ``vertices`` is the total vertex
  count. Costs are stored sparse, zeros dropped.
* **Compute** (unit "cycles"): a program's compile-time estimate is the maximum over tiles of
  ``estimatedCyclesByTile`` (DoExchange) or ``computeset.estimatedCyclesByTile``
  (OnTileExecute); an estimate whose maximum is 0 counts as absent. If any program has one,
  those are used (other programs: unknown). Otherwise every program's cycles are estimated as
  the largest vertex count on one tile times ``CYCLES_PER_VERTEX`` (vertices on a tile run one
  after another on its worker threads; the constant is a typical codelet's cost including
  supervisor overhead, and matters only relative to other programs). ``info.compute_source``
  says which. Operations carry no compute of their own (it is derived from their programs).
* **Operations** come from ``pva.OperationAnalysis(report).operations``: ``firstStepIndex``
  and ``lastStepIndex`` are inclusive, like the Profile's; a range outside the report's steps
  is taken as unknown (-1). Inputs are the ``inputs`` of the debug-context JSON. Operations
  that share a debug-context id share their programs and variables, exactly as libpva reports
  them (the cost model counts each item once per stage and each program's compute once).
  Operations named ``""`` or ``"Call"`` get names that say what they are: ``Call(<instanceId>)``,
  ``Tensor/<tensorId>`` (``Tensor(<instanceId>)/<tensorId>``), the user-level op name of the
  JSON (``op_name``/``opName``) or else the nearest one found in debug.cbor for the context or
  its parents, or ``Anonymous`` (``Anonymous(<instanceId>)``). Other names are kept as they are.
  When the JSON has no inputs, the nearest inputs recorded in debug.cbor are used.
* **Ground truth**: per first-IPU tile ``alwaysLiveBytes``, ``notAlwaysLiveBytes`` and the
  memory categories the report has (``vertexCode`` -> ``vertex_code``, ...); the not-always-
  live bytes at every step for the ``TRACE_TILES`` tiles with the largest total. The Profile's
  ground truth holds always-live *variable* bytes and its parts add up to the tile's total, so
  it is fitted to the report's own total ``total.excludingGaps`` where the tiles have one.
  libpva's ``alwaysLiveBytes`` includes the code and state categories: always-live +
  not-always-live then equals the total, and the categories are taken out of the always-live
  figure. Which convention a report follows is decided once for the report, by its tiles with
  some code: it includes them unless more of those tiles add up to the total with the
  categories added than without (libpva's convention wins a tie). Bytes of the total in none
  of the figures become the category ``other``; a tile whose figures exceed its total gets a
  warning. Without a total, the figures are taken as separate, as in the JSON form.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable
from itertools import islice
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ProfileError, StagesplitError
from . import pva_export as rules
from .debugcbor import DebugInfo, read_debug_cbor
from .forked import ChildFailed, Forked, can_fork
from .profile import (
    GroundTruth,
    Liveness,
    Operations,
    Profile,
    ProfileInfo,
    Programs,
    Ragged,
    Target,
    TileCosts,
    Variables,
    VertexCode,
    narrowest_int,
)
from .pva_export import operation_name

__all__ = ["CATEGORIES", "CYCLES_PER_VERTEX", "LIBPVA_HELP", "PARALLEL_FROM", "PROGRAM_WEIGHT", "TRACE_TILES",
           "WORKERS_VARIABLE", "import_pva", "read_popvision"]

#: reports with at least this many brief variables + PROGRAM_WEIGHT x programs are read by two processes
PARALLEL_FROM = 200_000
PROGRAM_WEIGHT = 64
WORKERS_VARIABLE = "STAGESPLIT_READ_WORKERS"
#: libpva memory category -> ground-truth category name
CATEGORIES = dict(rules.CATEGORIES)
CYCLES_PER_VERTEX = rules.CYCLES_PER_VERTEX
TRACE_TILES = rules.TRACE_TILES
LIBPVA_HELP = ("reading profile.pop needs the Poplar SDK's libpva (the Python module pva){detail}: where the SDK "
               "is, run the standalone exporter with the SDK's own Python (3.6 or newer, after `source "
               "<sdk>/enable.sh`): copy {exporter} there and run `python3 pva_export.py {files} -o model.stagesplit`, "
               "then use model.stagesplit here")

Progress = Callable[[int, int], None]


def read_popvision(profile_path: str | Path, debug_path: str | Path | None = None,
                   progress: Progress | None = None, workers: int | None = None) -> Profile:
    """Read ``profile.pop`` (and ``debug.cbor`` when given) with libpva; see the module docstring.

    ``workers``: 2 reads the programs, tiles and ground truth in a forked child process while
    this one reads the variables and operations (where fork is available, see
    ``forked.can_fork``); 1 reads everything here; ``None`` (the default) takes the environment
    variable ``STAGESPLIT_READ_WORKERS`` (1 or 2) if set, else uses two for reports of at least
    ``PARALLEL_FROM`` units of work. The Profile is the same either way."""
    profile_path = Path(profile_path)
    _check_file(profile_path, "a PopVision profile.pop")
    if debug_path is not None:
        debug_path = Path(debug_path)
        _check_file(debug_path, "the debug.cbor written next to profile.pop")
    pva = import_pva(profile_path, debug_path)
    debug = read_debug_cbor(debug_path) if debug_path is not None else None
    try:
        report = pva.openReport(str(profile_path), str(debug_path) if debug_path is not None else None)
    except Exception as exc:  # libpva raises its own exception types for unreadable reports
        raise StagesplitError(f"{profile_path}: libpva could not open the report: {_one_line(exc)}") from None
    if workers is None:
        workers = _workers_from_environment()
    reader = _Reader(pva, report, profile_path, debug, progress, workers)
    try:
        profile = reader.read()
    except StagesplitError:
        raise
    except (AttributeError, TypeError, ValueError, OverflowError, IndexError, KeyError) as exc:
        # a report whose objects do not have libpva's shapes (a hostile or damaged file, or a
        # libpva version that changed them): one line naming the part being read
        raise ProfileError(str(profile_path), reader.part, "objects with the attributes and integer values "
                           "libpva gives (see the module docstring)", f"{type(exc).__name__}: {_one_line(exc)}") \
            from None
    # libpva reads the report itself, so the hash takes one more pass over profile.pop
    from ..common.fileio import file_sha256
    profile.info.sha256 = file_sha256(profile_path)
    return profile


def _workers_from_environment() -> int | None:
    text = os.environ.get(WORKERS_VARIABLE, "").strip()
    if not text:
        return None
    if text not in ("1", "2"):
        raise StagesplitError(f"environment variable {WORKERS_VARIABLE}: expected 1 (read in one process) or 2 "
                              f"(two processes), got {text!r}")
    return int(text)


def import_pva(profile_path: str | Path = "profile.pop", debug_path: str | Path | None = "debug.cbor"):
    """The ``pva`` module, or a one-line StagesplitError saying how to export the report where
    the SDK is: the exporter file to copy and the exact command for these files."""
    try:
        import pva
    except (ImportError, RuntimeError) as exc:
        from . import pva_export
        files = " ".join(shlex.quote(str(p)) for p in (profile_path, debug_path) if p is not None)
        raise StagesplitError(LIBPVA_HELP.format(detail=f", which could not be imported ({_one_line(exc)})",
                                                 exporter=pva_export.__file__, files=files)) from None
    return pva


def _check_file(path: Path, what: str) -> None:
    if not path.exists():
        raise StagesplitError(f"{path}: no such file (expected {what})")
    if not path.is_file():
        raise StagesplitError(f"{path}: not a file (expected {what})")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


_load_json = rules.load_json
_as_text = rules.as_text
_json_inputs = rules.json_inputs


class _Reader:
    def __init__(self, pva, report, path: Path, debug: DebugInfo | None, progress: Progress | None,
                 workers: int | None = None):
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be None or >= 1, not {workers}")
        self.workers = workers
        self.pva = pva
        self.report = report
        self.path = path
        self.source = str(path)
        self.debug = debug
        self.progress = progress
        self.warnings: list[str] = []
        self.operation_warnings: list[str] = []
        self.ground_truth: GroundTruth | None = None
        self.done = 0
        self.total = 1
        self.part = "compilation"                       # what is being read, for an error message

    # -- helpers ------------------------------------------------------------------------------
    def _tick(self, n: int = 1) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)

    def _per_tile(self, values: Any, field: str, dtype=np.int64) -> np.ndarray:
        """The first IPU's entries of a per-tile array."""
        if values is None:
            return np.zeros(self.tiles, dtype)
        arr = np.asarray(values)
        if arr.ndim != 1 or len(arr) < self.tiles:
            raise ProfileError(self.source, field, f"{self.num_tiles} values (one per tile)",
                               f"{len(arr) if arr.ndim == 1 else arr.shape} values")
        return arr[: self.tiles].astype(dtype, copy=False)

    # -- the whole report -----------------------------------------------------------------------
    def read(self) -> Profile:
        comp = self.report.compilation
        tgt = comp.target
        self.tiles = int(tgt.tilesPerIpu)
        self.num_tiles = int(tgt.numTiles)
        ipus = int(getattr(tgt, "numIPUs", 1) or 1)
        replicas = int(getattr(tgt, "numReplicas", 1) or 1)
        if self.tiles < 1:
            raise ProfileError(self.source, "compilation.target.tilesPerIpu", "an integer >= 1", self.tiles)
        if ipus > 1 or replicas > 1:
            self.warnings.append(rules.several_ipus_warning(ipus, replicas, self.tiles))
        clock = float(getattr(tgt, "clockFrequency", 0) or 0)
        target = Target(name="ipu", tiles=self.tiles, bytes_per_tile=int(tgt.bytesPerTile),
                        clock_hz=clock if clock > 0 else None, kind="ipu", link_bytes_per_s=None,
                        description=f"read from {self.path.name}: {ipus} IPU(s) of {self.tiles} tiles x "
                                    f"{int(tgt.bytesPerTile):,} bytes")

        steps_raw = comp.livenessProgramSteps
        steps = [str(s.program.name) for s in steps_raw]
        self.num_steps = len(steps)
        brief = comp.loweredVariables.allBriefVars
        programs = comp.programs
        operations = self.pva.OperationAnalysis(self.report).operations
        self.total = len(brief) + len(programs) + len(operations)
        child = self._start_child(comp, programs, steps_raw) if self._in_two(len(brief), len(programs)) else None
        if child is not None:
            with child:
                try:
                    self._operation_side(brief, programs, operations)
                except Exception:
                    # report what a serial read reports: a damaged program side comes first
                    self._apply_program_side(self._child_result(child, comp, programs, steps_raw))
                    raise
                self._apply_program_side(self._child_result(child, comp, programs, steps_raw))
        else:
            self._program_side(comp, programs, steps_raw)
            self._operation_side(brief, programs, operations)
        self.part = "OperationAnalysis(report).operations"
        for prog in self.extra_programs:                    # programs only operations refer to
            self._add_program(prog, f"programs[_id={prog._id!r}]")
        progs = self._finish_programs()
        ops = self.operations
        gt = self.ground_truth

        info = ProfileInfo(
            name=self.path.parent.name if self.path.stem == "profile" and self.path.parent.name else self.path.stem,
            source="popvision",
            description=f"PopVision profile {self.path.name}"
                        + (f" with {self.debug.path.name}" if self.debug is not None else ""),
            synthetic=False, compute_source=self.compute_source, warnings=self.warnings + self.operation_warnings)
        profile = Profile(target=target, steps=steps, names=[], variables=self.variables, liveness=self.liveness,
                          programs=progs, operations=ops, compute_unit="cycles", ground_truth=gt, info=info)
        return profile.validate(self.source)

    # -- the two sides: programs, tiles and ground truth | variables and operations ---------------
    def _in_two(self, n_brief: int, n_programs: int) -> bool:
        if self.workers == 1 or not can_fork():
            return False
        return self.workers is not None or n_brief + PROGRAM_WEIGHT * n_programs >= PARALLEL_FROM

    def _program_side(self, comp, programs, steps_raw) -> None:
        """Tiles (vertex code sizes, ground truth), every program's costs, the ground truth's
        per-step trace: everything the operation side does not need."""
        self.part = "compilation.tiles"
        self._read_tiles(comp.tiles)
        self.part = "compilation.programs"
        self._read_programs(programs)
        self.part = "compilation.livenessProgramSteps"
        self.ground_truth = self._ground_truth(steps_raw)

    def _start_child(self, comp, programs, steps_raw) -> Forked | None:
        try:
            return Forked(lambda: self._program_side_in_child(comp, programs, steps_raw))
        except ChildFailed:                             # no child could be started: read in one process
            return None

    def _program_side_in_child(self, comp, programs, steps_raw) -> dict:
        self.progress = None                            # the parent reports progress
        self._program_side(comp, programs, steps_raw)
        gt = self.ground_truth
        return {
            "code_by_type": self.code_by_type, "names": self.p_name, "kinds": self.p_kind,
            "estimates": self.p_estimate, "fallback": self.p_fallback, "vertices": self.p_vertices,
            "vertex_types": self.vertex_types, "warnings": self.warnings,
            "rows": {cat: rows.finish() for cat, rows in self.rows.items()},
            "ground_truth": None if gt is None else {
                "always_live": gt.always_live, "not_always_live": gt.not_always_live,
                "categories": gt.categories, "step_tiles": gt.step_tiles, "step_bytes": gt.step_bytes},
        }

    def _child_result(self, child: Forked, comp, programs, steps_raw) -> dict | None:
        try:
            return child.result()
        except ChildFailed:                             # read it here instead (and meet its error, if any)
            self._program_side(comp, programs, steps_raw)
            return None

    # what _read_programs (or, its side read in a forked child, _apply_program_side) fills in
    code_by_type: dict[str, np.ndarray]
    p_name: list[str]
    p_kind: list[str]
    p_estimate: list[float]
    p_fallback: list[float]
    p_vertices: list[int]
    vertex_types: list[str]
    vertex_type_index: dict[str, int]

    def _apply_program_side(self, side: dict | None) -> None:
        if side is None:                                # already read in this process
            return
        self._tick(len(side["names"]))
        self.code_by_type = side["code_by_type"]
        self.p_name, self.p_kind = side["names"], side["kinds"]
        self.p_estimate, self.p_fallback, self.p_vertices = side["estimates"], side["fallback"], side["vertices"]
        self.vertex_types = side["vertex_types"]
        self.vertex_type_index = {name: t for t, name in enumerate(self.vertex_types)}
        self.warnings = side["warnings"]
        self.rows = {cat: _SparseRows.finished(self.tiles, *part) for cat, part in side["rows"].items()}
        gt = side["ground_truth"]
        self.ground_truth = None if gt is None else GroundTruth(**gt)

    def _operation_side(self, brief, programs, operations) -> None:
        """Variables and operations; programs are referred to by their place in ``programs``
        (programs only operations refer to are kept in ``extra_programs``)."""
        self.part = "compilation.programs"
        self.program_index = {prog._id: p for p, prog in enumerate(programs)}
        self.n_listed = len(programs)
        self.extra_programs: list[Any] = []
        self.part = "compilation.loweredVariables.allBriefVars"
        self.variables, self.liveness = self._read_variables(brief)
        self.part = "OperationAnalysis(report).operations"
        self.operations = self._read_operations(operations)

    # -- tiles: vertex code sizes and ground truth ------------------------------------------------
    def _read_tiles(self, tile_objs) -> None:
        T = self.tiles
        self.code_by_type = {}
        self.gt_arrays: dict[str, np.ndarray] | None = None
        if len(tile_objs) < T:
            if len(tile_objs):
                raise ProfileError(self.source, "compilation.tiles", f"{self.num_tiles} tiles", len(tile_objs))
            self.warnings.append(rules.NO_TILES_WARNING)
            return
        first = tile_objs[0].memory.category
        present = [(camel, snake) for camel, snake in CATEGORIES.items() if getattr(first, camel, None) is not None]
        gt = {"always_live": np.zeros(T, np.int64), "not_always_live": np.zeros(T, np.int64)}
        gt.update({snake: np.zeros(T, np.int64) for _, snake in present})
        al, nal = gt["always_live"], gt["not_always_live"]
        total = np.zeros(T, np.int64)
        has_total = True
        for t in range(T):
            mem = tile_objs[t].memory
            al[t] = mem.alwaysLiveBytes
            nal[t] = mem.notAlwaysLiveBytes
            whole = getattr(getattr(mem, "total", None), "excludingGaps", None) if has_total else None
            if whole is None:
                has_total = False
            else:
                total[t] = whole
            cat = mem.category
            for camel, snake in present:
                gt[snake][t] = getattr(cat, camel).total
            for v in mem.vertices:
                name = v.type.name
                sizes = self.code_by_type.get(name)
                if sizes is None:
                    sizes = self.code_by_type[name] = np.zeros(T, np.int64)
                sizes[t] = v.codeBytes
        self.gt_arrays = gt
        self.gt_total = total if has_total else None

    # -- variables and liveness --------------------------------------------------------------------
    def _read_variables(self, brief) -> tuple[Variables, Liveness]:
        n = len(brief)
        fields = [("id", np.int64), ("bytes", np.int64), ("tile", np.int64), ("cls", np.int64)]
        every = 1 << 18
        cols = np.empty(n, fields)                     # filled piece by piece: one allocation, no concatenation
        row = attrgetter("id", "bytes", "tileId", "equivalenceClass.id")       # one C-level pass per piece
        rows = map(row, brief)
        for start in range(0, n, every):
            count = min(every, n - start)
            cols[start:start + count] = np.fromiter(islice(rows, count), dtype=fields, count=count)
            self._tick(count)
        bad = np.flatnonzero((cols["tile"] < 0) | (cols["tile"] >= self.num_tiles))
        if len(bad):
            raise ProfileError(self.source, f"loweredVariables.allBriefVars[{int(bad[0])}].tileId",
                               f"a tile index in 0..{self.num_tiles - 1}", int(cols["tile"][bad[0]]))
        keep = cols["tile"] < self.tiles
        kept = np.flatnonzero(keep)
        # var id -> index among kept variables (-1: on another IPU)
        new_index = np.full(n, -1, np.int64)
        new_index[kept] = np.arange(len(kept))
        order = np.argsort(cols["id"], kind="stable")
        self.sorted_ids = cols["id"][order]
        self.sorted_target = new_index[order]
        if n > 1 and np.any(self.sorted_ids[1:] == self.sorted_ids[:-1]):
            dup = int(self.sorted_ids[1:][self.sorted_ids[1:] == self.sorted_ids[:-1]][0])
            raise ProfileError(self.source, "loweredVariables.allBriefVars.id", "distinct variable ids", dup)

        # equivalence classes: one stable sort gives each variable's class and, per class, its
        # first variable on the first IPU (classes only elsewhere are never read)
        by_class = np.argsort(cols["cls"], kind="stable")
        sorted_cls = cols["cls"][by_class]
        starts = np.flatnonzero(np.concatenate([[True], sorted_cls[1:] != sorted_cls[:-1]])) if n else \
            np.zeros(0, np.int64)
        uniq = sorted_cls[starts]
        inverse = np.empty(n, np.int64)
        inverse[by_class] = np.repeat(np.arange(len(uniq)), np.diff(np.append(starts, n)))
        first_kept = np.minimum.reduceat(np.where(keep[by_class], by_class, n), starts) if n else \
            np.zeros(0, np.int64)
        present = np.flatnonzero(first_kept < n)
        S = self.num_steps
        patterns: dict[tuple, int] = {}
        intervals: list[tuple] = []
        class_live = np.full(len(uniq), -1, np.int64)      # liveness class per unique class id
        class_always = np.zeros(len(uniq), bool)
        for k in present[np.argsort(first_kept[present], kind="stable")].tolist():   # by first appearance
            steps = brief[int(first_kept[k])].equivalenceClass.steps
            pattern = self._clean_intervals([(s.start, s.end) for s in steps], S)
            if S == 0 or pattern == ((0, S),):
                class_always[k] = True
            elif pattern:
                idx = patterns.get(pattern)
                if idx is None:
                    idx = patterns[pattern] = len(intervals)
                    intervals.append(pattern)
                class_live[k] = idx
        pos = inverse[kept]
        always = class_always[pos]
        live = np.where(always, -1, class_live[pos])
        variables = Variables(bytes=cols["bytes"][kept].copy(), tile=cols["tile"][kept].copy(), always_live=always,
                              live_class=live.astype(np.int64), name=np.full(len(kept), -1, np.int64))
        return variables, Liveness(Ragged.from_lists(intervals, dtype=np.int64, width=2))

    _clean_intervals = staticmethod(rules.clean_intervals)

    # -- programs ----------------------------------------------------------------------------------
    def _read_programs(self, programs) -> None:
        self.p_name = []
        self.p_kind = []
        self.p_estimate = []
        self.p_fallback = []
        self.p_vertices = []
        self.vertex_types = []
        self.vertex_type_index = {}
        self.rows = {cat: _SparseRows(self.tiles, 1) for cat in ("vertex_state", "exchange_code", "control_code")}
        self.rows["vertex_code"] = _SparseRows(self.tiles, 2)          # keys: program, vertex type
        for i, prog in enumerate(programs):
            self._add_program(prog, f"compilation.programs[{i}]")
            if i % 64 == 63:
                self._tick(64)
        self._tick(len(programs) % 64)
        for rows in self.rows.values():                 # as a read in two processes has them
            rows.finish()

    def _program_index(self, prog) -> int:
        """The place of an operation's program: in ``compilation.programs``, or after them."""
        key = prog._id
        idx = self.program_index.get(key)
        if idx is None:
            idx = self.program_index[key] = self.n_listed + len(self.extra_programs)
            self.extra_programs.append(prog)
        return idx

    def _add_program(self, prog, field: str) -> int:
        p = len(self.p_name)
        kind = str(prog.type.name)
        self.p_name.append(str(prog.name))
        self.p_kind.append(kind)
        rows = self.rows
        if len(prog.children) == 0:
            rows["control_code"].add(self._per_tile(prog.controlCodeByTile, f"{field}.controlCodeByTile"), p)
        estimate = math.nan
        count = np.zeros(self.tiles, np.int64)
        if kind == "DoExchange":
            rows["exchange_code"].add(self._per_tile(prog.codeBytesByTile, f"{field}.codeBytesByTile"), p)
            estimate = self._estimate(getattr(prog, "estimatedCyclesByTile", None), f"{field}.estimatedCyclesByTile")
        elif kind == "OnTileExecute":
            cs = prog.computeset
            state = np.zeros(self.tiles, np.int64)
            for k, vx in enumerate(cs.vertices):
                vtype = vx.type
                name = str(vtype.name)
                counts = self._per_tile(vx.countByTile, f"{field}.computeset.vertices[{k}].countByTile")
                count += counts
                state += counts * int(vtype.size)
                sizes = self.code_by_type.get(name)
                if sizes is not None:
                    code = np.where(counts > 0, sizes, 0)
                    if code.any():
                        t = self.vertex_type_index.get(name)
                        if t is None:
                            t = self.vertex_type_index[name] = len(self.vertex_types)
                            self.vertex_types.append(name)
                        rows["vertex_code"].add(code, p, t)
            rows["vertex_state"].add(state, p)
            estimate = self._estimate(getattr(cs, "estimatedCyclesByTile", None),
                                      f"{field}.computeset.estimatedCyclesByTile")
        self.p_estimate.append(estimate)
        self.p_vertices.append(int(count.sum()))
        self.p_fallback.append(float(count.max(initial=0)) * CYCLES_PER_VERTEX)
        return p

    def _estimate(self, values: Any, field: str) -> float:
        if values is None or len(values) == 0:
            return math.nan
        peak = float(self._per_tile(values, field, np.float64).max(initial=0.0))
        return peak if peak > 0 else math.nan

    def _finish_programs(self) -> Programs:
        estimates = np.array(self.p_estimate, float)
        if np.any(~np.isnan(estimates)):
            cycles = estimates
            self.compute_source = rules.compute_source(True, int(np.isnan(estimates).sum()))
        else:
            cycles = np.array(self.p_fallback, float)
            self.compute_source = rules.compute_source(False, 0)

        def costs(cat: str) -> TileCosts:
            (program,), tile, values = self.rows[cat].finish()
            return TileCosts(program, tile, values)

        (program, vertex_type), tile, values = self.rows["vertex_code"].finish()
        vc = VertexCode(program, tile, vertex_type, values)
        return Programs(name=self.p_name, kind=self.p_kind, cycles=cycles,
                        vertices=np.array(self.p_vertices, np.int64), vertex_types=self.vertex_types,
                        vertex_code=vc, vertex_state=costs("vertex_state"), exchange_code=costs("exchange_code"),
                        control_code=costs("control_code"))

    # -- operations ----------------------------------------------------------------------------------
    def _read_operations(self, operations) -> Operations:
        n = len(operations)
        names: list[str] = []
        inputs: list[tuple[str, ...]] = []
        debug_ids = np.zeros(n, np.int64)
        first = np.full(n, -1, np.int64)
        last = np.full(n, -1, np.int64)
        var_rows: list[np.ndarray] = []
        prog_rows: list[np.ndarray] = []
        bad_steps = unknown_vars = 0
        get_id = attrgetter("_id")
        S = self.num_steps
        for i in range(n):
            op = operations[i]
            dc = op.debugContext
            did = int(dc.id)
            debug_ids[i] = did
            doc = _load_json(getattr(dc, "json", None))
            raw_name = str(op.name)
            user = None
            if raw_name == "" and not doc.get("tensorId"):
                user = _as_text(doc.get("op_name")) or _as_text(doc.get("opName"))
                if user is None and self.debug is not None:
                    user = self.debug.user_op_name(did)
            names.append(operation_name(raw_name, doc, user))
            ins = _json_inputs(doc)
            if not ins and self.debug is not None:
                ins = self.debug.inputs(did)
            inputs.append(ins)
            prog_rows.append(np.array([self._program_index(pr) for pr in op.programs()], np.int64))
            ids = np.fromiter(map(get_id, op.vars), np.int64)
            pos = np.searchsorted(self.sorted_ids, ids)
            pos = np.minimum(pos, max(len(self.sorted_ids) - 1, 0))
            found = (self.sorted_ids[pos] == ids) if len(self.sorted_ids) else np.zeros(len(ids), bool)
            unknown_vars += int((~found).sum())
            idx = self.sorted_target[pos[found]]
            var_rows.append(idx[idx >= 0])
            f, l = int(op.firstStepIndex), int(op.lastStepIndex)
            if 0 <= f <= l < S:
                first[i], last[i] = f, l
            else:
                bad_steps += 1
            if i % 16 == 15:
                self._tick(16)
        self._tick(n % 16)
        self.operation_warnings += rules.operation_warnings(bad_steps, S, unknown_vars)
        return Operations(name=names, debug_id=debug_ids, inputs=inputs, first_step=first, last_step=last,
                          vars=_ragged(var_rows), programs=_ragged(prog_rows), compute=np.full(n, math.nan),
                          layer=[None] * n)

    # -- ground truth --------------------------------------------------------------------------------
    def _ground_truth(self, steps_raw) -> GroundTruth | None:
        if self.gt_arrays is None:
            return None
        g = dict(self.gt_arrays)
        always, peak = g.pop("always_live"), g.pop("not_always_live")
        if self.gt_total is not None:
            always = self._reconcile(always, peak, g, self.gt_total)
        gt = GroundTruth(always_live=always, not_always_live=peak, categories=g)
        S = self.num_steps
        if S and hasattr(steps_raw[0], "notAlwaysLiveMemoryForTile"):
            top = np.array(rules.trace_tiles(gt.tile_total().tolist(), TRACE_TILES), np.int64)
            trace = np.zeros((len(top), S), np.int64)
            tiles = top.tolist()
            for i, step in enumerate(steps_raw):
                for k, t in enumerate(tiles):
                    trace[k, i] = step.notAlwaysLiveMemoryForTile(t).bytes
            gt.step_tiles, gt.step_bytes = top, trace
        return gt


    def _reconcile(self, always: np.ndarray, peak: np.ndarray, categories: dict[str, np.ndarray],
                   total: np.ndarray) -> np.ndarray:
        """Fit the ground truth to the report's own per-tile total (``pva_export.reconcile``)."""
        lists = {name: values.tolist() for name, values in categories.items()}
        variables, warning = rules.reconcile(always.tolist(), peak.tolist(), lists, total.tolist())
        if warning:
            self.warnings.append(warning)
        if "other" in lists:
            categories["other"] = np.array(lists["other"], np.int64)
        return np.array(variables, np.int64)


class _SparseRows:
    """Per-tile rows (one per program, or per program and vertex type), gathered in dense
    blocks and kept sparse: the keys, tile and value of every non-zero entry, in row order and
    tile order within a row. One ``np.nonzero`` per block instead of one per row."""

    BLOCK = 256

    def __init__(self, tiles: int, n_keys: int):
        self.block = np.zeros((self.BLOCK, tiles), np.int64)
        self.n_keys = n_keys
        self.keys: list[tuple[int, ...]] = []
        self.parts: list[tuple[list[np.ndarray], np.ndarray, np.ndarray]] = []

    def add(self, values: np.ndarray, *keys: int) -> None:
        self.block[len(self.keys)] = values
        self.keys.append(keys)
        if len(self.keys) == self.BLOCK:
            self._flush()

    def _flush(self) -> None:
        filled = self.block[: len(self.keys)]
        rows, tiles = np.nonzero(filled)
        values = filled[rows, tiles]
        key_columns = np.array(self.keys, np.int64).reshape(len(self.keys), self.n_keys)
        self.parts.append(([narrowest_int(key_columns[rows, k]) for k in range(self.n_keys)], narrowest_int(tiles),
                           narrowest_int(values)))
        self.keys = []

    @classmethod
    def finished(cls, tiles: int, keys: list[np.ndarray], tile: np.ndarray, values: np.ndarray) -> _SparseRows:
        """Rows that hold what ``finish`` returned (more can be added)."""
        rows = cls(tiles, len(keys))
        rows.parts = [(list(keys), tile, values)]
        return rows

    def finish(self) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """(key columns, tile, value) of every non-zero entry so far, each in the narrowest
        integer type that holds it (as the compact reader gives them; users widen before
        arithmetic). More rows can be added after it."""
        if self.keys:
            self._flush()
        parts = self.parts

        def joined(arrays: list[np.ndarray]) -> np.ndarray:
            filled = [a for a in arrays if len(a)]       # an empty block's arrays must not widen the type
            if not filled:
                return np.zeros(0, np.int8)
            return np.concatenate(filled, dtype=np.result_type(*filled)) if len(filled) > 1 else filled[0]

        keys = [joined([part[0][k] for part in parts]) for k in range(self.n_keys)]
        whole = keys, joined([part[1] for part in parts]), joined([part[2] for part in parts])
        self.parts = [whole]
        return whole


def _ragged(rows: list[np.ndarray]) -> Ragged:
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    values = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
    return Ragged(offsets, values)
