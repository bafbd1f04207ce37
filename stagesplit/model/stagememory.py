"""One stage's memory, priced from scratch with full per-tile detail, and its typed breakdown.

For a stage (layers ``a..b``), per tile:

    variables      = peak, over the stage's program-step columns, of the bytes of its live
                     not-always-live variables, plus its always-live variable bytes
    vertex code    = code of each vertex type present on the tile, counted once (code is shared)
    vertex state, exchange code, control code = summed over the stage's programs
    stash          = bytes of its stashed variables (``stash``), held once more per extra
                     micro-batch in flight

This is the reference computation: ``pricing.price_all_ranges`` prices every range in one
sweep with no code in common, and the tests check one against the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from ..common.chunks import CHUNK
from ..io.profile import TileCosts, VertexCode
from .timeline import ramp
from .view import PricingView

__all__ = ["CATEGORIES", "MemoryBreakdown", "StageMemory", "freeze", "price_stage", "program_code", "stage_items"]


CATEGORIES = ("variables", "vertex_code", "vertex_state", "exchange_code", "control_code")


@dataclass
class StageMemory:
    """Per-tile memory of one stage (layers ``first..last``), by category."""

    first: int
    last: int
    always_live: np.ndarray
    not_always_live: np.ndarray
    peak_step: np.ndarray
    vertex_code: np.ndarray
    vertex_state: np.ndarray
    exchange_code: np.ndarray
    control_code: np.ndarray
    stash: np.ndarray

    @property
    def variables(self) -> np.ndarray:
        result: np.ndarray = self.always_live + self.not_always_live
        return result

    def category(self, name: str) -> np.ndarray:
        """One category's per-tile bytes by name."""
        result: np.ndarray = getattr(self, name)
        return result

    def total(self, in_flight: int = 1) -> np.ndarray:
        """Bytes per tile with ``in_flight`` micro-batches' stashed activations held."""
        out: np.ndarray = (self.variables + self.vertex_code + self.vertex_state + self.exchange_code
                           + self.control_code + (in_flight - 1) * self.stash)
        return out

    def worst_tile(self, in_flight: int = 1) -> int:
        """The fullest tile with ``in_flight`` micro-batches in flight (lowest index on ties)."""
        return int(np.argmax(self.total(in_flight)))

    def worst_bytes(self, in_flight: int = 1) -> int:
        """The fullest tile's bytes with ``in_flight`` micro-batches in flight."""
        return int(self.total(in_flight).max())

    def at_tile(self, tile: int, in_flight: int = 1) -> MemoryBreakdown:
        """The breakdown of one tile's bytes."""
        return MemoryBreakdown(*(int(a[tile]) for a in self._arrays(in_flight)))

    def summed(self, in_flight: int = 1) -> MemoryBreakdown:
        """The breakdown summed over tiles."""
        return MemoryBreakdown(*(int(a.sum()) for a in self._arrays(in_flight)))

    def _arrays(self, in_flight: int) -> tuple[np.ndarray, ...]:
        return (self.always_live, self.not_always_live, (in_flight - 1) * self.stash, self.vertex_code,
                self.vertex_state, self.exchange_code, self.control_code)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes by category (of one tile, or summed over tiles). ``stashed_copies`` is the extra
    copies of stashed activations for the micro-batches in flight beyond the first."""

    always_live: int = 0
    not_always_live: int = 0
    stashed_copies: int = 0
    vertex_code: int = 0
    vertex_state: int = 0
    exchange_code: int = 0
    control_code: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, int]:
        """The categories as a plain mapping (plan files, diagnose tables)."""
        return asdict(self)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MemoryBreakdown:
        return cls(**{k: int(values.get(k, 0)) for k in cls.keys()})


def stage_items(model: PricingView, first: int, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean masks of the stage's variables, programs and program-step columns."""
    vars_, progs = model.base_items()
    vars_[model.var_items.in_range(first, last)] = True
    progs[model.prog_items.in_range(first, last)] = True
    cols = model.base_stage_cols | model.timeline.cover[first:last + 1].any(axis=0) if model.num_columns else \
        np.zeros(0, bool)
    return vars_, progs, cols


def price_stage(model: PricingView, vars_: np.ndarray, progs: np.ndarray, cols: np.ndarray, first: int,
                last: int) -> StageMemory:
    """The memory of the given variables, programs and columns (a stage, or the shared items)."""
    T = model.num_tiles
    v = model.profile.variables
    stage_cols = np.flatnonzero(cols)
    if len(stage_cols):
        # live bytes on the stage's own columns only: a row covers the stage columns between
        # the first at or after its start and the first at or after its end
        rows = np.flatnonzero(vars_[model.timeline.row_var])
        # TODO: this rebinds the parameter ``first``, so StageMemory(first=...) below gets this array
        # where the stage has columns (found by mypy; kept as it is: no behaviour change in the lint work)
        first = np.searchsorted(stage_cols, model.timeline.row_col_start[rows])  # type: ignore[assignment]
        end = np.searchsorted(stage_cols, model.timeline.row_col_end[rows])
        keep = end > first
        tl = model.timeline
        live = _live_on(tl.row_tile[rows][keep], tl.row_bytes[rows][keep], first[keep], end[keep], T,  # type: ignore[index]
                        len(stage_cols))
        col = live.argmax(axis=1)
        nal = np.maximum(live[np.arange(T), col], 0)
        peak_step = np.where(nal > 0, model.timeline.breaks[stage_cols[col]], -1)
    else:
        nal = np.zeros(T, np.int64)
        peak_step = np.full(T, -1, np.int64)
    al = vars_ & v.always_live
    st = vars_ & model.var_stashed
    code = program_code(model, np.flatnonzero(progs))
    return StageMemory(
        first=first, last=last,
        always_live=np.bincount(v.tile[al], weights=v.bytes[al], minlength=T).astype(np.int64),
        not_always_live=nal.astype(np.int64), peak_step=peak_step.astype(np.int64),
        vertex_code=code["vertex_code"], vertex_state=code["vertex_state"],
        exchange_code=code["exchange_code"], control_code=code["control_code"],
        stash=np.bincount(v.tile[st], weights=v.bytes[st], minlength=T).astype(np.int64))


