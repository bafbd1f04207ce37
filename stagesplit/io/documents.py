"""The fields both JSON profile forms (full and per-layer) and the compact header share: the
target, the descriptive info with its recorded layer grouping, byte counts and compute
figures, each read with one-line errors naming the field."""

from __future__ import annotations

from typing import Any

from ..common.fields import FieldReader
from ..common.limits import MAX_BYTES, MAX_COMPUTE
from .profile import (
    AUTOCAST_DTYPES,
    COLLECTIVE_GROUPS,
    COLLECTIVE_KINDS,
    PARAMETER_DTYPES,
    PHASE_LABELS,
    Collective,
    LayerGrouping,
    ParallelLayout,
    ProfileInfo,
    Target,
    TrainingPrecision,
)
from .targets import known_targets, target_from_mapping

__all__ = ["byte_count", "compute_figure", "grouping_from_record", "grouping_record", "layout_from_record",
           "layout_record", "precision_from_record", "precision_record", "read_info", "read_target"]

_GROUPING_KEYS = {"method", "layer_regex", "first_layer_regex", "last_layer_regex", "call_regex", "order", "layers",
                  "traced_stages"}


def byte_count(r: FieldReader, value: Any, path: str) -> int:
    """A byte count: a whole number in 0..MAX_BYTES, refused at its field (for a form whose
    fields do not map one to one onto the profile, a later check could not name it)."""
    nbytes = r.integer(value, path)
    if nbytes > MAX_BYTES:
        r.fail(path, f"a byte count <= {MAX_BYTES:,} (1 PiB)", nbytes)
    return nbytes


def compute_figure(r: FieldReader, value: Any, path: str) -> float:
    """A compute figure (cycles, FLOPs, seconds): a finite number in 0..MAX_COMPUTE."""
    figure = r.number(value, path)
    if figure > MAX_COMPUTE:
        r.fail(path, f"a number <= {MAX_COMPUTE:g}", figure)
    return figure


def read_target(value: Any, r: FieldReader, path: str = "target") -> Target:
    if isinstance(value, str):
        targets = known_targets()
        if value not in targets:
            r.fail(path, "a known target name (" + ", ".join(targets) + ") or a target object", value)
        return targets[value]
    r.mapping(value, path)
    return target_from_mapping(str(value.get("name", "custom")), value, r.source, path)


def read_info(doc: dict, r: FieldReader) -> ProfileInfo:
    return ProfileInfo(
        name=r.string(doc.get("name", ""), "name"),
        description=r.string(doc.get("description", ""), "description"),
        synthetic=r.boolean(doc.get("synthetic", False), "synthetic"),
        source=r.string(doc.get("source", "json"), "source"),
        compute_source=r.string(doc.get("compute_source", ""), "compute_source"),
        warnings=[r.string(w, f"warnings[{i}]") for i, w in enumerate(r.list(doc.get("warnings", []), "warnings"))],
        layer_grouping=(grouping_from_record(doc["layer_grouping"], r, "layer_grouping")
                        if doc.get("layer_grouping") is not None else None),
        parallel_layout=(layout_from_record(doc["parallel_layout"], r, "parallel_layout")
                         if doc.get("parallel_layout") is not None else None),
        precision=(precision_from_record(doc["precision"], r, "precision")
                   if doc.get("precision") is not None else None),
        batch_size=r.integer(doc["batch_size"], "batch_size", 1) if doc.get("batch_size") is not None else None)


def precision_record(precision: TrainingPrecision) -> dict[str, Any]:
    """``TrainingPrecision`` as the JSON object both file formats store (the info's ``precision``)."""
    doc: dict[str, Any] = {"parameters": precision.parameters}
    if precision.autocast:
        doc["autocast"] = precision.autocast
    if precision.master_weights:
        doc["master_weights"] = True
    return doc


def precision_from_record(value: Any, r: FieldReader, path: str) -> TrainingPrecision:
    """The ``TrainingPrecision`` a ``precision`` object describes, every field checked (their
    combination by the profile's validation)."""
    r.mapping(value, path)
    r.known_keys(value, path, {"parameters", "autocast", "master_weights"})
    return TrainingPrecision(
        parameters=r.choice(r.get(value, "parameters", path), f"{path}.parameters", PARAMETER_DTYPES),
        autocast=r.choice(value.get("autocast", ""), f"{path}.autocast", ("", *AUTOCAST_DTYPES)),
        master_weights=r.boolean(value.get("master_weights", False), f"{path}.master_weights"))


def grouping_record(g: LayerGrouping) -> dict[str, Any]:
    """``LayerGrouping`` as the JSON object both file formats store."""
    return {"method": g.method, "layer_regex": g.layer_regex, "first_layer_regex": g.first_layer_regex,
            "last_layer_regex": g.last_layer_regex, "call_regex": g.call_regex, "order": g.order,
            "layers": [{"name": n, "module_path": m} for n, m in zip(g.layers, g.module_paths)],
            **({"traced_stages": True} if g.traced_stages else {})}


