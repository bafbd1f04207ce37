"""The stage memory model: how much memory a contiguous range of layers needs on one device.

For a stage (layers ``a..b``), per tile:

    variables      = peak, over the stage's program steps, of the bytes of its live
                     not-always-live variables, plus its always-live variable bytes
    vertex code    = code of each vertex type present on the tile, counted once (code is shared)
    vertex state, exchange code, control code = summed over the stage's programs

The stage's variables and programs are those used by its operations; an item used by several
layers is counted once per stage. The stage's program steps are the steps its operations span
(an operation with unknown steps: the steps where one of its not-always-live variables is live).
An operation's compute is its own figure or its equal share of its programs' cycles (see
docs/profile-format.md, "How a stage is priced from the full form").
Items with no layer ("shared": used only by operations without a layer, or by no operation at
all) are counted on *every* stage with ``shared="every"`` (the default: global buffers,
constants and control state exist on every device, and an under-estimate means a plan that
does not fit), or on none with ``shared="none"`` (PopLiner's assumption that they spread out).

``price_ranges`` prices all L(L+1)/2 ranges incrementally: for each first layer it adds one
layer at a time, touching only the tiles x steps window of the variables that layer brings
in and the steps it adds, since a peak over more steps and more bytes can only grow.
``stage_memory`` computes one range from scratch with full per-tile detail; the two share no
pricing code, so each checks the other.

Stashed activations (for pipeline schedules), the rule of docs/profile-format.md: a
not-always-live variable is *stashed* when, for a layer ``l`` that uses it, it stays live
(without a break, however its intervals are written) from a step where ``l`` runs, through a
step where another layer runs and ``l`` does not, to a later step where ``l`` runs: it is
written in the forward pass and read back in the backward pass, so a pipeline keeps one copy
per micro-batch in flight. Always-live variables (weights, optimizer state) are never
duplicated.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Sequence

import numpy as np

from .errors import StagesplitError
from .layers import LayerAssignment
from .profile import Profile

CATEGORIES = ("variables", "vertex_code", "vertex_state", "exchange_code", "control_code")
SHARED_POLICIES = ("every", "none")


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
        return self.always_live + self.not_always_live

    def category(self, name: str) -> np.ndarray:
        return getattr(self, name)

    def total(self, in_flight: int = 1) -> np.ndarray:
        """Bytes per tile with ``in_flight`` micro-batches' stashed activations held."""
        return (self.variables + self.vertex_code + self.vertex_state + self.exchange_code + self.control_code
                + (in_flight - 1) * self.stash)

    def worst_tile(self, in_flight: int = 1) -> int:
        return int(np.argmax(self.total(in_flight)))

    def worst_bytes(self, in_flight: int = 1) -> int:
        return int(self.total(in_flight).max())


@dataclass
class OperationCosts:
    """Per-operation bytes summed over tiles, and compute."""

    always_live: np.ndarray
    not_always_live: np.ndarray
    vertex_code: np.ndarray
    vertex_state: np.ndarray
    exchange_code: np.ndarray
    control_code: np.ndarray
    compute: np.ndarray

    @property
    def variables(self) -> np.ndarray:
        return self.always_live + self.not_always_live

    @property
    def total(self) -> np.ndarray:
        return self.variables + self.vertex_code + self.vertex_state + self.exchange_code + self.control_code


@dataclass
class RangeTable:
    """Costs of every contiguous layer range: entry ``[k, a, b]`` is the range ``a..b`` (b >= a)
    with ``in_flight[k]`` micro-batches in flight. Entries with b < a are unused (zero)."""

    in_flight: tuple[int, ...]
    worst_bytes: np.ndarray
    worst_tile: np.ndarray
    compute: np.ndarray

    def k_index(self, in_flight: int) -> int:
        return self.in_flight.index(in_flight)


@dataclass
class _LayerItems:
    """Per-layer CSR lists (including items shared with other layers)."""

    offsets: np.ndarray
    values: np.ndarray

    def of(self, layer: int) -> np.ndarray:
        return self.values[self.offsets[layer]:self.offsets[layer + 1]]