def _live_on(tile: np.ndarray, nbytes: np.ndarray, first: np.ndarray, end: np.ndarray, T: int,
             width: int) -> np.ndarray:
    """Live bytes per (tile, column) of rows covering columns first..end-1 of ``width``."""
    idx = np.concatenate([tile * (width + 1) + first, tile * (width + 1) + end])
    b = nbytes.astype(float)
    diff = np.bincount(idx, weights=np.concatenate([b, -b]), minlength=T * (width + 1))
    return np.rint(np.cumsum(diff.reshape(T, width + 1)[:, :width], axis=1)).astype(np.int64)


def program_code(model: PricingView, progs: np.ndarray) -> dict[str, np.ndarray]:
    """Per-tile code of the programs ``progs`` (sorted, distinct) by category; vertex code once
    per (tile, type)."""
    T = model.num_tiles
    pr = model.profile.programs
    progs = np.asarray(progs, np.int64)
    ntypes = max(len(pr.vertex_types), 1)
    out = {}
    for cat, costs in list(pr.categories().items()) + [("vertex_code", pr.vertex_code)]:
        order, offsets = _entries_by_program(model, cat, costs)
        if cat == "vertex_code":
            assert isinstance(costs, VertexCode)
            present = np.zeros(T * ntypes, bool)            # each (tile, vertex type) once
            for e in _entry_chunks(order, offsets, progs):
                present[costs.tile[e].astype(np.int64) * ntypes + costs.vertex_type[e]] = True
            key = np.flatnonzero(present)
            size = model.vertex_code_size[key // ntypes, key % ntypes]
            out[cat] = np.bincount(key // ntypes, weights=size, minlength=T).astype(np.int64)
        else:
            total = np.zeros(T)
            for e in _entry_chunks(order, offsets, progs):
                total += np.bincount(costs.tile[e], weights=costs.bytes[e], minlength=T)
            out[cat] = np.rint(total).astype(np.int64)
    return out


def _entry_chunks(order: np.ndarray | None, offsets: np.ndarray, progs: np.ndarray) -> Iterator[slice | np.ndarray]:
    """The entries of the programs ``progs`` (sorted), as slices where the entries are in
    program order (a stage's programs are mostly runs of consecutive numbers: one slice per
    run, no index arrays), else as one index array."""
    if len(progs) == 0:
        return
    if order is None:
        breaks = np.flatnonzero(np.diff(progs) != 1) + 1
        starts = progs[np.concatenate([[0], breaks])]
        ends = progs[np.concatenate([breaks - 1, [len(progs) - 1]])]
        if len(starts) <= 4096:
            for lo, hi in zip(offsets[starts].tolist(), offsets[ends + 1].tolist()):
                for at in range(lo, hi, CHUNK):          # bounded pieces: small temporaries, reused memory
                    yield slice(at, min(at + CHUNK, hi))
            return
    counts = offsets[progs + 1] - offsets[progs]
    e = np.repeat(offsets[progs], counts) + ramp(counts)
    yield e if order is None else order[e]


def _entries_by_program(model: PricingView, cat: str, costs: TileCosts | VertexCode
                        ) -> tuple[np.ndarray | None, np.ndarray]:
    """Entry order of one code category by program (None: already in program order, as
    readers write it) and per-program offsets into that order; cached on the model."""
    cache: dict[str, tuple[np.ndarray | None, np.ndarray]] = model.__dict__.setdefault("_entries_by_program", {})
    if cat not in cache:
        n = len(model.profile.programs)
        program = costs.program
        order = None
        if len(program) > 1 and np.any(program[1:] < program[:-1]):
            order = np.argsort(program, kind="stable").astype(np.int32 if len(program) < 2**31 else np.int64)
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(program, minlength=n), out=offsets[1:])
        else:
            # needles of the entries' own (narrow) type: no int64 copy of tens of millions of entries
            narrow = program.dtype.kind in "iu" and np.iinfo(program.dtype).max >= n
            needles = np.arange(n + 1, dtype=program.dtype if narrow else np.int64)
            offsets = np.searchsorted(program, needles).astype(np.int64)
        cache[cat] = (order, offsets)
    return cache[cat]


def freeze(memory: StageMemory) -> StageMemory:
    """Make the arrays read-only (a cached StageMemory is shared between callers)."""
    for f in fields(memory):
        value = getattr(memory, f.name)
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return memory
