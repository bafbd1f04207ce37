"""``stagesplit breakdown``: where a profile's memory and compute go, by operation, by layer, by
category and by tile, and what layers share and send each other."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costmodel import StageCostModel, StageMemory
from .stagememory import program_code
from .layers import Rule
from .table import Column, Table
from .traffic import Traffic, layer_traffic

SECTIONS = ("grouping", "operations", "layers", "totals", "tiles", "affinity", "communication")
CODE = ("vertex_code", "vertex_state", "exchange_code", "control_code")


def _label(name: str) -> str:
    return name.replace("_", " ")


@dataclass
class Breakdown:
    model: StageCostModel
    traffic: Traffic
    whole: StageMemory
    shared: StageMemory

    @classmethod
    def of(cls, model: StageCostModel) -> "Breakdown":
        return cls(model, layer_traffic(model), model.stage_memory(0, model.num_layers - 1), model.shared_memory())

    def tables(self, sections: tuple[str, ...] = SECTIONS, top_tiles: int = 10) -> list[Table]:
        builders = {"grouping": self.grouping_table, "operations": self.operations_table, "layers": self.layers_table,
                    "totals": self.totals_table, "tiles": lambda: self.tiles_table(top_tiles),
                    "affinity": self.affinity_table, "communication": self.communication_table}
        return [builders[s]() for s in sections]

    # -- tables -----------------------------------------------------------------------------------
    def grouping_table(self) -> Table:
        la = self.model.layers
        t = Table("Layer grouping", [Column("rule"), Column("operations", "int"), Column("share", "percent")])
        n = max(len(la.op_rule), 1)
        for rule in Rule:
            count = int((la.op_rule == rule).sum())
            if count:
                t.add(rule.label, count, count / n)
        notes = [f"{len(la.names)} layers in {la.options.order} order: {', '.join(la.names)}",
                 f"{la.share_assigned:.0%} of operations have a layer; shared items are counted on "
                 f"{'every stage' if self.model.shared == 'every' else 'no stage'} (--shared {self.model.shared})"]
        t.note = "\n".join(notes + [f"warning: {w}" for w in la.warnings])
        return t

    def operations_table(self) -> Table:
        m = self.model
        ops = m.profile.operations
        costs = operation_costs(m)
        la = m.layers
        roof = _roofline(m)
        t = Table("Operations (bytes summed over tiles)",
                  [Column("#", "id"), Column("operation"), Column("layer"), Column("rule")]
                  + [Column(_label(k), "bytes") for k in CODE]
                  + [Column("variables", "bytes"), Column("total", "bytes"), Column(f"compute ({m.profile.compute_unit})",
                                                                                      "compute")]
                  + ([Column("time (ms)", "float"), Column("bound")] if roof is not None else []))
        for i in range(len(ops)):
            layer = la.names[la.op_layer[i]] if la.op_layer[i] >= 0 else "-"
            extra = ([roof.op_seconds[i] * 1e3, "memory" if roof.op_memory_bound[i] else "compute"]
                     if roof is not None else [])
            t.add(i, ops.name[i] or "(unnamed)", layer, Rule(la.op_rule[i]).label,
                  *(int(getattr(costs, k)[i]) for k in CODE), int(costs.variables[i]), int(costs.total[i]),
                  float(costs.compute[i]), *extra)
        return t

    def layers_table(self) -> Table:
        m = self.model
        la = m.layers
        roof = _roofline(m)
        t = Table("Layers (each layer as a stage of its own; bytes summed over tiles)",
                  [Column("layer"), Column("ops", "int"), Column("always live", "bytes"),
                   Column("not always live", "bytes")] + [Column(_label(k), "bytes") for k in CODE]
                  + [Column("total", "bytes"), Column("worst tile", "id"), Column("worst tile bytes", "bytes"),
                     Column("stashed", "bytes"), Column(f"compute ({m.profile.compute_unit})", "compute")]
                  + ([Column("time (ms)", "float"), Column("bound")] if roof is not None else []))
        for l, name in enumerate(la.names):
            sm = m.stage_memory(l, l)
            extra = [roof.layer_seconds[l] * 1e3, roof.layer_bound[l]] if roof is not None else []
            t.add(name, int((la.op_layer == l).sum()), int(sm.always_live.sum()), int(sm.not_always_live.sum()),
                  *(int(sm.category(k).sum()) for k in CODE), int(sm.total().sum()), sm.worst_tile(),
                  sm.worst_bytes(), int(sm.stash.sum()), float(m.layer_compute[l]), *extra)
        t.note = (f"shared items on every layer: {self.shared.total().sum() / 1e6:.2f} MB summed over tiles"
                  if m.shared == "every" else "shared items are not counted (--shared none)")
        return t

    def totals_table(self) -> Table:
        m = self.model
        whole, shared = self.whole, self.shared
        t = Table("Memory totals by category (whole profile as one stage; summed over tiles)",
                  [Column("category"), Column("modelled", "bytes"), Column("shared part", "bytes"),
                   Column("worst tile", "bytes")])
        rows = [("always-live variables", whole.always_live, shared.always_live),
                ("not-always-live variables (peak)", whole.not_always_live, shared.not_always_live)]
        rows += [(_label(k), whole.category(k), shared.category(k)) for k in CODE]
        for name, values, part in rows:
            t.add(name, int(values.sum()), int(part.sum()), int(values.max(initial=0)))
        t.add("total", int(whole.total().sum()), int(shared.total().sum()), whole.worst_bytes())
        notes = [f"capacity: {m.profile.target.tiles:,} tiles x {m.profile.target.bytes_per_tile:,} bytes "
                 f"({m.profile.target.name}); worst tile needs {whole.worst_bytes() / m.profile.target.bytes_per_tile:.0%}"
                 " of a tile",
                 f"compute: {m.layer_compute.sum():.4g} {m.profile.compute_unit} in layers, "
                 f"{m.shared_compute:.4g} in shared operations ({m.profile.info.compute_source or 'source not stated'})"]
        gt = m.profile.ground_truth
        if gt is not None:
            total = gt.tile_total()
            notes.append(f"profile ground truth: {total.sum() / 1e6:.2f} MB summed over tiles, worst tile "
                         f"{int(total.max()):,} bytes; modelled {whole.total().sum() / 1e6:.2f} MB")
        t.note = "\n".join(notes)
        return t

    def tiles_table(self, top: int = 10) -> Table:
        whole = self.whole
        total = whole.total()
        order = np.argsort(-total, kind="stable")[:max(top, 0)]
        t = Table(f"Most loaded tiles (whole profile as one stage, top {len(order)})",
                  [Column("tile", "id"), Column("total", "bytes"), Column("always live", "bytes"),
                   Column("not always live", "bytes"), Column("peak step", "id")]
                  + [Column(_label(k), "bytes") for k in CODE] + [Column("of capacity", "percent")])
        cap = self.model.profile.target.bytes_per_tile
        for tile in order:
            step = int(whole.peak_step[tile])
            t.add(int(tile), int(total[tile]), int(whole.always_live[tile]), int(whole.not_always_live[tile]),
                  step if step >= 0 else None, *(int(whole.category(k)[tile]) for k in CODE), total[tile] / cap)
        return t

    def affinity_table(self) -> Table:
        names = self.model.layers.names
        t = Table("Memory affinity (bytes of variables used by both layers)",
                  [Column("layer")] + [Column(n, "bytes") for n in names])
        for i, name in enumerate(names):
            t.add(name, *(int(x) for x in self.traffic.affinity[i]))
        return t

    def communication_table(self) -> Table:
        names = self.model.layers.names
        tr = self.traffic
        t = Table("Inter-layer communication (bytes created in the row layer, used in the column layer)",
                  [Column("from \\ to")] + [Column(n, "bytes") for n in names] + [Column("cut before", "bytes")])
        for i, name in enumerate(names):
            t.add(name, *(int(x) for x in tr.communication[i]), int(tr.cut_bytes[i]))
        t.note = "cut before: bytes that cross a split placed just before the layer (both directions)"
        return t


def _roofline(m: StageCostModel):
    """Roofline times (roofline.py) to show: for FLOP/second profiles and any profile that knows
    bytes accessed; cycle-estimated IPU profiles keep their plain columns."""
    roof = getattr(m, "roofline", None)
    if roof is None:
        return None
    if m.profile.compute_unit in ("flops", "seconds") or np.isfinite(m.profile.operations.bytes_accessed).any():
        return roof
    return None


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


def operation_costs(model: StageCostModel) -> OperationCosts:
    """Each operation on its own, summed over tiles (PopLiner's per-operation view): its
    variables' per-tile peak over its own steps, and its programs' code."""
    ops = model.profile.operations
    v = model.profile.variables
    tl = model.timeline
    n = len(ops)
    out = {k: np.zeros(n, np.int64) for k in ("always_live", "not_always_live", "vertex_code", "vertex_state",
                                               "exchange_code", "control_code")}
    for i in range(n):
        vars_ = ops.vars[i]
        out["always_live"][i] = v.bytes[vars_[v.always_live[vars_]]].sum()
        c0, c1 = int(tl.op_col_start[i]), int(tl.op_col_end[i])
        nal = vars_[model.var_nal[vars_]]
        if c1 > c0 and len(nal):
            live = tl.live_matrix(tl.rows_of(nal), c0, c1)
            if i in tl.op_rows:                  # unknown steps: only where its data is live
                live = live[:, tl.op_columns(i) - c0]
            out["not_always_live"][i] = live.max(axis=1).sum()
        code = program_code(model, np.unique(ops.programs[i]))
        for k in ("vertex_code", "vertex_state", "exchange_code", "control_code"):
            out[k][i] = code[k].sum()
    return OperationCosts(compute=model.op_compute.copy(), **out)
