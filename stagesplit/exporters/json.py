"""Plain JSON: the header lines and each stage's device, layer names, module paths and memory
(``peak_bytes`` on a GPU, ``worst_tile_bytes`` on an IPU, as plan files name it). Names are JSON
strings (``json.dumps`` escapes them; lone surrogates as ``\\udXXX``)."""

from __future__ import annotations

import json

from ._common import Decoded, ExportOptions
from ._plan_view import PlanView
from .header import header_lines
from .render import RenderCheckError

__all__ = ["NAME", "DESCRIPTION", "render", "read_back"]

NAME = "json"
DESCRIPTION = "plain stage -> layer-name lists (with module paths and memory)"


def render(view: PlanView, options: ExportOptions) -> list[str]:
    names, paths = view.layer_names, view.module_paths
    memory = "peak_bytes" if view.tiles == 1 else "worst_tile_bytes"
    doc = {"format": "stagesplit-export", "header": header_lines(view, NAME),
           "profile": view.profile_name, "sha256": view.sha256, "objective": view.objective,
           "stages": [{"stage": s.index, "device": s.device, "layers": [names[i] for i in s.layers],
                       "module_paths": [paths[i] for i in s.layers], memory: s.worst_tile_bytes,
                       "capacity_bytes": s.capacity_bytes} for s in view.stages]}
    lines = ["{"]
    items = list(doc.items())
    for j, (key, value) in enumerate(items):      # one line per header line and per stage
        comma = "," if j < len(items) - 1 else ""
        if isinstance(value, list) and value:
            lines.append(f" {json.dumps(key)}: [")
            lines += [f"  {json.dumps(v)}{',' if i < len(value) - 1 else ''}" for i, v in enumerate(value)]
            lines.append(f" ]{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return lines


def read_back(doc: dict, view: PlanView, options: ExportOptions) -> Decoded:
    index = {n: i for i, n in enumerate(view.layer_names)}
    try:
        stages = tuple(tuple(index[n] for n in s["layers"]) for s in doc["stages"])
        devices = tuple(s["device"] for s in doc["stages"])
        paths = [s["module_paths"] for s in doc["stages"]]
        fields = (doc["profile"], doc["sha256"], doc["objective"], doc["header"])
    except (KeyError, TypeError) as exc:
        raise RenderCheckError(f"the JSON does not list the plan's stages: {exc}") from None
    if paths != [[view.module_paths[i] for i in layers] for layers in stages]:
        raise RenderCheckError("the JSON's module paths differ from the plan's")
    if fields != (view.profile_name, view.sha256, view.objective, header_lines(view, NAME)):
        raise RenderCheckError("the JSON's profile, hash, objective or header differ from the plan's")
    return Decoded(stages, devices)
