"""``stagesplit diagnose``: where a stage's memory goes at its bottleneck.

For the whole profile, a layer range, or each stage of a plan: the bottleneck tile and program
step, that tile's memory by category, the largest variables live there (with the operations
and layers that use them), the not-always-live bytes on the steps around the peak, and, when
the profile carries its own ground truth, modelled against measured bytes with the unexplained
remainder and the largest variables the model cannot attribute. Plus the health of the layer
grouping, which is where most wrong answers start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..common.text import one_line, show
from ..model.costmodel import StageCostModel, StageMemory
from ..model.stagememory import MemoryBreakdown
from .table import Column, Table
from .units import GIB

__all__ = ["Diagnosis", "GROUND_TRUTH_CATEGORIES", "GroundTruthCheck", "GroupingHealth", "LiveVariable",
           "StageDiagnosis", "diagnose", "diagnose_stage", "diagnosis_tables", "grouping_health",
           "live_bytes_by_step", "live_variables", "operation_at", "operation_text"]

# profile ground-truth category -> the model's category it corresponds to (None: not modelled)
GROUND_TRUTH_CATEGORIES = {"vertex_code": "vertex_code", "vertex_instance_state": "vertex_state",
                           "internal_exchange_code": "exchange_code", "control_code": "control_code",
                           "vector_list_descriptor": None, "global_exchange_code": None,
                           "host_exchange_code": None, "constant": None,
                           "other": None}        # in the profile's own tile total, in no category


@dataclass
class LiveVariable:
    """A variable (all its lowered pieces of one name on the tile, ``pieces`` of them)."""

    index: int
    name: str
    bytes: int
    always_live: bool
    operations: list[str]
    layers: list[str]
    pieces: int = 1


@dataclass
class GroundTruthCheck:
    rows: list[tuple[str, int, int]]          # (category, modelled, ground truth)
    modelled: int
    measured: int
    unattributed: list[LiveVariable]           # live on the tile, used by no layer's operation

    @property
    def unexplained(self) -> int:
        return self.measured - self.modelled


@dataclass
class StageDiagnosis:
    first: int
    last: int
    layers: list[str]
    in_flight: int
    capacity: int
    tile: int
    step: int
    step_name: str
    memory: MemoryBreakdown
    top_variables: list[LiveVariable]
    around: list[tuple[int, str, int, bool]]   # (step, name, not-always-live bytes, a step of this stage)
    ground_truth: GroundTruthCheck | None = None
    #: the operation running at the peak step (its name from the profile; "" if none covers it)
    operation: str = ""

    @property
    def total(self) -> int:
        return self.memory.total


@dataclass
class GroupingHealth:
    share: float
    layers: int
    without_layer: list[str]
    calls_with_several_input_layers: list[str]
    warnings: list[str] = field(default_factory=list)


@dataclass
class Diagnosis:
    stages: list[StageDiagnosis]
    grouping: GroupingHealth
    #: the cost model diagnosed (for plots of a stage's liveness); not part of the result's values
    model: StageCostModel | None = field(default=None, repr=False, compare=False)


class _Lookup:
    """Which operations and layers use each variable."""

    def __init__(self, model: StageCostModel):
        ops = model.profile.operations
        self.model = model
        self.op_of_value = ops.vars.row_ids()
        self.values = ops.vars.values

    def describe_grouped(self, variables: np.ndarray, top: int) -> list[LiveVariable]:
        """The ``top`` largest variables, lowered pieces of the same name on the tile summed."""
        p = self.model.profile
        if not len(variables):
            return []
        names = p.variables.name[variables]
        key = np.where(names >= 0, names, -1 - variables)          # unnamed pieces stay apart
        uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        totals = np.bincount(inverse.reshape(-1), weights=p.variables.bytes[variables]).astype(np.int64)
        counts = np.bincount(inverse.reshape(-1))
        order = np.lexsort((first, -totals))[:top]
        out = []
        for g in order:
            x = self.describe(int(variables[first[g]]))
            x.bytes, x.pieces = int(totals[g]), int(counts[g])
            out.append(x)
        return out

    def describe(self, v: int) -> LiveVariable:
        m = self.model
        p = m.profile
        ops = np.unique(self.op_of_value[self.values == v])
        layers = sorted({int(m.layers.op_layer[o]) for o in ops if m.layers.op_layer[o] >= 0})
        names = [p.operations.name[o] or f"op#{o}" for o in ops[:3]]
        if len(ops) > 3:
            names.append(f"(+{len(ops) - 3} more)")
        return LiveVariable(index=int(v), name=p.variable_name(v), bytes=int(p.variables.bytes[v]),
                            always_live=bool(p.variables.always_live[v]), operations=names,
                            layers=[m.layers.names[l] for l in layers])


def operation_at(model: StageCostModel, step: int) -> str:
    """The name of the (first) operation whose steps include ``step``; "" if none does."""
    ops = model.profile.operations
    if step < 0 or not len(ops):
        return ""
    hits = np.flatnonzero((ops.first_step <= step) & (step <= ops.last_step))
    return (ops.name[int(hits[0])] or f"op#{int(hits[0])}") if len(hits) else ""


def operation_text(name: str) -> str:
    """A captured operation's name (``module/phase/aten.op``) as a reader says it:
    ``aten.mm in transformer.h.1.mlp.c_proj (backward)``; other names as they are."""
    parts = name.split("/")
    if len(parts) < 2 or not parts[-1].startswith(("aten.", "prims.")):
        return show(name)
    phase = f" ({', '.join(parts[1:-1])})" if len(parts) > 2 else ""
    return show(f"{parts[-1]} in {parts[0]}{phase}")


def live_variables(model: StageCostModel, vars_mask: np.ndarray, tile: int, step: int) -> np.ndarray:
    """Indices of the variables in ``vars_mask`` that occupy ``tile`` at ``step``, largest first."""
    v = model.profile.variables
    on_tile = vars_mask & (v.tile == tile)
    always = np.flatnonzero(on_tile & v.always_live)
    live = np.zeros(0, np.int64)
    if step >= 0 and model.num_columns:
        tl = model.timeline
        col = int(tl.column_of(step))
        rows = np.flatnonzero((tl.row_tile == tile) & (tl.row_col_start <= col) & (col < tl.row_col_end))
        live = np.unique(tl.row_var[rows])
        live = live[on_tile[live]]
    chosen = np.concatenate([always, live])
    return chosen[np.argsort(-v.bytes[chosen], kind="stable")]


def live_bytes_by_step(model: StageCostModel, first: int, last: int, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """Not-always-live bytes of the stage's variables on ``tile`` at every step, and whether
    each step is one of the stage's steps."""
    S = model.profile.num_steps
    vars_, _, cols = model.stage_items(first, last)
    rows = np.flatnonzero(vars_[model.timeline.row_var] & (model.timeline.row_tile == tile))
    per_col = np.zeros(model.num_columns + 1, np.int64)
    np.add.at(per_col, model.timeline.row_col_start[rows], model.timeline.row_bytes[rows])
    np.add.at(per_col, model.timeline.row_col_end[rows], -model.timeline.row_bytes[rows])
    per_col = np.cumsum(per_col)[:model.num_columns]
    widths = np.diff(model.timeline.breaks)
    by_step = np.repeat(per_col, widths) if S else np.zeros(0, np.int64)
    in_stage = np.repeat(cols, widths) if S else np.zeros(0, bool)
    return by_step, in_stage


