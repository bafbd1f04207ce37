"""The stage cost model: what a contiguous range of layers needs on one device.

It wires the parts together and holds no algorithm of its own:

* ``timeline``: program steps compressed into columns, live intervals, which layers run where;
* ``itemgroups``: which layers use each variable and program, items grouped by layer set;
* ``stash``: which variables a pipeline schedule stashes per micro-batch in flight;
* ``stagememory``: one range priced from scratch, with per-tile detail (``stage_memory``);
* ``pricing``: every range priced in one sweep over tiles (``price_ranges``); for one-tile
  profiles ``onetile`` prices the band only, and for per-layer profiles ``layercosts`` gives
  closed-form costs; each kept as a ``RangeTable`` of the band of ranges that can fit a device;
* compute per layer (below), fixed at construction; ``with_compute`` gives a new model.

Items with no layer ("shared": used only by operations without a layer, or by no operation at
all) are counted on *every* stage with ``shared="every"`` (the default: global buffers,
constants and control state exist on every device, and an under-estimate means a plan that
does not fit), or on none with ``shared="none"`` (PopLiner's assumption that they spread out).
An operation's compute is its own figure or its equal share of its programs' cycles (see
docs/profile-format.md, "How a stage is priced from the full form").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from ..common.chunks import CHUNK
from ..common.layerfigures import PHASES, LayerFigure, figure_phases, figure_total
from ..common.text import show
from ..errors import LayerRangeError, OptionError, StagesplitError
from ..io.layerform import layer_form
from ..io.profile import Phase, Profile, Target, VertexCode
from ..layers import LayerAssignment
from .figurephases import FIGURE_PHASE_GROUPS
from .itemgroups import ItemGroups, sorted_unique
from .layercosts import LayerCosts, price_layer_ranges
from .rangetable import RangeTable
from .roofline import Roofline, apply_roofline
from .stagememory import CATEGORIES, MemoryBreakdown, StageMemory, freeze, price_stage, stage_items
from .stash import stashed_variables
from .tied import tied_parameters
from .timeline import Timeline, phase_columns

if TYPE_CHECKING:
    from .phases import PhaseTable

SHARED_POLICIES = ("every", "none")

__all__ = ["CATEGORIES", "SHARED_POLICIES", "MemoryBreakdown", "RangeTable", "StageCostModel", "StageMemory"]


class StageCostModel:
    """Prices stages (contiguous layer ranges) of one profile under one layer assignment.

    ``compute`` replaces the compute of the named layers (e.g. measured times, or better
    estimates than an out-of-memory profile's); layers not named keep the profile's figures.
    """

    def __init__(self, profile: Profile, layers: LayerAssignment, shared: str = "every",
                 compute: Mapping[str, float] | None = None, compute_source: str = "compute",
                 kept_unsharded: np.ndarray | None = None):
        if shared not in SHARED_POLICIES:
            raise OptionError("shared", f"expected one of {', '.join(SHARED_POLICIES)}, got {shared!r}")
        self.profile = profile
        self.layers = layers
        self.shared = shared
        #: (L,) bytes FSDP2 leaves unsharded after each backward of a layer under a pipeline schedule
        #: (model/datasharding.py's ``kept_unsharded``; None: none)
        self.kept_unsharded = kept_unsharded
        self._stage_memory: dict[tuple[int, int], StageMemory] = {}
        L = layers.num_layers
        self.num_layers = L
        self.num_tiles = profile.target.tiles
        ops, v, pr = profile.operations, profile.variables, profile.programs

        self.var_items = ItemGroups.of(ops.vars.offsets, ops.vars.values, layers.op_layer, len(v), L)
        self.prog_items = ItemGroups.of(ops.programs.offsets, ops.programs.values, layers.op_layer, len(pr), L)
        self.var_nal = ~v.always_live & (v.live_class >= 0)
        self.timeline = Timeline(profile, layers, self.var_nal)
        self.layer_vars = self.var_items.layer_items(L)
        #: which operations run in which phase's columns (None: the profile does not say)
        self.phase_cols = phase_columns(self.timeline, ops.phase) if np.any(ops.phase != Phase.UNKNOWN) else None
        forward = backward = None
        if self.phase_cols is not None:
            forward = self.phase_cols[Phase.FORWARD]
            backward = (self.phase_cols[Phase.BACKWARD_INPUT] | self.phase_cols[Phase.BACKWARD_WEIGHT]
                        | self.phase_cols[Phase.RECOMPUTE])
        self.var_stashed = stashed_variables(self.timeline, self.layer_vars, self.var_nal, forward, backward)

        # vertex code of a (tile, vertex type) is one size, whichever program brings it in
        vc = pr.vertex_code
        self.vertex_code_size = _vertex_code_sizes(vc, self.num_tiles, len(pr.vertex_types))
        self.base_stage_cols = self.timeline.shared_cover.copy() if shared == "every" else \
            np.zeros(self.timeline.num_columns, bool)

        self.op_compute = _operation_compute(profile)
        inside = layers.op_layer >= 0
        self.layer_compute = np.bincount(layers.op_layer[inside], weights=self.op_compute[inside],
                                         minlength=L)[:L].astype(float)
        self.shared_compute = float(self.op_compute[~inside].sum()) if len(ops) else 0.0
        #: (L, 3) each layer's forward, backward and optimizer share of a figure given by phase
        #: (common/layerfigures.py); NaN rows: the roofline shares the layer's compute out
        self.layer_phase_share = np.full((L, 3), np.nan)
        if compute:
            self._set_compute(compute, compute_source)
        self.compute_prefix = np.concatenate([[0.0], np.cumsum(self.layer_compute)])
        #: seconds per layer on a chosen target (``on``); None: from compute
        self.layer_time_s: np.ndarray | None = None
        #: roofline times on the target of ``on`` (None: not timed on a target)
        self.roofline: Roofline | None = None
        #: parameters several layers use (tied embeddings), with those layers
        self.tied = tied_parameters(profile, layers.op_layer)

    # -- names the rest of the package reads (each part owns its data) ---------------------------
    @property
    def num_columns(self) -> int:
        return self.timeline.num_columns

    # -- compute ---------------------------------------------------------------------------------
    def _set_compute(self, per_layer: Mapping[str, LayerFigure], source: str) -> None:
        names = self.layers.names
        unknown = [name for name in per_layer if name not in names]
        if unknown:
            raise StagesplitError(f"{source}: no layer named '{unknown[0]}' (layers: {', '.join(names)})")
        for name, value in per_layer.items():
            index = names.index(name)
            self.layer_compute[index] = figure_total(value)
            parts = figure_phases(value)
            if parts is None:
                self.layer_phase_share[index] = np.nan
                continue
            self._check_phases(name, index, parts, source)
            total = sum(parts)
            self.layer_phase_share[index] = np.divide(parts, total) if total > 0 else np.nan

    def _check_phases(self, name: str, index: int, parts: tuple[float, float, float], source: str) -> None:
        """A figure given by phase must land on operations: the profile must say each operation's
        phase, and the layer must have operations of every phase given a part above 0."""
        if self.phase_cols is None:
            raise StagesplitError(f"{source}: layer '{show(name)}' is given by phase, but the profile does not say "
                                  "which phase each operation belongs to: give the layer's total")
        ops = self.profile.operations
        of_layer = np.asarray(self.layers.op_layer) == index
        for phase, part, phases in zip(PHASES, parts, FIGURE_PHASE_GROUPS):
            if part > 0 and not (of_layer & np.isin(ops.phase, phases)).any():
                raise StagesplitError(f"{source}: layer '{show(name)}' is given {part:g} of {phase}, but it has no "
                                      f"{phase} operations" + (" (it holds no parameters)" if phase == "optimizer"
                                                               else ""))

    def with_compute(self, per_layer: Mapping[str, LayerFigure], source: str = "compute") -> StageCostModel:
        """A model whose named layers have the given compute (the rest keep theirs); memory
        pricing is shared with this model, which is left unchanged."""
        other = self._copy()
        other.layer_compute = self.layer_compute.copy()
        other.layer_phase_share = self.layer_phase_share.copy()
        other._set_compute(per_layer, source)
        other.compute_prefix = np.concatenate([[0.0], np.cumsum(other.layer_compute)])
        return other

    def on(self, target: Target | None = None, efficiency: float = 1.0) -> StageCostModel:
        """This model with its compute timed on ``target`` (default: the profile's device) at
        ``efficiency`` of its peak FLOP/s (model/roofline.py): a new model, this one unchanged;
        memory pricing is shared with it (it does not depend on the target). The same target and
        efficiency give the same model again (kept on this one): solves of one rank under several
        schedules read one phase table, and the figures its memo keeps for each schedule."""
        key = (repr(target), float(efficiency))
        timed: dict[tuple[str, float], StageCostModel] = self.__dict__.setdefault("_timed", {})
        if key not in timed:
            other = self._copy()
            apply_roofline(other, target, efficiency)
            timed[key] = other
        return timed[key]

    def _copy(self) -> StageCostModel:
        """A shallow copy without what follows compute (the phase table's times, the models timed
        from it): the new model makes its own when asked."""
        other = copy.copy(self)
        other.__dict__.pop("phase_table", None)
        other.__dict__.pop("_timed", None)
        return other

    @cached_property
    def phase_table(self) -> PhaseTable:
        """Every range's figures in each phase of the step (model/phases.py), made on first use
        and kept: its times follow the target the model is timed on (``on``), so a model timed on
        another target is another model with its own table."""
        from .phases import phase_table
        return phase_table(self)

    def range_compute(self, first: int, last: int) -> float:
        """Compute of the stage holding layers first..last."""
        return float(self.compute_prefix[last + 1] - self.compute_prefix[first])

    # -- memory ----------------------------------------------------------------------------------
    def base_items(self) -> tuple[np.ndarray, np.ndarray]:
        """Masks of the variables and programs every stage holds (the shared ones, or none)."""
        if self.shared == "every":
            return self.var_items.shared.copy(), self.prog_items.shared.copy()
        return np.zeros(len(self.var_items.shared), bool), np.zeros(len(self.prog_items.shared), bool)

    def stage_items(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Boolean masks of the stage's variables, programs and program-step columns."""
        return stage_items(self, first, last)

    def stage_memory(self, first: int, last: int) -> StageMemory:
        """Per-tile memory of the stage holding layers ``first..last`` (computed from scratch,
        once per range: plans, plots, sweeps and breakdowns ask for the same ranges again)."""
        if not 0 <= first <= last < self.num_layers:
            raise LayerRangeError(f"layer range {first}..{last} is outside 0..{self.num_layers - 1}")
        key = (int(first), int(last))
        if key not in self._stage_memory:
            self._stage_memory[key] = freeze(price_stage(self, *stage_items(self, first, last), first, last))
        return self._stage_memory[key]

    def shared_memory(self) -> StageMemory:
        """Memory of the shared items alone (what every stage carries with shared="every")."""
        vars_, progs = self.base_items()
        return price_stage(self, vars_, progs, self.base_stage_cols.copy(), -1, -1)

    def price_ranges(self, in_flight: Sequence[int] = (1,), progress: Callable[[int, int], None] | None = None,
                     capacity: int | None = None) -> RangeTable:
        """Worst-tile bytes, for each in-flight count, of every range a..b that can fit a device
        of ``capacity`` bytes per tile (every range for None): closed-form for a per-layer
        profile (``layercosts``), the band on one tile (``onetile``), else the per-tile sweep
        (``pricing``)."""
        ks = tuple(sorted({int(k) for k in in_flight}))
        costs = self.layer_costs()
        if costs is not None:
            return price_layer_ranges(costs, ks, capacity, self.compute_prefix)
        if self.num_tiles != 1:
            from .pricing import price_all_ranges  # (the sweeps: not a per-layer profile's import)
            return price_all_ranges(self, ks, progress, capacity=capacity)
        from .onetile import price_one_tile_ranges
        return price_one_tile_ranges(self, ks, capacity)

    def layer_costs(self) -> LayerCosts | None:
        """The closed-form costs when the profile is a per-layer profile (``io/layerform.py``)
        grouped into its own layers, else None."""
        if "_layer_costs" not in self.__dict__:
            costs = None
            form = layer_form(self.profile) if self.num_tiles == 1 else None
            if form is not None and list(self.layers.names) == [layer.name for layer in form.layers]:
                n = len(form.layers)
                own = np.concatenate([np.arange(n), np.arange(n)[::-1]]) if form.training else np.arange(n)
                if np.array_equal(self.layers.op_layer, own):
                    costs = LayerCosts.of(form, self.shared == "every")
            self.__dict__["_layer_costs"] = costs
        kept: LayerCosts | None = self.__dict__["_layer_costs"]
        return kept


def _vertex_code_sizes(vc: VertexCode, num_tiles: int, num_types: int, chunk: int = CHUNK) -> np.ndarray:
    """The code size of each (tile, vertex type): the largest any program reports (0 where
    none), as a (tiles, types) array. In chunks, so that tens of millions of entries make no
    large temporaries; in each, a plain assignment first (every program on a tile usually
    reports the same size), then ``np.maximum.at``, which is slow, only on what is left larger."""
    out = np.zeros(num_tiles * num_types, np.int64)
    for start in range(0, len(vc), chunk):
        part = slice(start, start + chunk)
        key = vc.tile[part].astype(np.int64)
        key *= num_types
        key += vc.vertex_type[part]
        values = vc.bytes[part]
        larger = values > out[key]
        if larger.any():
            key, values = key[larger], values[larger]
            out[key] = values
            larger = values > out[key]
            if larger.any():
                np.maximum.at(out, key[larger], values[larger])
    return out.reshape(num_tiles, num_types)


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
        key = sorted_unique(ops.programs.row_ids().astype(np.int64) * nprog + ops.programs.values)
        op, prog = key // nprog, key % nprog
        users = np.bincount(prog, minlength=nprog)
        take = derive[op]
        compute += np.bincount(op[take], weights=cycles[prog[take]] / users[prog[take]], minlength=n)[:n]
    return compute
