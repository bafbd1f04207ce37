"""The fields both JSON profile forms (full and per-layer) and the compact header share: the
target, the descriptive info with its recorded layer grouping, byte counts and compute
figures, each read with one-line errors naming the field."""

from __future__ import annotations

from typing import Any

from ..common.fields import FieldReader
from ..common.limits import MAX_BYTES, MAX_COMPUTE
from .profile import LayerGrouping, ProfileInfo, Target
from .targets import known_targets, target_from_mapping

__all__ = ["byte_count", "compute_figure", "grouping_from_record", "grouping_record", "read_info", "read_target"]

_GROUPING_KEYS = {"method", "layer_regex", "first_layer_regex", "last_layer_regex", "call_regex", "order", "layers"}


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
                        if doc.get("layer_grouping") is not None else None))


def grouping_record(g: LayerGrouping) -> dict[str, Any]:
    """``LayerGrouping`` as the JSON object both file formats store."""
    return {"method": g.method, "layer_regex": g.layer_regex, "first_layer_regex": g.first_layer_regex,
            "last_layer_regex": g.last_layer_regex, "call_regex": g.call_regex, "order": g.order,
            "layers": [{"name": n, "module_path": m} for n, m in zip(g.layers, g.module_paths)]}


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
    return LayerGrouping(order=order, layers=tuple(names), module_paths=tuple(paths), **strings)