def diagnose_stage(model: StageCostModel, first: int, last: int, in_flight: int = 1, capacity: int | None = None,
                   top: int = 10, window: int = 5, lookup: _Lookup | None = None,
                   ground_truth: bool = False) -> StageDiagnosis:
    p = model.profile
    lookup = lookup or _Lookup(model)
    sm: StageMemory = model.stage_memory(first, last)
    total = sm.total(in_flight)
    tile = int(total.argmax())
    step = int(sm.peak_step[tile])
    memory = sm.at_tile(tile, in_flight)
    vars_mask, _, _ = model.stage_items(first, last)
    chosen = live_variables(model, vars_mask, tile, step)
    by_step, in_stage = live_bytes_by_step(model, first, last, tile)
    around = []
    if step >= 0:
        for s in range(max(0, step - window), min(p.num_steps, step + window + 1)):
            around.append((s, p.steps[s], int(by_step[s]), bool(in_stage[s])))
        if p.target.tiles == 1:             # a captured step: name each step by its operation
            around = [(s, operation_text(operation_at(model, s)) or name, b, inside) for s, name, b, inside in around]
    d = StageDiagnosis(first=first, last=last, layers=model.layers.names[first:last + 1], in_flight=in_flight,
                       capacity=int(capacity if capacity is not None else p.target.bytes_per_tile), tile=tile, step=step,
                       step_name=p.steps[step] if step >= 0 else "-", memory=memory,
                       top_variables=lookup.describe_grouped(chosen, top), around=around,
                       operation=operation_at(model, step))
    if ground_truth and p.ground_truth is not None:
        d.ground_truth = _ground_truth_check(model, sm, tile, step, lookup, top)
    return d