def grouping_from_record(value: Any, r: FieldReader, path: str) -> LayerGrouping:
    """The ``LayerGrouping`` a ``layer_grouping`` object describes, every field checked."""
    r.mapping(value, path)
    r.known_keys(value, path, _GROUPING_KEYS)
    strings = {k: r.string(r.get(value, k, path), f"{path}.{k}")
               for k in ("method", "layer_regex", "first_layer_regex", "last_layer_regex", "call_regex")}
    order = r.choice(value.get("order", "steps"), f"{path}.order", ("steps", "natural"))
    names, paths = [], []
    for i, item in enumerate(r.list(value.get("layers", []), f"{path}.layers")):
        p = f"{path}.layers[{i}]"
        r.mapping(item, p)
        r.known_keys(item, p, {"name", "module_path"})
        names.append(r.string(r.get(item, "name", p), f"{p}.name"))
        module = item.get("module_path")
        paths.append(None if module is None else r.string(module, f"{p}.module_path"))
    traced = r.boolean(value.get("traced_stages", False), f"{path}.traced_stages")
    return LayerGrouping(order=order, layers=tuple(names), module_paths=tuple(paths), traced_stages=traced, **strings)


_LAYOUT_KEYS = {"tensor_parallel", "sequence_parallel", "plan", "styles", "additions", "heads", "collectives",
                "context_parallel", "cp_load_balanced", "expert_parallel", "experts"}
#: the phases a collective may run in (the capture's names: forward, loss, backward, recompute, optimizer)
_COLLECTIVE_PHASES = ("forward", "loss", "backward", "recompute", "optimizer", "setup", *PHASE_LABELS)


def layout_record(layout: ParallelLayout) -> dict[str, Any]:
    """``ParallelLayout`` as the JSON object both file formats store (the info's ``parallel_layout``)."""
    doc = {"tensor_parallel": layout.tensor_parallel, "sequence_parallel": layout.sequence_parallel,
           "plan": layout.plan,
           "styles": [{"module": m, "style": s} for m, s in layout.styles],
           "additions": [{"module": m, "what": w} for m, w in layout.additions],
           "heads": [{"module": m, "heads": h, "kv_heads": kv} for m, h, kv in layout.heads],
           "collectives": [{"step": c.step, "kind": c.kind, "bytes": c.bytes, "group_size": c.group_size,
                            "phase": c.phase, **({"group": c.group} if c.group != "tp" else {})}
                           for c in layout.collectives]}
    if layout.context_parallel != 1:          # written only where set: files of other layouts unchanged
        doc["context_parallel"] = layout.context_parallel
        doc["cp_load_balanced"] = layout.cp_load_balanced
    if layout.expert_parallel != 1:
        doc["expert_parallel"] = layout.expert_parallel
        doc["experts"] = [{"module": m, "experts": e} for m, e in layout.experts]
    return doc


def layout_from_record(value: Any, r: FieldReader, path: str) -> ParallelLayout:
    """The ``ParallelLayout`` a ``parallel_layout`` object describes, every field checked."""
    r.mapping(value, path)
    r.known_keys(value, path, _LAYOUT_KEYS)

    def rows(key: str, fields: dict[str, str]) -> list[tuple]:
        out = []
        for i, item in enumerate(r.list(value.get(key, []), f"{path}.{key}")):
            p = f"{path}.{key}[{i}]"
            r.mapping(item, p)
            r.known_keys(item, p, set(fields) | ({"group"} if key == "collectives" else set()))
            out.append(tuple(r.string(r.get(item, k, p), f"{p}.{k}") if kind == "str"
                             else byte_count(r, r.get(item, k, p), f"{p}.{k}") if kind == "bytes"
                             else r.choice(r.get(item, k, p), f"{p}.{k}", COLLECTIVE_KINDS) if kind == "kind"
                             else r.choice(r.get(item, k, p), f"{p}.{k}", _COLLECTIVE_PHASES) if kind == "phase"
                             else r.integer(r.get(item, k, p), f"{p}.{k}", 1 if kind == "positive" else 0)
                             for k, kind in fields.items())
                       + ((r.choice(item.get("group", "tp"), f"{p}.group", COLLECTIVE_GROUPS),)
                          if key == "collectives" else ()))
        return out

    collectives = tuple(Collective(*row) for row in rows(
        "collectives", {"step": "int", "kind": "kind", "bytes": "bytes", "group_size": "positive", "phase": "phase"}))
    return ParallelLayout(
        tensor_parallel=r.integer(r.get(value, "tensor_parallel", path), f"{path}.tensor_parallel", 1),
        sequence_parallel=r.boolean(value.get("sequence_parallel", False), f"{path}.sequence_parallel"),
        plan=r.string(value.get("plan", ""), f"{path}.plan"),
        styles=tuple(rows("styles", {"module": "str", "style": "str"})),
        additions=tuple(rows("additions", {"module": "str", "what": "str"})),
        heads=tuple(rows("heads", {"module": "str", "heads": "int", "kv_heads": "int"})),
        collectives=collectives,
        context_parallel=r.integer(value.get("context_parallel", 1), f"{path}.context_parallel", 1),
        cp_load_balanced=r.boolean(value.get("cp_load_balanced", False), f"{path}.cp_load_balanced"),
        expert_parallel=r.integer(value.get("expert_parallel", 1), f"{path}.expert_parallel", 1),
        experts=tuple(rows("experts", {"module": "str", "experts": "positive"})))
