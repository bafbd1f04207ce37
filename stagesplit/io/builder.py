"""Build a Profile piece by piece: used by the JSON reader, the per-layer form, the generator
of synthetic profiles and the tests. Bulk methods take numpy arrays for large profiles."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .profile import (
    ROLES,
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
)

__all__ = ["ALWAYS", "ProfileBuilder"]

ALWAYS = "always"


class ProfileBuilder:
    """Build a Profile in code (tests, the per-layer form, synthetic profiles): variables, programs and
    operations by name, validated on build()."""

    def __init__(self, target: Target, steps: int | Sequence[str], compute_unit: str = "cycles",
                 info: ProfileInfo | None = None):
        self.target = target
        self.steps = [f"step{i}" for i in range(int(steps))] if isinstance(steps, (int, np.integer)) else list(steps)
        self.compute_unit = compute_unit
        self.info = info or ProfileInfo()
        self.ground_truth: GroundTruth | None = None
        self._names: list[str] = []
        self._name_index: dict[str, int] = {}
        self._classes: list[tuple[tuple[int, int], ...]] = []
        self._class_index: dict[tuple[tuple[int, int], ...], int] = {}
        self._var_chunks: list[tuple[np.ndarray, ...]] = []
        self._var_rows: list[tuple[int, int, bool, int, int]] = []
        self._nvars = 0
        self._roles: dict[int, int] = {}
        self._prog_name: list[str] = []
        self._prog_kind: list[str] = []
        self._prog_cycles: list[float] = []
        self._prog_vertices: list[int] = []
        self._vertex_types: list[str] = []
        self._vertex_type_index: dict[str, int] = {}
        self._costs: dict[str, list[np.ndarray]] = {"vertex_code": [], "vertex_state": [], "exchange_code": [],
                                                     "control_code": []}
        self._ops: list[tuple] = []

    # ---- strings and liveness -------------------------------------------------------------
    def name_id(self, name: str | None) -> int:
        """The index of ``name`` in the profile's name table (added once)."""
        if name is None:
            return -1
        idx = self._name_index.get(name)
        if idx is None:
            idx = self._name_index[name] = len(self._names)
            self._names.append(name)
        return idx

    def liveness_class(self, intervals: Iterable[Sequence[int]]) -> int:
        """The class for these half-open step intervals (shared with identical patterns).
        Overlapping intervals are merged: a variable is live on their union, counted once."""
        key = _merge_overlaps(sorted((int(s), int(e)) for s, e in intervals))
        idx = self._class_index.get(key)
        if idx is None:
            idx = self._class_index[key] = len(self._classes)
            self._classes.append(key)
        return idx

    def vertex_type(self, name: str) -> int:
        """The index of vertex type ``name`` (added once)."""
        idx = self._vertex_type_index.get(name)
        if idx is None:
            idx = self._vertex_type_index[name] = len(self._vertex_types)
            self._vertex_types.append(name)
        return idx

    # ---- variables ------------------------------------------------------------------------
    def variable(self, bytes: int, tile: int = 0, live: str | Iterable[Sequence[int]] = ALWAYS,
                 name: str | None = None, role: str | None = None) -> int:
        """Add one variable; ``live`` is "always" or a list of half-open [start, end) intervals;
        ``role`` one of ``ROLES`` (a profile with no role given has none recorded)."""
        self._flush_rows_if_needed()
        if isinstance(live, str):
            always, cls = True, -1
        else:
            intervals = [iv for iv in live if iv[1] > iv[0]]
            always, cls = False, (self.liveness_class(intervals) if intervals else -1)
        self._var_rows.append((int(bytes), int(tile), always, cls, self.name_id(name)))
        if role is not None:
            self._roles[self._nvars] = ROLES.index(role)
        self._nvars += 1
        return self._nvars - 1

    def variables(self, bytes: np.ndarray, tile: np.ndarray, live_class: np.ndarray,
                  always_live: np.ndarray | None = None, name: np.ndarray | None = None) -> np.ndarray:
        """Add many variables at once; ``live_class`` values come from ``liveness_class``."""
        self._flush_rows()
        n = len(bytes)
        always = np.zeros(n, bool) if always_live is None else np.asarray(always_live, bool)
        names = np.full(n, -1, np.int64) if name is None else np.asarray(name, np.int64)
        cls = np.where(always, -1, np.asarray(live_class, np.int64))
        self._var_chunks.append((np.asarray(bytes, np.int64), np.asarray(tile, np.int64), always, cls, names))
        first = self._nvars
        self._nvars += n
        return np.arange(first, self._nvars)

    def _flush_rows_if_needed(self) -> None:
        if len(self._var_rows) >= 65536:
            self._flush_rows()

    def _flush_rows(self) -> None:
        if not self._var_rows:
            return
        b, t, a, c, n = zip(*self._var_rows)
        self._var_chunks.append((np.array(b, np.int64), np.array(t, np.int64), np.array(a, bool),
                                 np.array(c, np.int64), np.array(n, np.int64)))
        self._var_rows = []

    # ---- programs and operations -----------------------------------------------------------
    @property
    def num_programs(self) -> int:
        return len(self._prog_name)

    def program(self, name: str, kind: str = "OnTileExecute", cycles: float = float("nan"), vertices: int = 0,
                vertex_code: Iterable[tuple[int, str, int]] = (), vertex_state: Iterable[tuple[int, int]] = (),
                exchange_code: Iterable[tuple[int, int]] = (), control_code: Iterable[tuple[int, int]] = ()) -> int:
        """Add a program; code costs are (tile, bytes) pairs, vertex code (tile, vertex type, bytes)."""
        p = len(self._prog_name)
        self._prog_name.append(name)
        self._prog_kind.append(kind)
        self._prog_cycles.append(float(cycles))
        self._prog_vertices.append(int(vertices))
        rows = [(p, int(tile), self.vertex_type(vtype), int(nbytes)) for tile, vtype, nbytes in vertex_code]
        if rows:
            self._costs["vertex_code"].append(_held(np.array(rows, np.int64)))
        for cat, pairs in (("vertex_state", vertex_state), ("exchange_code", exchange_code),
                           ("control_code", control_code)):
            pair_rows = [(p, int(tile), int(nbytes)) for tile, nbytes in pairs]
            if pair_rows:
                self._costs[cat].append(_held(np.array(pair_rows, np.int64)))
        return p

    def program_costs(self, category: str, program: int, tiles: np.ndarray, nbytes: np.ndarray | int,
                      vertex_type: str | Sequence[str] | None = None) -> None:
        """Add one program's costs on many tiles at once, in their order (vertex code also names the
        vertex type: one for every tile, or each tile's)."""
        tiles = np.asarray(tiles, np.int64)
        cols = [np.full(len(tiles), program, np.int64), tiles]
        if category == "vertex_code":
            assert vertex_type is not None                  # vertex code names its vertex type
            if isinstance(vertex_type, str):
                cols.append(np.full(len(tiles), self.vertex_type(vertex_type), np.int64))
            else:
                index = {name: self.vertex_type(name) for name in dict.fromkeys(vertex_type)}   # first seen, first
                cols.append(np.array([index[name] for name in vertex_type], np.int64))
        cols.append(np.broadcast_to(np.asarray(nbytes, np.int64), tiles.shape))
        self._costs[category].append(_held(np.stack(cols, axis=1)))

    def operation(self, name: str, first_step: int = -1, last_step: int = -1, vars: Iterable[int] = (),
                  programs: Iterable[int] = (), inputs: Iterable[str] = (), compute: float = float("nan"),
                  layer: str | None = None, debug_id: int = -1, bytes_accessed: float = float("nan")) -> int:
        """Add an operation running steps first..last (-1: unknown) with its variables and programs; returns
        its index."""
        self._ops.append((name, int(debug_id), tuple(inputs), int(first_step), int(last_step),
                          np.asarray(list(vars) if not isinstance(vars, np.ndarray) else vars, np.int64),
                          np.asarray(list(programs), np.int64), float(compute), layer, float(bytes_accessed)))
        return len(self._ops) - 1

    # ---- result ----------------------------------------------------------------------------
    def build(self, validate: bool = True, source: str | None = None) -> Profile:
        """The Profile, validated unless ``validate`` is false."""
        self._flush_rows()
        if self._var_chunks:
            cols = [np.concatenate([c[i] for c in self._var_chunks]) for i in range(5)]
        else:
            cols = [np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0, np.int64),
                    np.zeros(0, np.int64)]
        variables = Variables(bytes=cols[0], tile=cols[1], always_live=cols[2], live_class=cols[3], name=cols[4])
        if self._roles:
            variables.role = np.zeros(len(cols[0]), np.int8)
            variables.role[list(self._roles)] = list(self._roles.values())
        liveness = Liveness(Ragged.from_lists(self._classes, dtype=np.int64, width=2))

        def columns(cat: str, width: int) -> list[np.ndarray]:
            # each int64 column straight from the held chunks: no (rows x width) copy on the way
            chunks = self._costs[cat]
            return [np.concatenate([c[:, j] for c in chunks], dtype=np.int64) if chunks else np.zeros(0, np.int64)
                    for j in range(width)]

        def tile_costs(cat: str) -> TileCosts:
            return TileCosts(*columns(cat, 3))

        programs = Programs(
            name=self._prog_name, kind=self._prog_kind,
            cycles=np.array(self._prog_cycles, float), vertices=np.array(self._prog_vertices, np.int64),
            vertex_types=self._vertex_types,
            vertex_code=VertexCode(*columns("vertex_code", 4)),
            vertex_state=tile_costs("vertex_state"), exchange_code=tile_costs("exchange_code"),
            control_code=tile_costs("control_code"))
        ops = self._ops
        operations = Operations(
            name=[o[0] for o in ops], debug_id=np.array([o[1] for o in ops], np.int64),
            inputs=[o[2] for o in ops],
            first_step=np.array([o[3] for o in ops], np.int64), last_step=np.array([o[4] for o in ops], np.int64),
            vars=_ragged([o[5] for o in ops]), programs=_ragged([o[6] for o in ops]),
            compute=np.array([o[7] for o in ops], float), layer=[o[8] for o in ops],
            bytes_accessed=np.array([o[9] for o in ops], float))
        profile = Profile(target=self.target, steps=self.steps, names=self._names, variables=variables,
                          liveness=liveness, programs=programs, operations=operations,
                          compute_unit=self.compute_unit, ground_truth=self.ground_truth, info=self.info)
        return profile.validate(source) if validate else profile


def _merge_overlaps(intervals: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted intervals with overlapping ones merged (touching ones stay separate)."""
    out: list[tuple[int, int]] = []
    for s, e in intervals:
        if out and s < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return tuple(out)


def _held(rows: np.ndarray) -> np.ndarray:
    """Per-program cost rows as the builder holds them until build(): int32 where they fit
    (half the memory of a large profile's tens of millions of rows), widened again on build."""
    if rows.size and np.iinfo(np.int32).min <= rows.min() and rows.max() <= np.iinfo(np.int32).max:
        return rows.astype(np.int32)
    return rows


def _ragged(rows: list[np.ndarray]) -> Ragged:
    lengths = np.array([len(r) for r in rows], np.int64)
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return Ragged(offsets, values.astype(np.int64))