def _ground_truth_check(model: StageCostModel, sm: StageMemory, tile: int, step: int, lookup: _Lookup,
                        top: int) -> GroundTruthCheck:
    gt = model.profile.ground_truth
    assert gt is not None                     # the caller checked
    rows = [("always-live variables", int(sm.always_live[tile]), int(gt.always_live[tile])),
            ("not-always-live variables (peak)", int(sm.not_always_live[tile]), int(gt.not_always_live[tile]))]
    for name, values in gt.categories.items():
        ours = GROUND_TRUTH_CATEGORIES.get(name)
        rows.append((name.replace("_", " ") + ("" if ours else " (not modelled)"),
                     int(sm.category(ours)[tile]) if ours else 0, int(values[tile])))
    modelled = int(sm.total()[tile])
    measured = int(gt.tile_total()[tile])
    # variables live on the tile that no layer's operation uses: counted only with --shared every
    unlayered = model.var_items.shared
    missed = live_variables(model, unlayered, tile, step)
    return GroundTruthCheck(rows=rows, modelled=modelled, measured=measured,
                            unattributed=lookup.describe_grouped(missed, top))


def grouping_health(model: StageCostModel, limit: int = 10) -> GroupingHealth:
    la = model.layers
    ops = model.profile.operations
    without = [ops.name[i] or f"op#{i}" for i in np.flatnonzero(la.op_layer < 0)]
    calls = [ops.name[i] for i in la.calls_with_multiple_input_layers(model.profile)]
    return GroupingHealth(share=la.share_assigned, layers=la.num_layers, without_layer=without[:limit] +
                          ([f"(+{len(without) - limit} more)"] if len(without) > limit else []),
                          calls_with_several_input_layers=calls[:limit], warnings=list(la.warnings))


def diagnose(model: StageCostModel, stages: list[tuple[int, int, int, int | None]] | None = None, top: int = 10,
             window: int = 5) -> Diagnosis:
    """Diagnose each (first layer, last layer, in-flight, capacity) stage; default: the whole profile
    as one stage, compared with the profile's ground truth when it has some."""
    lookup = _Lookup(model)
    whole = stages is None
    stages = stages or [(0, model.num_layers - 1, 1, None)]
    out = [diagnose_stage(model, a, b, k, cap, top=top, window=window, lookup=lookup,
                          ground_truth=whole or (a == 0 and b == model.num_layers - 1))
           for a, b, k, cap in stages]
    return Diagnosis(stages=out, grouping=grouping_health(model))


# ------------------------------------------------------------------------------------------------
# Tables

def _span(layers: list[str]) -> str:
    return layers[0] if len(layers) == 1 else f"{layers[0]}..{layers[-1]}"


