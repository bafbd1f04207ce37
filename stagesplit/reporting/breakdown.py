"""``stagesplit breakdown``: where a profile's memory and compute go, by operation, by layer, by
category and by tile, and what layers share and send each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.text import one_line, show
from ..io.profile import Profile
from ..layers import Rule
from ..model.costmodel import StageCostModel, StageMemory
from ..model.datasharding import DataLayout, role_bytes, shard_profile
from ..model.stagememory import program_code
from ..model.traffic import Traffic, layer_traffic
from .table import Column, Table
from .units import GIB, device_words

__all__ = ["Breakdown", "CODE", "DEFAULT_SECTIONS", "OperationCosts", "SECTIONS", "operation_costs"]

SECTIONS = ("summary", "grouping", "operations", "layers", "totals", "tiles", "affinity", "communication")
#: what a bare ``breakdown`` shows: the summary and one row per layer (the rest on request)
DEFAULT_SECTIONS = ("summary", "layers")
CODE = ("vertex_code", "vertex_state", "exchange_code", "control_code")


def _label(name: str) -> str:
    return name.replace("_", " ")


@dataclass
class Breakdown:
    model: StageCostModel
    traffic: Traffic
    whole: StageMemory
    shared: StageMemory
    #: data-parallel ranks to show one rank's memory for under each ZeRO stage (None: not shown)
    data_parallel: int | None = None
    #: the one-device profile ``model``'s was sharded from (None: ``model``'s own)
    one_device: Profile | None = None
    #: one rank's cost model at each tensor-parallel degree of a file holding one per degree,
    #: ``model`` being the first's (empty: a profile of one degree)
    tensor_parallel: tuple[tuple[int, StageCostModel], ...] = ()

    @classmethod
    def of(cls, model: StageCostModel, data_parallel: int | None = None, one_device: Profile | None = None,
           tensor_parallel: tuple[tuple[int, StageCostModel], ...] = ()) -> Breakdown:
        return cls(model, layer_traffic(model), model.stage_memory(0, model.num_layers - 1), model.shared_memory(),
                   data_parallel, one_device, tensor_parallel)

    def tables(self, sections: tuple[str, ...] = DEFAULT_SECTIONS, top_tiles: int = 10) -> list[Table]:
        """The text tables of the given sections, in order (default: the summary and the layers),
        and with ``data_parallel``, one rank's memory under each ZeRO stage."""
        builders = {"summary": self.summary_table, "grouping": self.grouping_table, "operations": self.operations_table, "layers": self.layers_table,
                    "totals": self.totals_table, "tiles": lambda: self.tiles_table(top_tiles),
                    "affinity": self.affinity_table, "communication": self.communication_table}
        out = [builders[s]() for s in sections]
        if self.tensor_parallel:
            out.append(self.tensor_parallel_table())
        if self.data_parallel is not None:
            out.append(self.data_parallel_table(self.data_parallel))
        return out

    def tensor_parallel_rows(self) -> list[tuple[int, dict[str, int], int, int, int]]:
        """Per tensor-parallel degree: the degree, one rank's always-live bytes by role
        (``role_bytes``), its not-always-live bytes at its peak and the peak (the whole profile
        as one stage, on its worst tile), and the bytes its collectives move per step."""
        rows = []
        for degree, model in self.tensor_parallel:
            whole = model.stage_memory(0, model.num_layers - 1)
            tile = whole.worst_tile()
            layout = model.profile.info.parallel_layout
            moved = sum(c.bytes for c in layout.collectives) if layout is not None else 0
            rows.append((degree, role_bytes(model.profile), int(whole.not_always_live[tile]), whole.worst_bytes(),
                         moved))
        return rows

    def tensor_parallel_table(self) -> Table:
        """What each category becomes on one rank at each tensor-parallel degree."""
        t = Table("One rank at each tensor-parallel degree (whole profile as one stage)",
                  [Column("TP", "int"), Column("parameters", "bytes"), Column("gradients", "bytes"),
                   Column("optimizer state", "bytes"), Column("other always-live", "bytes"),
                   Column("activations at the peak", "bytes"), Column("peak", "bytes"),
                   Column("collectives per step", "bytes")])
        for degree, roles, transient, peak, moved in self.tensor_parallel_rows():
            other = sum(v for k, v in roles.items() if k not in ("param", "grad", "state", "transient"))
            t.add(degree, roles["param"], roles["grad"], roles["state"], other, transient, peak, moved)
        first = self.tensor_parallel[0][0]
        t.note = (f"activations at the peak: the not-always-live bytes live at the rank's peak; collectives: the bytes "
                  f"of every buffer the rank's collectives move in one step; the other tables are the TP {first} "
                  "rank's")
        return t

    def data_parallel_rows(self, dp: int) -> list[tuple[str, dict[str, int], int]]:
        """Per layout (one device, then ZeRO 0 to 3 on ``dp`` ranks, 3 with and without resharding
        after the forward): its name, one rank's always-live bytes by role (``role_bytes``) and
        the whole profile's peak on that rank as one stage. The profile must record roles."""
        m = self.model
        layouts = [("one device", DataLayout())] + \
            [(f"ZeRO {z}" + (" (DDP)" if z == 0 else ""), DataLayout(dp, z)) for z in range(4)] + \
            [("ZeRO 3, no reshard after forward", DataLayout(dp, 3, reshard_after_forward=False))]
        rows = []
        source = self.one_device if self.one_device is not None else m.profile
        for name, layout in layouts:
            rank = shard_profile(source, m.layers, layout)
            model = StageCostModel(rank, m.layers, shared=m.shared)
            rows.append((name, role_bytes(rank), model.stage_memory(0, model.num_layers - 1).worst_bytes()))
        return rows

    def data_parallel_table(self, dp: int) -> Table:
        """What each category becomes on one of ``dp`` data-parallel ranks, per ZeRO stage."""
        t = Table(f"One rank of {dp} data-parallel ranks, by ZeRO stage (whole profile as one stage)",
                  [Column("layout"), Column("parameters", "bytes"), Column("gradients", "bytes"),
                   Column("optimizer state", "bytes"), Column("runtime buffers", "bytes"), Column("peak", "bytes")])
        for name, roles, peak in self.data_parallel_rows(dp):
            t.add(name, roles["param"], roles["grad"], roles["state"], roles["other"], peak)
        t.note = ("runtime buffers: DDP's gradient buckets, FSDP2's unsharded parameters when they are kept from the "
                  "forward to the backward (the buffers that live only part of the step are in the peak); rules: "
                  "docs/layouts.md")
        return t

    @property
    def words(self):
        return device_words(self.model.profile.target.tiles)

    def _bytes(self, value: float) -> str:
        """Bytes summed over tiles in a note: GiB on a GPU, MiB over an IPU's tiles."""
        if self.words.one_tile:
            return f"{value / GIB:,.2f} GiB"
        return f"{value / 2**20:,.2f} MiB summed over tiles"

    # -- tables -----------------------------------------------------------------------------------
    def summary_table(self) -> Table:
        """The profile in a few lines: device, layers, what the whole model needs against one
        device, compute, and the largest layers."""
        m = self.model
        p = m.profile
        t_ = p.target
        words = self.words
        whole = self.whole
        t = Table(f"Summary of {show(p.info.name or 'the profile')}{' (synthetic)' if p.info.synthetic else ''}",
                  [Column("item"), Column("value")])
        if words.one_tile:
            t.add("device", f"{t_.name}: {t_.device_bytes / GIB:,.2f} GiB")
        else:
            t.add("device", f"{t_.name}: {t_.tiles:,} tiles x {t_.bytes_per_tile:,} bytes")
        la = m.layers
        t.add("layers", f"{len(la.names)} ({la.share_assigned:.0%} of {len(p.operations):,} operations have one)")
        need = whole.worst_bytes()
        cap = t_.device_bytes if words.one_tile else t_.bytes_per_tile
        where = "the device" if words.one_tile else f"its worst tile (tile {whole.worst_tile()})"
        t.add("whole model on one device", f"{words.bytes_of(need, cap)} on {where}: {need / cap:.0%}")
        t.add("weights, gradients, optimizer state" if words.one_tile else "always-live variables",
              self._bytes(whole.always_live.sum()))
        shared = self.shared.total().sum()
        t.add("used by no layer", f"{self._bytes(shared)}, counted on "
              f"{'every stage' if m.shared == 'every' else 'no stage'} (`shared='{m.shared}'`)")
        roof = _roofline(m)
        compute = f"{m.layer_compute.sum() + m.shared_compute:.4g} {p.compute_unit}"
        if roof is not None:
            compute += f" ({roof.layer_seconds.sum() * 1e3:,.3g} ms on {t_.name})"
        t.add("compute per step", compute)
        if len(la.names):
            sizes = [m.stage_memory(l, l).worst_bytes() for l in range(len(la.names))]
            big = int(np.argmax(sizes))
            heavy = int(np.argmax(m.layer_compute))
            t.add("largest layer (memory)", f"{show(la.names[big])}: {words.bytes(sizes[big])}"
                  + ("" if words.one_tile else " on its worst tile"))
            t.add("heaviest layer (compute)", f"{show(la.names[heavy])}: {m.layer_compute[heavy]:.4g} {p.compute_unit}")
        rest = [s for s in SECTIONS if s not in DEFAULT_SECTIONS and not (words.one_tile and s == "tiles")]
        t.note = f"more: `sections={','.join(rest)}`"
        return t

    def grouping_table(self) -> Table:
        """How operations were assigned to layers, by rule."""
        la = self.model.layers
        t = Table("Layer grouping", [Column("rule"), Column("operations", "int"), Column("share", "percent")])
        n = max(len(la.op_rule), 1)
        for rule in Rule:
            count = int((la.op_rule == rule).sum())
            if count:
                t.add(rule.label, count, count / n)
        notes = [f"{len(la.names)} layers in {la.options.order.value} order: {', '.join(la.names)}",
                 f"{la.share_assigned:.0%} of operations have a layer; shared items are counted on "
                 f"{'every stage' if self.model.shared == 'every' else 'no stage'} (`shared='{self.model.shared}'`)"]
        t.note = "\n".join(one_line(line) for line in notes + [f"warning: {w}" for w in la.warnings])
        return t

    def operations_table(self) -> Table:
        """Each operation's memory by category and compute."""
        m = self.model
        ops = m.profile.operations
        costs = operation_costs(m)
        la = m.layers
        roof = _roofline(m)
        t = Table("Operations (bytes summed over tiles)",
                  [Column("#", "id"), Column("operation"), Column("layer"), Column("rule", "text", 3)]
                  + [Column(_label(k), "bytes", 3) for k in CODE]
                  + [Column("variables", "bytes", 2), Column("total", "bytes"),
                     Column(f"compute ({m.profile.compute_unit})", "compute", 1 if roof is not None else 0)]
                  + ([Column("time (ms)", "float"), Column("bound", "text", 1)] if roof is not None else []))
        for i in range(len(ops)):
            layer = la.names[la.op_layer[i]] if la.op_layer[i] >= 0 else "-"
            extra = ([roof.op_seconds[i] * 1e3, "memory" if roof.op_memory_bound[i] else "compute"]
                     if roof is not None else [])
            t.add(i, ops.name[i] or "(unnamed)", layer, Rule(la.op_rule[i]).label,
                  *(int(getattr(costs, k)[i]) for k in CODE), int(costs.variables[i]), int(costs.total[i]),
                  float(costs.compute[i]), *extra)
        return t

    def layers_table(self) -> Table:
        """Each layer's memory by category, worst tile, stashed bytes, cut bytes and compute."""
        m = self.model
        la = m.layers
        roof = _roofline(m)
        paths = list(la.module_paths) if m.profile.target.tiles == 1 and any(la.module_paths) else []
        t = Table("Layers (each layer as a stage of its own; bytes summed over tiles)",
                  [Column("layer")] + ([Column("module", "text", 2)] if paths else []) +
                  [Column("ops", "int", 5), Column("always live", "bytes"),
                   Column("not always live", "bytes")] + [Column(_label(k), "bytes", 3) for k in CODE]
                  + [Column("total", "bytes"), Column("worst tile", "id", 4), Column("worst tile bytes", "bytes"),
                     Column("stashed", "bytes", 2),
                     Column(f"compute ({m.profile.compute_unit})", "compute", 1 if roof is not None else 0)]
                  + ([Column("time (ms)", "float"), Column("bound", "text", 1)] if roof is not None else []))
        for l, name in enumerate(la.names):
            sm = m.stage_memory(l, l)
            extra = [roof.layer_seconds[l] * 1e3, roof.layer_bound[l]] if roof is not None else []
            t.add(name, *([paths[l] or "-"] if paths else []), int((la.op_layer == l).sum()), int(sm.always_live.sum()),
                  int(sm.not_always_live.sum()),
                  *(int(sm.category(k).sum()) for k in CODE), int(sm.total().sum()), sm.worst_tile(),
                  sm.worst_bytes(), int(sm.stash.sum()), float(m.layer_compute[l]), *extra)
        t.note = (f"shared items (used by no layer) on every layer: {self._bytes(self.shared.total().sum())}"
                  if m.shared == "every" else "shared items are not counted (`shared='none'`)")
        return t

    def totals_table(self) -> Table:
        """The whole profile's memory by category, modelled against the profile's own totals."""
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
        target = m.profile.target
        if self.words.one_tile:
            capacity = (f"capacity: {target.device_bytes / GIB:,.2f} GiB ({target.name}); the whole model needs "
                        f"{whole.worst_bytes() / target.device_bytes:.0%} of it")
        else:
            capacity = (f"capacity: {target.tiles:,} tiles x {target.bytes_per_tile:,} bytes ({target.name}); worst "
                        f"tile needs {whole.worst_bytes() / target.bytes_per_tile:.0%} of a tile")
        notes = [capacity,
                 f"compute: {m.layer_compute.sum():.4g} {m.profile.compute_unit} in layers, "
                 f"{m.shared_compute:.4g} in shared operations ({m.profile.info.compute_source or 'source not stated'})"]
        gt = m.profile.ground_truth
        if gt is not None:
            total = gt.tile_total()
            notes.append(f"profile ground truth: {total.sum() / 2**20:,.2f} MiB summed over tiles, worst tile "
                         f"{int(total.max()):,} bytes; modelled {whole.total().sum() / 2**20:,.2f} MiB")
        t.note = "\n".join(one_line(line) for line in notes)
        return t

    def tiles_table(self, top: int = 10) -> Table:
        """The ``top`` most loaded tiles, by category."""
        whole = self.whole
        total = whole.total()
        order = np.argsort(-total, kind="stable")[:max(top, 0)]
        t = Table(f"Most loaded tiles (whole profile as one stage, top {len(order)})",
                  [Column("tile", "id"), Column("total", "bytes"), Column("always live", "bytes"),
                   Column("not always live", "bytes"), Column("peak step", "id", 2)]
                  + [Column(_label(k), "bytes", 3) for k in CODE] + [Column("of capacity", "percent")])
        cap = self.model.profile.target.bytes_per_tile
        for tile in order:
            step = int(whole.peak_step[tile])
            t.add(int(tile), int(total[tile]), int(whole.always_live[tile]), int(whole.not_always_live[tile]),
                  step if step >= 0 else None, *(int(whole.category(k)[tile]) for k in CODE), total[tile] / cap)
        return t

    def affinity_table(self) -> Table:
        """Bytes each pair of layers shares (items used by both)."""
        names = self.model.layers.names
        t = Table("Memory affinity (bytes of variables used by both layers)",
                  [Column("layer")] + [Column(n, "bytes") for n in names])
        for i, name in enumerate(names):
            t.add(name, *(int(x) for x in self.traffic.affinity[i]))
        return t

    def communication_table(self) -> Table:
        """Bytes each layer sends to each later layer."""
        names = self.model.layers.names
        tr = self.traffic
        t = Table("Inter-layer communication (bytes created in the row layer, used in the column layer)",
                  [Column("from \\ to")] + [Column(n, "bytes") for n in names] + [Column("cut before", "bytes")])
        for i, name in enumerate(names):
            t.add(name, *(int(x) for x in tr.communication[i]), int(tr.cut_bytes[i]))
        t.note = "cut before: bytes that cross a split placed just before the layer (both directions)"
        return t

    # -- pandas DataFrames (built from the arrays, not the tables; pandas imported only here) -----
    def grouping_frame(self):
        """Operations per grouping rule: index ``rule`` (label), ``operations`` (int64) and
        ``share`` (fraction of all operations); rules no operation used are left out."""
        from ..common.frames import frame
        la = self.model.layers
        rules = [r for r in Rule if (la.op_rule == r).any()]
        counts = [int((la.op_rule == r).sum()) for r in rules]
        n = max(len(la.op_rule), 1)
        return frame({"operations": (counts, "int64"), "share": ([c / n for c in counts], "float64")},
                     index=("rule", [r.label for r in rules], object))

    def operations_frame(self):
        """One row per operation (index ``operation``, its number in program order): ``name``,
        ``layer`` (name, None without one), ``layer_index`` (-1 without one), ``rule``, the
        bytes it needs on its own summed over tiles (``always_live_bytes``,
        ``not_always_live_bytes``, ``vertex_code_bytes``, ``vertex_state_bytes``,
        ``exchange_code_bytes``, ``control_code_bytes``, ``variables_bytes``, ``total_bytes``;
        int64), ``compute`` (in ``attrs["compute_unit"]``) and, where the profile has roofline
        times, ``time_s`` and ``bound`` ("memory" or "compute")."""
        from ..common.frames import frame
        m = self.model
        la = m.layers
        costs = operation_costs(m)
        layer = np.asarray(la.op_layer, np.int64)
        cols = {"name": (list(m.profile.operations.name), object),
                "layer": ([la.names[l] if l >= 0 else None for l in layer], object),
                "layer_index": (layer, "int64"),
                "rule": ([Rule(r).label for r in la.op_rule], object)}
        for k in ("always_live", "not_always_live") + CODE + ("variables", "total"):
            cols[f"{k}_bytes"] = (getattr(costs, k), "int64")
        cols["compute"] = (costs.compute, "float64")
        roof = _roofline(m)
        if roof is not None:
            cols["time_s"] = (roof.op_seconds, "float64")
            cols["bound"] = (np.where(roof.op_memory_bound, "memory", "compute").tolist(), object)
        return frame(cols, index=("operation", np.arange(len(layer)), "int64"), attrs=self._attrs())

    def layers_frame(self):
        """One row per layer (index ``layer``, its number), each priced as a stage of its own:
        ``name``, ``ops``, bytes summed over tiles (``always_live_bytes``,
        ``not_always_live_bytes``, ``vertex_code_bytes`` ... ``control_code_bytes``,
        ``total_bytes``), ``worst_tile`` and ``worst_tile_bytes``, ``stashed_bytes``,
        ``cut_before_bytes`` (bytes crossing a split placed just before the layer), ``compute``
        and, with roofline times, ``time_s`` and ``bound``. Bytes are int64."""
        from ..common.frames import frame
        m = self.model
        la = m.layers
        stages = [m.stage_memory(l, l) for l in range(len(la.names))]
        cols = {"name": (list(la.names), object),
                "ops": (np.bincount(la.op_layer[la.op_layer >= 0], minlength=len(la.names)), "int64"),
                "always_live_bytes": ([sm.always_live.sum() for sm in stages], "int64"),
                "not_always_live_bytes": ([sm.not_always_live.sum() for sm in stages], "int64")}
        for k in CODE:
            cols[f"{k}_bytes"] = ([sm.category(k).sum() for sm in stages], "int64")
        cols.update({"total_bytes": ([sm.total().sum() for sm in stages], "int64"),
                     "worst_tile": ([sm.worst_tile() for sm in stages], "int64"),
                     "worst_tile_bytes": ([sm.worst_bytes() for sm in stages], "int64"),
                     "stashed_bytes": ([sm.stash.sum() for sm in stages], "int64"),
                     "cut_before_bytes": (self.traffic.cut_bytes[:len(la.names)], "int64"),
                     "compute": (m.layer_compute, "float64")})
        roof = _roofline(m)
        if roof is not None:
            cols["time_s"] = (roof.layer_seconds, "float64")
            cols["bound"] = (list(roof.layer_bound), object)
        return frame(cols, index=("layer", np.arange(len(la.names)), "int64"), attrs=self._attrs())

    def totals_frame(self):
        """The whole profile as one stage, by category (index ``category``: ``always_live``,
        ``not_always_live``, ``vertex_code``, ``vertex_state``, ``exchange_code``,
        ``control_code``, ``total``): ``modelled_bytes`` and ``shared_bytes`` (the part from
        items no layer owns) summed over tiles, and ``worst_tile_bytes`` (the most any one
        tile holds of that category; for ``total``, the fullest tile)."""
        from ..common.frames import frame
        whole, shared = self.whole, self.shared
        keys = ("always_live", "not_always_live") + CODE
        return frame({"modelled_bytes": ([whole.category(k).sum() for k in keys] + [whole.total().sum()], "int64"),
                      "shared_bytes": ([shared.category(k).sum() for k in keys] + [shared.total().sum()], "int64"),
                      "worst_tile_bytes": ([whole.category(k).max(initial=0) for k in keys] + [whole.worst_bytes()],
                                           "int64")},
                     index=("category", list(keys) + ["total"], object), attrs=self._attrs())

    def tiles_frame(self, top: int | None = None):
        """Tiles of the whole profile as one stage, fullest first (ties in tile order; the
        ``top`` fullest, or all): index ``tile``; ``total_bytes``, ``always_live_bytes``,
        ``not_always_live_bytes``, ``peak_step`` (nullable Int64: <NA> where nothing
        not-always-live is live), the code categories' ``*_bytes`` and ``of_capacity``
        (fraction of a tile's bytes)."""
        from ..common.frames import frame
        whole = self.whole
        total = whole.total()
        order = np.argsort(-total, kind="stable")
        if top is not None:
            order = order[:max(top, 0)]
        steps = whole.peak_step[order]
        cols: dict[str, tuple[Any, Any]] = {"total_bytes": (total[order], "int64"), "always_live_bytes": (whole.always_live[order], "int64"),
                "not_always_live_bytes": (whole.not_always_live[order], "int64"),
                "peak_step": ([int(s) if s >= 0 else None for s in steps], "Int64")}
        for k in CODE:
            cols[f"{k}_bytes"] = (whole.category(k)[order], "int64")
        cols["of_capacity"] = (total[order] / self.model.profile.target.bytes_per_tile, "float64")
        return frame(cols, index=("tile", order, "int64"), attrs=self._attrs())

    def affinity_frame(self):
        """Bytes of variables used by both layers: a square int64 frame, layer names on both axes."""
        return self._layer_matrix(self.traffic.affinity, "layer", "layer")

    def communication_frame(self):
        """Bytes created in the row layer and used in the column layer: a square int64 frame
        (index ``from``, columns ``to``, layer names). The bytes a split just before each layer
        cuts are ``layers_frame()["cut_before_bytes"]``."""
        return self._layer_matrix(self.traffic.communication, "from", "to")

    def _layer_matrix(self, values: np.ndarray, rows: str, columns: str):
        from ..common.frames import pandas
        pd = pandas()
        names = list(self.model.layers.names)
        return pd.DataFrame(np.asarray(values, np.int64), index=pd.Index(names, name=rows, dtype=object),
                            columns=pd.Index(names, name=columns, dtype=object))

    def _attrs(self) -> dict:
        p = self.model.profile
        return {"compute_unit": p.compute_unit, "profile": p.info.name, "target": p.target.name}

    def _repr_html_(self) -> str:
        """Notebook display: the profile's size and memory totals, then the per-layer frame
        (the layers' main columns); names are escaped."""
        from ..common.frames import html_summary
        m = self.model
        p = m.profile
        title = (f"stagesplit breakdown of {p.info.name or 'a profile'}: {len(m.layers.names)} layers, "
                 f"{len(p.operations)} operations on {p.target.name}")
        lines = self.totals_table().note.splitlines()
        layers = self.layers_frame()
        keep = [c for c in ("name", "ops", "always_live_bytes", "not_always_live_bytes", "total_bytes",
                            "worst_tile_bytes", "stashed_bytes", "cut_before_bytes", "compute", "time_s", "bound")
                if c in layers.columns]
        return html_summary(title, lines, layers[keep].to_html())


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