def _group_by_layer(item: np.ndarray, layer: np.ndarray, num_layers: int) -> _LayerItems:
    order = np.lexsort((item, layer))
    counts = np.bincount(layer, minlength=num_layers)
    offsets = np.zeros(num_layers + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return _LayerItems(offsets, item[order])


def _item_layer_pairs(ragged_offsets: np.ndarray, ragged_values: np.ndarray, op_layer: np.ndarray,
                      num_items: int, num_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (item, layer) pairs from operations' item lists, sorted by item then layer."""
    op_of = np.repeat(np.arange(len(ragged_offsets) - 1), np.diff(ragged_offsets))
    layer = op_layer[op_of]
    keep = layer >= 0
    key = _sorted_unique(ragged_values[keep].astype(np.int64) * num_layers + layer[keep])
    return key // num_layers, key % num_layers


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for large integer arrays (a sort, which beats hashing here)."""
    values = np.sort(values)
    if len(values) == 0:
        return values
    return values[np.concatenate([[True], values[1:] != values[:-1]])]


class StageCostModel:
    """Prices stages (contiguous layer ranges) of one profile under one layer assignment."""

    def __init__(self, profile: Profile, layers: LayerAssignment, shared: str = "every"):
        if shared not in SHARED_POLICIES:
            raise ValueError(f"shared must be one of {SHARED_POLICIES}")
        self.profile = profile
        self.layers = layers
        self.shared = shared
        self._stage_memory: dict[tuple[int, int], StageMemory] = {}
        p = profile
        L = layers.num_layers
        T = p.target.tiles
        self.num_layers = L
        self.num_tiles = T
        ops = p.operations
        v = p.variables
        nv = len(v)

        # -- items and the layers that use them ----------------------------------------------
        self.var_pair_var, self.var_pair_layer = _item_layer_pairs(ops.vars.offsets, ops.vars.values,
                                                                   layers.op_layer, nv, L)
        self.layer_vars = _group_by_layer(self.var_pair_var, self.var_pair_layer, L)
        self.var_num_layers = np.bincount(self.var_pair_var, minlength=nv)
        self.var_shared = self.var_num_layers == 0
        np_ = len(p.programs)
        self.prog_pair_prog, self.prog_pair_layer = _item_layer_pairs(ops.programs.offsets, ops.programs.values,
                                                                      layers.op_layer, np_, L)
        self.prog_shared = np.bincount(self.prog_pair_prog, minlength=np_) == 0

        # -- the timeline, compressed into columns of steps where nothing changes -------------
        self._build_columns()

        # -- per-variable derived data ---------------------------------------------------------
        self.var_nal = ~v.always_live & (v.live_class >= 0)
        iv = p.liveness.intervals.values.reshape(-1, 2)
        nal_vars = np.flatnonzero(self.var_nal)
        cls = v.live_class[nal_vars]
        reps = p.liveness.intervals.lengths()[cls]
        interval = np.repeat(p.liveness.intervals.offsets[cls], reps) + _ramp(reps)
        row_var = np.repeat(nal_vars, reps)                      # one row per (variable, interval)
        step_start, step_end = iv[interval, 0], iv[interval, 1]
        nonempty = step_end > step_start
        self.row_var = row_var[nonempty]                          # sorted by variable
        self.row_col_start = self.column_of(step_start[nonempty])
        self.row_col_end = self.column_of(step_end[nonempty])   # exclusive
        self.row_tile = v.tile[self.row_var]
        self.row_bytes = v.bytes[self.row_var]
        self.var_row_offsets = np.zeros(nv + 1, np.int64)
        np.cumsum(np.bincount(self.row_var, minlength=nv), out=self.var_row_offsets[1:])

        # vertex code of a (tile, vertex type) is one size, whichever program brings it in
        vc = p.programs.vertex_code
        self.vertex_code_size = np.zeros((T, len(p.programs.vertex_types)), np.int64)
        np.maximum.at(self.vertex_code_size, (vc.tile, vc.vertex_type), vc.bytes)

        self._build_op_columns()
        self.var_stashed = self._stashed_variables()
        self._build_groups()

        # -- compute -----------------------------------------------------------------------------
        self.layer_compute, self.shared_compute = self._layer_compute()
        self.compute_prefix = np.concatenate([[0.0], np.cumsum(self.layer_compute)])

        # -- shared base (counted on every stage with shared="every") -----------------------------
        self._build_shared_base()

    # ------------------------------------------------------------------------------------------
    # Timeline columns
    def _build_columns(self) -> None:
        p = self.profile
        S = p.num_steps
        iv = p.liveness.intervals.values.reshape(-1, 2)
        ops = p.operations
        known = ops.first_step >= 0
        points = np.concatenate([[0, S], iv[:, 0], iv[:, 1], ops.first_step[known], ops.last_step[known] + 1])
        self.breaks = np.unique(np.clip(points, 0, S))
        if len(self.breaks) < 2:
            self.breaks = np.array([0, max(S, 0)], np.int64) if S > 0 else np.array([0], np.int64)
        self.num_columns = len(self.breaks) - 1

    def column_of(self, step: np.ndarray) -> np.ndarray:
        """Column holding ``step``; for a boundary step (an exclusive end) the column it starts."""
        return np.searchsorted(self.breaks, np.asarray(step), side="right") - 1

    def _build_op_columns(self) -> None:
        """Each operation's columns. An operation with known steps spans ``first_step..last_step``;
        one with unknown steps runs exactly at the steps where one of its not-always-live
        variables is live (the union of their intervals, not its hull), and at no step if it
        has none. ``op_col_start``/``op_col_end`` are the hull; ``op_rows`` the interval rows
        whose union an unknown-step operation runs on."""
        ops = self.profile.operations
        n = len(ops)
        c0 = np.zeros(n, np.int64)
        c1 = np.zeros(n, np.int64)
        known = ops.first_step >= 0
        c0[known] = self.column_of(ops.first_step[known])
        c1[known] = self.column_of(ops.last_step[known] + 1)
        L, G = self.num_layers, self.num_columns
        lay = self.layers.op_layer
        row = np.where(lay >= 0, lay, L)
        # cover[l, c]: some operation of layer l runs in column c (row L: operations with no layer)
        diff = np.zeros((L + 1, G + 1), np.int64)
        np.add.at(diff, (row[known], c0[known]), 1)
        np.add.at(diff, (row[known], c1[known]), -1)
        self.op_rows: dict[int, np.ndarray] = {}
        for i in np.flatnonzero(~known):
            vars_ = ops.vars[i]
            vars_ = vars_[self.var_nal[vars_]]
            counts = self.var_row_offsets[vars_ + 1] - self.var_row_offsets[vars_]
            rows = np.repeat(self.var_row_offsets[vars_], counts) + _ramp(counts)
            self.op_rows[int(i)] = rows
            if len(rows):
                c0[i], c1[i] = self.row_col_start[rows].min(), self.row_col_end[rows].max()
                np.add.at(diff[row[i]], self.row_col_start[rows], 1)
                np.add.at(diff[row[i]], self.row_col_end[rows], -1)
        self.op_col_start, self.op_col_end = c0, c1
        live = np.cumsum(diff, axis=1)[:, :G] > 0
        self.cover = live[:L]
        self.shared_cover = live[L]

    def op_columns(self, op: int) -> np.ndarray:
        """The columns operation ``op`` runs in (sorted)."""
        rows = self.op_rows.get(int(op))
        if rows is None:
            return np.arange(self.op_col_start[op], self.op_col_end[op])
        mask = np.zeros(self.num_columns + 1, np.int64)
        np.add.at(mask, self.row_col_start[rows], 1)
        np.add.at(mask, self.row_col_end[rows], -1)
        return np.flatnonzero(np.cumsum(mask)[:self.num_columns] > 0)

    def _live_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Maximal runs of consecutive live columns per not-always-live variable: (variable,
        first column, end column exclusive). Touching intervals merge, so a variable's runs do
        not depend on how its liveness was written."""
        var, c0, c1 = self.row_var, self.row_col_start, self.row_col_end
        if not len(var):
            return var, c0, c1
        # rows are sorted by variable and, within one, by start, and do not overlap (validated)
        new = np.ones(len(var), bool)
        new[1:] = (var[1:] != var[:-1]) | (c0[1:] != c1[:-1])
        starts = np.flatnonzero(new)
        ends = np.concatenate([starts[1:], [len(var)]]) - 1
        return var[starts], c0[starts], c1[ends]

    def _stashed_variables(self) -> np.ndarray:
        """The stash rule of docs/profile-format.md, per step: a not-always-live variable is
        stashed when, for a layer ``l`` that uses it, it stays live from a step where ``l`` runs,
        through a step where another layer runs and ``l`` does not, to a later step where ``l``
        runs. Columns are uniform in liveness and in which layers run, so the rule is evaluated
        on columns exactly."""
        L, G = self.num_layers, self.num_columns
        nv = len(self.profile.variables)
        stashed = np.zeros(nv, bool)
        run_var, run_c0, run_c1 = self._live_runs()
        if G == 0 or not len(run_var):
            return stashed
        layers_covering = self.cover.sum(axis=0)
        run_offsets = np.zeros(nv + 1, np.int64)
        np.cumsum(np.bincount(run_var, minlength=nv), out=run_offsets[1:])
        for l in range(L):
            own = self.cover[l]
            if not own.any():
                continue
            gap = (layers_covering - own > 0) & ~own       # another layer runs, l does not
            if not gap.any():
                continue
            own_prefix = np.concatenate([[0], np.cumsum(own)])
            gap_prefix = np.concatenate([[0], np.cumsum(gap)])
            own_cols = np.flatnonzero(own)
            vars_l = self.layer_vars.of(l)
            vars_l = vars_l[self.var_nal[vars_l] & ~stashed[vars_l]]
            if not len(vars_l):
                continue
            counts = run_offsets[vars_l + 1] - run_offsets[vars_l]
            runs = np.repeat(run_offsets[vars_l], counts) + _ramp(counts)
            c0, c1 = run_c0[runs], run_c1[runs]
            has_two = own_prefix[c1] - own_prefix[c0] >= 2
            first = own_cols[np.minimum(own_prefix[c0], len(own_cols) - 1)]
            last = own_cols[np.maximum(own_prefix[c1] - 1, 0)]
            hit = has_two & (gap_prefix[last] - gap_prefix[np.minimum(first + 1, last)] > 0)
            stashed[run_var[runs[hit]]] = True
        return stashed

    def _layer_set_groups(self, pair_item: np.ndarray, pair_layer: np.ndarray, n_items: int,
                          shared: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Group items by their exact set of layers: (group of each item or -1, layers of each group)."""
        L = self.num_layers
        words = max(1, (L + 63) // 64)
        masks = np.zeros((n_items, words), np.uint64)
        bits = np.left_shift(np.uint64(1), (pair_layer % 64).astype(np.uint64))
        np.bitwise_or.at(masks, (pair_item, pair_layer // 64), bits)
        layered = np.flatnonzero(~shared)
        _, first, inverse = np.unique(masks[layered], axis=0, return_index=True, return_inverse=True)
        group = np.full(n_items, -1, np.int64)
        group[layered] = inverse.reshape(-1)
        lo = np.searchsorted(pair_item, layered[first])
        hi = np.searchsorted(pair_item, layered[first], side="right")
        return group, [pair_layer[a:b] for a, b in zip(lo, hi)]

    def _build_groups(self) -> None:
        """Partition the layered variables (and programs) by their exact set of layers. A group
        enters a stage that starts at layer ``a`` at its first layer >= a, whatever the range's
        last layer, so its tiles x columns live matrix, always-live and stashed bytes (and its
        programs' per-tile code) are computed once."""
        T = self.num_tiles
        v = self.profile.variables
        nv = len(v)
        self.var_group, self.group_layers = self._layer_set_groups(self.var_pair_var, self.var_pair_layer, nv,
                                                                   self.var_shared)
        ngroups = len(self.group_layers)
        g = self.var_group
        al = v.always_live & (g >= 0)
        self.group_always = np.zeros((ngroups, T), np.int64)
        np.add.at(self.group_always, (g[al], v.tile[al]), v.bytes[al])
        st = self.var_stashed & (g >= 0)
        self.group_stash = np.zeros((ngroups, T), np.int64)
        np.add.at(self.group_stash, (g[st], v.tile[st]), v.bytes[st])
        # live matrices; int32 where no tile's not-always-live bytes could overflow it
        nal_per_tile = np.bincount(self.row_tile, weights=self.row_bytes.astype(float), minlength=T)
        self.live_dtype = np.int32 if nal_per_tile.max(initial=0) < 2**31 - 1 else np.int64
        row_group = g[self.row_var]
        order = np.argsort(row_group, kind="stable")
        bounds = np.searchsorted(row_group[order], np.arange(ngroups + 1))
        self.group_window: list[tuple[int, int]] = []
        self.group_live: list[np.ndarray | None] = []
        for k in range(ngroups):
            rows = order[bounds[k]:bounds[k + 1]]
            if not len(rows):
                self.group_window.append((0, 0))
                self.group_live.append(None)
                continue
            lo, hi = int(self.row_col_start[rows].min()), int(self.row_col_end[rows].max())
            self.group_window.append((lo, hi))
            self.group_live.append(self._live_matrix(rows, lo, hi).astype(self.live_dtype))
        # programs: additive code per tile, and which (tile, vertex type) code each group needs
        pr = self.profile.programs
        self.prog_group, self.prog_group_layers = self._layer_set_groups(
            self.prog_pair_prog, self.prog_pair_layer, len(pr), self.prog_shared)
        npg = len(self.prog_group_layers)
        ntypes = len(pr.vertex_types)
        self.prog_group_code = np.zeros((npg, T), np.int64)
        for costs in pr.categories().values():
            g = self.prog_group[costs.program]
            keep = g >= 0
            np.add.at(self.prog_group_code, (g[keep], costs.tile[keep]), costs.bytes[keep])
        vc = pr.vertex_code
        g = self.prog_group[vc.program]
        keep = g >= 0
        self.prog_group_types = np.zeros((npg, T, ntypes), bool)
        self.prog_group_types[g[keep], vc.tile[keep], vc.vertex_type[keep]] = True

    def _entries(self, first: int, groups: list[np.ndarray]) -> list[list[int]]:
        """For stages starting at layer ``first``: the groups each layer brings in."""
        entries: list[list[int]] = [[] for _ in range(self.num_layers)]
        for k, layers in enumerate(groups):
            i = np.searchsorted(layers, first)
            if i < len(layers):
                entries[int(layers[i])].append(k)
        return entries

    # ------------------------------------------------------------------------------------------
    # Compute
    def _layer_compute(self) -> tuple[np.ndarray, float]:
        """Compute per layer, and of operations with no layer. An operation's own ``compute``
        wins; otherwise (``compute_unit`` "cycles") it is its share of its programs' cycle
        estimates: a program run by ``n`` operations gives each ``cycles / n``. So every
        program's cycles are counted once in the profile's total, whichever operations or
        layers share it, and no layer's figure depends on the order of the operations."""
        p = self.profile
        ops = p.operations
        L = self.num_layers
        self.op_compute = _operation_compute(p)
        layer_of_op = self.layers.op_layer
        inside = layer_of_op >= 0
        per_layer = np.bincount(layer_of_op[inside], weights=self.op_compute[inside], minlength=L)[:L].astype(float)
        shared = float(self.op_compute[~inside].sum()) if len(ops) else 0.0
        return per_layer, shared

    def override_compute(self, per_layer: dict[str, float], source: str = "user") -> None:
        """Replace the compute of the named layers (e.g. measured times, or better estimates
        than an out-of-memory profile's); layers not named keep the profile's figures."""
        names = self.layers.names
        unknown = [name for name in per_layer if name not in names]
        if unknown:
            raise StagesplitError(f"{source}: no layer named '{unknown[0]}' (layers: {', '.join(names)})")
        for name, value in per_layer.items():
            self.layer_compute[names.index(name)] = float(value)
        self.compute_prefix = np.concatenate([[0.0], np.cumsum(self.layer_compute)])

    def range_compute(self, first: int, last: int) -> float:
        return float(self.compute_prefix[last + 1] - self.compute_prefix[first])

    # ------------------------------------------------------------------------------------------
    # Shared base
    def _base_items(self) -> tuple[np.ndarray, np.ndarray]:
        if self.shared == "every":
            return self.var_shared.copy(), self.prog_shared.copy()
        return np.zeros(len(self.var_shared), bool), np.zeros(len(self.prog_shared), bool)

    def _build_shared_base(self) -> None:
        T, G = self.num_tiles, self.num_columns
        base_vars, _ = self._base_items()
        self.base_stage_cols = self.shared_cover.copy() if self.shared == "every" else np.zeros(G, bool)
        rows = np.flatnonzero(base_vars[self.row_var])
        self.base_live = self._live_matrix(rows, 0, G)
        v = self.profile.variables
        al = base_vars & v.always_live
        self.base_always_live = np.bincount(v.tile[al], weights=v.bytes[al], minlength=T).astype(np.int64)
        st = base_vars & self.var_stashed
        self.base_stash = np.bincount(v.tile[st], weights=v.bytes[st], minlength=T).astype(np.int64)
        if G and self.base_stage_cols.any():
            self.base_peak = self.base_live[:, self.base_stage_cols].max(axis=1)
        else:
            self.base_peak = np.zeros(T, np.int64)

    def _live_matrix(self, rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Live bytes per (tile, column) in columns lo..hi-1 of the given interval rows."""
        T = self.num_tiles
        width = hi - lo
        if width <= 0:
            return np.zeros((T, 0), np.int64)
        if not len(rows):
            return np.zeros((T, width), np.int64)
        tile = self.row_tile[rows]
        b = self.row_bytes[rows].astype(float)
        start = np.clip(self.row_col_start[rows], lo, hi) - lo
        end = np.clip(self.row_col_end[rows], lo, hi) - lo
        idx = np.concatenate([tile * (width + 1) + start, tile * (width + 1) + end])
        diff = np.bincount(idx, weights=np.concatenate([b, -b]), minlength=T * (width + 1))
        live = np.cumsum(diff.reshape(T, width + 1)[:, :width], axis=1)
        return np.rint(live).astype(np.int64)

    def _program_entries(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """For each code category: entry indices sorted by program, and per-program offsets."""
        if not hasattr(self, "_entries_by_program"):
            pr = self.profile.programs
            out = {}
            for cat, costs in list(pr.categories().items()) + [("vertex_code", pr.vertex_code)]:
                order = np.argsort(costs.program, kind="stable")
                offsets = np.zeros(len(pr) + 1, np.int64)
                np.cumsum(np.bincount(costs.program, minlength=len(pr)), out=offsets[1:])
                out[cat] = (order, offsets)
            self._entries_by_program = out
        return self._entries_by_program

    def _program_costs(self, progs: np.ndarray, vt_present: np.ndarray) -> dict[str, np.ndarray]:
        """Per-tile code of ``progs``; vertex code only for (tile, type) not yet in ``vt_present``
        (which is updated)."""
        T = self.num_tiles
        pr = self.profile.programs
        progs = np.asarray(progs, np.int64)
        out = {}

        def entries(cat: str) -> np.ndarray:
            order, offsets = self._program_entries()[cat]
            counts = offsets[progs + 1] - offsets[progs]
            return order[np.repeat(offsets[progs], counts) + _ramp(counts)]

        for cat, costs in pr.categories().items():
            e = entries(cat)
            out[cat] = np.bincount(costs.tile[e], weights=costs.bytes[e], minlength=T).astype(np.int64)
        vc = pr.vertex_code
        e = entries("vertex_code")
        tiles, types = vc.tile[e], vc.vertex_type[e]
        nbytes = self.vertex_code_size[tiles, types]
        fresh = ~vt_present[tiles, types]
        code = np.zeros(T, np.int64)
        if fresh.any():
            ntypes = vt_present.shape[1]
            key, first = np.unique(tiles[fresh] * ntypes + types[fresh], return_index=True)
            code = np.bincount(key // ntypes, weights=nbytes[fresh][first], minlength=T).astype(np.int64)
            vt_present[key // ntypes, key % ntypes] = True
        out["vertex_code"] = code
        return out

    # ------------------------------------------------------------------------------------------
    # One stage from scratch, with full per-tile detail
    def stage_items(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Boolean masks of the stage's variables, programs and program-step columns."""
        vars_, progs = self._base_items()
        in_range = (self.var_pair_layer >= first) & (self.var_pair_layer <= last)
        vars_[self.var_pair_var[in_range]] = True
        in_range = (self.prog_pair_layer >= first) & (self.prog_pair_layer <= last)
        progs[self.prog_pair_prog[in_range]] = True
        cols = self.base_stage_cols | self.cover[first:last + 1].any(axis=0) if self.num_columns else \
            np.zeros(0, bool)
        return vars_, progs, cols

    def stage_memory(self, first: int, last: int) -> StageMemory:
        """Per-tile memory of the stage holding layers ``first..last`` (computed from scratch,
        once per range: plans, plots, sweeps and breakdowns ask for the same ranges again)."""
        if not 0 <= first <= last < self.num_layers:
            raise IndexError(f"layer range {first}..{last} outside 0..{self.num_layers - 1}")
        key = (int(first), int(last))
        if key not in self._stage_memory:
            memory = self._memory_of(*self.stage_items(first, last), first, last)
            for f in fields(memory):
                value = getattr(memory, f.name)
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False          # shared between callers
            self._stage_memory[key] = memory
        return self._stage_memory[key]

    def shared_memory(self) -> StageMemory:
        """Memory of the shared items alone (what every stage carries with shared="every")."""
        vars_, progs = self._base_items()
        return self._memory_of(vars_, progs, self.base_stage_cols.copy(), -1, -1)

    def _memory_of(self, vars_: np.ndarray, progs: np.ndarray, cols: np.ndarray, first: int, last: int) -> StageMemory:
        T, G = self.num_tiles, self.num_columns
        v = self.profile.variables
        live = self._live_matrix(np.flatnonzero(vars_[self.row_var]), 0, G)
        if G and cols.any():
            masked = np.where(cols[None, :], live, -1)
            col = masked.argmax(axis=1)
            nal = np.maximum(masked[np.arange(T), col], 0)
            peak_step = np.where(nal > 0, self.breaks[col], -1)
        else:
            nal = np.zeros(T, np.int64)
            peak_step = np.full(T, -1, np.int64)
        al = vars_ & v.always_live
        st = vars_ & self.var_stashed
        code = self._program_costs(np.flatnonzero(progs), np.zeros((T, len(self.profile.programs.vertex_types)), bool))
        return StageMemory(
            first=first, last=last,
            always_live=np.bincount(v.tile[al], weights=v.bytes[al], minlength=T).astype(np.int64),
            not_always_live=nal.astype(np.int64), peak_step=peak_step.astype(np.int64),
            vertex_code=code["vertex_code"], vertex_state=code["vertex_state"],
            exchange_code=code["exchange_code"], control_code=code["control_code"],
            stash=np.bincount(v.tile[st], weights=v.bytes[st], minlength=T).astype(np.int64))

    def operation_costs(self) -> "OperationCosts":
        """Each operation on its own, summed over tiles (PopLiner's per-operation view): its
        variables' per-tile peak over its own steps, and its programs' code."""
        ops = self.profile.operations
        v = self.profile.variables
        n = len(ops)
        out = {k: np.zeros(n, np.int64) for k in ("always_live", "not_always_live", "vertex_code", "vertex_state",
                                                   "exchange_code", "control_code")}
        T = self.num_tiles
        ntypes = len(self.profile.programs.vertex_types)
        for i in range(n):
            vars_ = ops.vars[i]
            out["always_live"][i] = v.bytes[vars_[v.always_live[vars_]]].sum()
            c0, c1 = int(self.op_col_start[i]), int(self.op_col_end[i])
            nal = vars_[self.var_nal[vars_]]
            if c1 > c0 and len(nal):
                counts = self.var_row_offsets[nal + 1] - self.var_row_offsets[nal]
                rows = np.repeat(self.var_row_offsets[nal], counts) + _ramp(counts)
                live = self._live_matrix(rows, c0, c1)
                if i in self.op_rows:                  # unknown steps: only where its data is live
                    live = live[:, self.op_columns(i) - c0]
                out["not_always_live"][i] = live.max(axis=1).sum()
            progs = np.unique(ops.programs[i])
            code = self._program_costs(progs, np.zeros((T, ntypes), bool))
            for k in ("vertex_code", "vertex_state", "exchange_code", "control_code"):
                out[k][i] = code[k].sum()
        return OperationCosts(compute=self.op_compute.copy(), **out)

    def live_bytes_by_step(self, first: int, last: int, tile: int) -> tuple[np.ndarray, np.ndarray]:
        """Not-always-live bytes of the stage's variables on ``tile`` at every step, and whether
        each step is one of the stage's steps."""
        S = self.profile.num_steps
        vars_, _, cols = self.stage_items(first, last)
        rows = np.flatnonzero(vars_[self.row_var] & (self.row_tile == tile))
        per_col = np.zeros(self.num_columns + 1, np.int64)
        np.add.at(per_col, self.row_col_start[rows], self.row_bytes[rows])
        np.add.at(per_col, self.row_col_end[rows], -self.row_bytes[rows])
        per_col = np.cumsum(per_col)[:self.num_columns]
        widths = np.diff(self.breaks)
        by_step = np.repeat(per_col, widths) if S else np.zeros(0, np.int64)
        in_stage = np.repeat(cols, widths) if S else np.zeros(0, bool)
        return by_step, in_stage

    # ------------------------------------------------------------------------------------------
    # Every range, incrementally
    def price_ranges(self, in_flight: Sequence[int] = (1,),
                     progress: Callable[[int, int], None] | None = None) -> RangeTable:
        """Worst-tile bytes (for each in-flight count) and compute of every range a..b."""
        L, T, G = self.num_layers, self.num_tiles, self.num_columns
        ks = tuple(sorted(set(int(k) for k in in_flight)))
        worst = np.zeros((len(ks), L, L), np.int64)
        worst_tile = np.zeros((len(ks), L, L), np.int64)
        compute = np.zeros((L, L))
        pr = self.profile.programs
        k_minus_one = np.array(ks, np.int64)[:, None] - 1
        _, base_progs = self._base_items()
        total_ranges = L * (L + 1) // 2
        done = 0
        # layer-local data reused for every first layer
        layer_cols = [np.flatnonzero(self.cover[l]) for l in range(L)]
        base_types = np.zeros((T, len(pr.vertex_types)), bool)
        base_code = self._program_costs(np.flatnonzero(base_progs), base_types)
        base_code_total = sum(base_code.values())
        for a in range(L):
            entries = self._entries(a, self.group_layers)
            prog_entries = self._entries(a, self.prog_group_layers)
            vt_present = base_types.copy()
            code_total = base_code_total.copy()
            acc = self.base_live.astype(self.live_dtype)
            stage_cols = self.base_stage_cols.copy()
            peak = self.base_peak.copy()
            always = self.base_always_live.copy()
            stash = self.base_stash.copy()
            for b in range(a, L):
                # variables layer b brings in, group by group
                groups = entries[b]
                lo, hi = G, 0
                for g in groups:
                    live = self.group_live[g]
                    if live is not None:
                        g_lo, g_hi = self.group_window[g]
                        acc[:, g_lo:g_hi] += live
                        lo, hi = min(lo, g_lo), max(hi, g_hi)
                if groups:
                    always += self.group_always[groups].sum(axis=0)
                    stash += self.group_stash[groups].sum(axis=0)
                # steps layer b adds to the stage; the peak can only change where bytes were
                # added or steps were added
                added = layer_cols[b][~stage_cols[layer_cols[b]]]
                stage_cols[added] = True
                if hi > lo:
                    window = stage_cols[lo:hi]
                    if window.all():
                        peak = np.maximum(peak, acc[:, lo:hi].max(axis=1))
                    elif window.any():
                        peak = np.maximum(peak, acc[:, lo:hi][:, window].max(axis=1))
                outside = added[(added < lo) | (added >= hi)] if hi > lo else added
                if len(outside):
                    peak = np.maximum(peak, acc[:, outside].max(axis=1))
                # programs layer b brings in: additive code, and vertex code not yet on a tile
                for g in prog_entries[b]:
                    code_total += self.prog_group_code[g]
                    fresh = self.prog_group_types[g] & ~vt_present
                    if fresh.any():
                        code_total += (fresh * self.vertex_code_size).sum(axis=1)
                        vt_present |= fresh
                total = peak + always + code_total
                with_stash = total[None, :] + k_minus_one * stash[None, :]
                worst_tile[:, a, b] = with_stash.argmax(axis=1)
                worst[:, a, b] = with_stash[np.arange(len(ks)), worst_tile[:, a, b]]
                compute[a, b] = self.compute_prefix[b + 1] - self.compute_prefix[a]
                done += 1
                if progress is not None:
                    progress(done, total_ranges)
        return RangeTable(in_flight=ks, worst_bytes=worst, worst_tile=worst_tile,
                          compute=compute)


def _operation_compute(p: Profile) -> np.ndarray:
    """Each operation's compute: its own ``compute``, or else (unit "cycles") the sum over its
    distinct programs of ``cycles / (operations running that program)``; 0 otherwise."""
    ops = p.operations
    n = len(ops)
    compute = np.array(ops.compute, float, copy=True)
    derive = np.isnan(compute)
    compute[derive] = 0.0
    if p.compute_unit == "cycles" and len(p.programs) and len(ops.programs.values):
        nprog = len(p.programs)
        cycles = np.nan_to_num(np.asarray(p.programs.cycles, float), nan=0.0)
        key = _sorted_unique(ops.programs.row_ids().astype(np.int64) * nprog + ops.programs.values)
        op, prog = key // nprog, key % nprog
        users = np.bincount(prog, minlength=nprog)
        take = derive[op]
        compute += np.bincount(op[take], weights=cycles[prog[take]] / users[prog[take]], minlength=n)[:n]
    return compute


def _ramp(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each count c, concatenated: the offsets within each CSR row."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.arange(total) - np.repeat(starts, counts)