def diagnosis_tables(d: Diagnosis, gpu: bool | None = None) -> list[Table]:
    """The diagnosis as tables. ``gpu`` (default: the profile is on one tile): the device's
    memory in GiB, the aten operation and module at the peak, no code categories or tiles."""
    if gpu is None:
        gpu = d.model is not None and d.model.profile.target.tiles == 1
    tables = []
    for n, s in enumerate(d.stages):
        head = f"Stage {n} (layers {_span(s.layers)})" if len(d.stages) > 1 else f"Layers {_span(s.layers)}"
        if gpu:
            at = operation_text(s.operation) if s.operation else f"step {s.step}"
            t = Table(f"{head}: peak at {at} (step {s.step})",
                      [Column("category"), Column("memory", "gib"), Column("share", "percent")])
        else:
            t = Table(f"{head}: bottleneck tile {s.tile} at step {s.step} ({s.step_name})",
                      [Column("category"), Column("bytes", "int"), Column("share", "percent")])
        for key, value in s.memory.as_dict().items():
            code = key in ("vertex_code", "vertex_state", "exchange_code", "control_code")
            if (value or key != "stashed_copies") and not (gpu and code and not value):
                t.add(key.replace("_", " "), value, value / s.total if s.total else 0.0)
        t.add("total", s.total, 1.0)
        capacity = (f"capacity {s.capacity / GIB:,.2f} GiB: {s.total / s.capacity:.1%} used" if gpu else
                    f"capacity {s.capacity:,} bytes per tile: {s.total / s.capacity:.1%} used")
        t.note = capacity + (f"; {s.in_flight} micro-batches in flight" if s.in_flight > 1 else "")
        tables.append(t)
        where = f"at step {s.step}" if gpu else f"on tile {s.tile} at step {s.step}"
        v = Table(f"Largest variables live {where}",
                  [Column("variable"), Column("bytes", "bytes" if gpu else "int"), Column("pieces", "int", 3),
                   Column("kind"), Column("layers", "text", 1), Column("operations", "text", 2)])
        for x in s.top_variables:
            v.add(x.name, x.bytes, x.pieces, "always live" if x.always_live else "not always live",
                  ", ".join(x.layers) or "(none: shared)", "; ".join(x.operations) or "(no operation)")
        tables.append(v)
        if s.around:
            w = Table(f"Not-always-live {'memory' if gpu else f'bytes on tile {s.tile}'} around step {s.step}",
                      [Column("step", "id"), Column("operation" if gpu else "program"),
                       Column("bytes", "bytes" if gpu else "int"), Column("this stage", "text", 1)])
            for step, name, nbytes, inside in s.around:
                w.add(step, name + ("  <- peak" if step == s.step else ""), nbytes, "yes" if inside else "no")
            tables.append(w)
        if s.ground_truth is not None:
            g = s.ground_truth
            c = Table(f"Modelled vs profile ground truth on tile {s.tile}",
                      [Column("category"), Column("modelled", "int"), Column("ground truth", "int"),
                       Column("difference", "int")])
            for name, ours, theirs in g.rows:
                c.add(name, ours, theirs, theirs - ours)
            c.add("total", g.modelled, g.measured, g.unexplained)
            c.note = (f"unexplained: {g.unexplained:,} bytes ({g.unexplained / max(g.measured, 1):.1%} of the "
                      "ground truth) the model does not account for on this tile")
            tables.append(c)
            if g.unattributed:
                u = Table(f"Largest variables on tile {s.tile} that no layer's operation uses",
                          [Column("variable"), Column("bytes", "int"), Column("kind"), Column("operations")])
                for x in g.unattributed:
                    u.add(x.name, x.bytes, "always live" if x.always_live else "not always live",
                          "; ".join(x.operations) or "(no operation)")
                u.note = "counted on every stage with `shared='every'` (the default), on none with `shared='none'`"
                tables.append(u)
    h = d.grouping
    t = Table("Layer grouping health", [Column("check"), Column("result")])
    t.add("operations with a layer", f"{h.share:.1%} ({h.layers} layers)")
    t.add("operations without a layer", ", ".join(h.without_layer) or "none")
    t.add("calls with inputs from several layers", ", ".join(h.calls_with_several_input_layers) or "none")
    t.note = "\n".join(one_line(f"warning: {w}") for w in h.warnings)
    tables.append(t)
    return tables
