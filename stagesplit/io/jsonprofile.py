"""stagesplit's JSON profile format ("synthetic JSON"), version 1: reader with validation and
writer. The format is documented field by field in docs/profile-format.md.

Two kinds share the header ``{"format": "stagesplit-profile", "version": 1, "kind": ...}``:
``"full"`` (tiles, steps, variables with liveness, programs with per-tile code, operations,
ground truth) and ``"layers"`` (one record per layer, for quick what-if use and GPU users).
"""

from __future__ import annotations

import io
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..common.fields import FieldReader
from ..common.limits import MAX_STEPS
from ..common.safeinput import InputFile, load_json
from ..errors import ProfileError
from .builder import ProfileBuilder
from .documents import grouping_record, layout_record, precision_record, read_info, read_target
from .layerform import profile_from_layer_document
from .profile import COMPUTE_UNITS, PHASE_LABELS, ROLES, GroundTruth, Phase, Profile, Target

__all__ = ["FORMAT", "VERSION", "dumps_profile", "parse_json_text", "profile_from_document", "profile_to_document",
           "read_json_profile"]

FORMAT = "stagesplit-profile"
VERSION = 1

_TOP_FULL = {"format", "version", "kind", "name", "description", "synthetic", "source", "target", "compute_unit",
             "compute_source", "warnings", "steps", "variables", "programs", "operations", "ground_truth",
             "layer_grouping", "parallel_layout", "precision", "batch_size"}
_VAR_KEYS = {"name", "bytes", "tile", "live", "role"}
_PROG_KEYS = {"name", "type", "cycles", "vertices", "vertex_code", "vertex_state", "exchange_code", "control_code"}
_OP_KEYS = {"name", "layer", "debug_id", "inputs", "first_step", "last_step", "vars", "programs", "compute",
            "bytes_accessed", "phase"}


def parse_json_text(text: str, source: str) -> Any:
    """Strict JSON (see ``safeinput.load_json``: no NaN/Infinity, duplicate keys or deep nesting)."""
    return load_json(text, source)


def read_json_profile(path: str | Path, data: bytes | None = None) -> Profile:
    """Read a JSON profile from ``path`` (opened once), or from ``data`` already read from it."""
    path = Path(path)
    if data is None:
        with InputFile(path, "profile") as f:
            data = f.read_all(None)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ProfileError(path, "", "a UTF-8 JSON document") from None
    return profile_from_document(parse_json_text(text, str(path)), str(path))


def profile_from_document(doc: Any, source: str) -> Profile:
    """Validate a parsed JSON document and build the Profile it describes."""
    r = FieldReader(source)
    r.mapping(doc, "document")
    fmt = r.get(doc, "format", "")
    if fmt != FORMAT:
        r.fail("format", f'"{FORMAT}"', fmt)
    version = r.get(doc, "version", "")
    if isinstance(version, bool) or version != VERSION:
        r.fail("version", f"{VERSION} (this stagesplit reads profile format version {VERSION})", version)
    kind = r.choice(doc.get("kind", "full"), "kind", ("full", "layers"))
    if kind == "layers":

        return profile_from_layer_document(doc, r)
    return _read_full(doc, r)


def _read_full(doc: dict, r: FieldReader) -> Profile:
    r.known_keys(doc, "", _TOP_FULL)
    target = read_target(r.get(doc, "target", ""), r)
    steps_value = r.get(doc, "steps", "")
    steps: list[str] | int
    if isinstance(steps_value, list):
        steps = [r.string(s, f"steps[{i}]") for i, s in enumerate(steps_value)]
    else:
        steps = r.integer(steps_value, "steps", minimum=0)
        if steps > MAX_STEPS:               # checked before a name is made for every step
            r.fail("steps", f"a step count <= {MAX_STEPS:,}", steps)
    unit = r.choice(doc.get("compute_unit", "cycles"), "compute_unit", COMPUTE_UNITS)
    b = ProfileBuilder(target, steps, unit, read_info(doc, r))
    nsteps = len(b.steps)
    phases: list[int] = []

    for i, var in enumerate(r.list(doc.get("variables", []), "variables")):
        p = f"variables[{i}]"
        r.mapping(var, p)
        r.known_keys(var, p, _VAR_KEYS)
        live = var.get("live", "always")
        if isinstance(live, str):
            if live != "always":
                r.fail(f"{p}.live", '"always" or a list of [start, end) step intervals', live)
        else:
            r.list(live, f"{p}.live")
            for k, iv in enumerate(live):
                ip = f"{p}.live[{k}]"
                if not isinstance(iv, list) or len(iv) != 2:
                    r.fail(ip, "a [start, end) pair of step indices", iv)
                s = r.integer(iv[0], ip + "[0]")
                e = r.integer(iv[1], ip + "[1]")
                if s > nsteps:
                    r.fail(ip + "[0]", f"a step index in 0..{nsteps}", s)
                if e < s or e > nsteps:
                    r.fail(ip + "[1]", f"an end >= start ({s}) and <= {nsteps} (end is exclusive)", e)
        name = var.get("name")
        role = var.get("role")
        b.variable(bytes=r.integer(r.get(var, "bytes", p), f"{p}.bytes"),
                   tile=r.integer(var.get("tile", 0), f"{p}.tile"),
                   live=live, name=None if name is None else r.string(name, f"{p}.name"),
                   role=None if role is None else r.choice(role, f"{p}.role", ROLES))

    for i, prog in enumerate(r.list(doc.get("programs", []), "programs")):
        p = f"programs[{i}]"
        r.mapping(prog, p)
        r.known_keys(prog, p, _PROG_KEYS)
        cycles = prog.get("cycles")
        code_tiles, code_types, code_bytes = _vertex_code(prog.get("vertex_code", []), f"{p}.vertex_code",
                                                          target.tiles, r)
        pairs = {cat: _tile_pairs(prog.get(cat, []), f"{p}.{cat}", target.tiles, r)
                 for cat in ("vertex_state", "exchange_code", "control_code")}
        program = b.program(name=r.string(prog.get("name", f"program{i}"), f"{p}.name"),
                            kind=r.string(prog.get("type", "OnTileExecute"), f"{p}.type"),
                            cycles=math.nan if cycles is None else r.number(cycles, f"{p}.cycles"),
                            vertices=r.integer(prog.get("vertices", 0), f"{p}.vertices"))
        if len(code_tiles):
            b.program_costs("vertex_code", program, code_tiles, code_bytes, vertex_type=code_types)
        for cat, rows in pairs.items():
            if len(rows):
                b.program_costs(cat, program, rows[:, 0], rows[:, 1])

    ops = r.list(r.get(doc, "operations", ""), "operations", nonempty=True)
    for i, op in enumerate(ops):
        p = f"operations[{i}]"
        r.mapping(op, p)
        r.known_keys(op, p, _OP_KEYS)
        inputs = r.list(op.get("inputs", []), f"{p}.inputs")
        layer = op.get("layer")
        compute = op.get("compute")
        accessed = op.get("bytes_accessed")
        phase = op.get("phase", Phase.UNKNOWN.label)
        phases.append(Phase.from_label(r.choice(phase, f"{p}.phase", PHASE_LABELS)))
        b.operation(
            name=r.string(r.get(op, "name", p), f"{p}.name"),
            layer=None if layer is None else r.string(layer, f"{p}.layer"),
            debug_id=r.integer(op.get("debug_id", -1), f"{p}.debug_id", minimum=-1),
            inputs=[r.string(x, f"{p}.inputs[{k}]") for k, x in enumerate(inputs)],
            first_step=r.integer(op.get("first_step", -1), f"{p}.first_step", minimum=-1),
            last_step=r.integer(op.get("last_step", -1), f"{p}.last_step", minimum=-1),
            vars=[r.integer(x, f"{p}.vars[{k}]") for k, x in enumerate(r.list(op.get("vars", []), f"{p}.vars"))],
            programs=[r.integer(x, f"{p}.programs[{k}]")
                      for k, x in enumerate(r.list(op.get("programs", []), f"{p}.programs"))],
            compute=math.nan if compute is None else r.number(compute, f"{p}.compute"),
            bytes_accessed=math.nan if accessed is None else r.number(accessed, f"{p}.bytes_accessed"))

    if "ground_truth" in doc:
        b.ground_truth = _ground_truth(doc["ground_truth"], target, nsteps, r)
    profile = b.build(validate=False)
    profile.operations.phase = np.array(phases, np.int8)
    return profile.validate(r.source)


def _tile(value: Any, path: str, tiles: int, r: FieldReader) -> int:
    """A tile index, checked here so that the message names the field in the file."""
    tile = r.integer(value, path)
    if tile >= tiles:
        r.fail(path, f"a tile index in 0..{tiles - 1}", tile)
    return tile


def _quick_rows(items: list, kinds: tuple[type, ...], tiles: int) -> np.ndarray | None:
    """``items`` as an int64 array (a column per ``int`` kind) when every item is a list of exactly
    those kinds (``int`` exactly: no bool, no float) with tiles in range and counts >= 0 that int64
    holds; None otherwise, and ``_tile_pairs``/``_vertex_code`` check each item in turn to name the
    first bad one. A large profile has millions of these pairs: checked one by one they took most of
    reading its JSON."""
    width = len(kinds)
    if not items:
        return np.zeros((0, sum(k is int for k in kinds)), np.int64)
    if set(map(type, items)) != {list} or set(map(len, items)) != {width}:
        return None
    flat = list(itertools.chain.from_iterable(items))
    columns = []
    for k, kind in enumerate(kinds):
        column = flat[k::width]
        if set(map(type, column)) != {kind}:
            return None
        if kind is int:
            columns.append(column)
    try:
        rows = np.array(columns, np.int64).T
    except OverflowError:
        return None
    if rows.min() < 0 or rows[:, 0].max() >= tiles:
        return None
    return rows


def _tile_pairs(value: Any, path: str, tiles: int, r: FieldReader) -> np.ndarray:
    """[tile, bytes] pairs as an (n, 2) array."""
    items = r.list(value, path)
    quick = _quick_rows(items, (int, int), tiles)
    if quick is not None:
        return quick
    pairs = []
    for k, item in enumerate(items):
        if not isinstance(item, list) or len(item) != 2:
            r.fail(f"{path}[{k}]", "a [tile, bytes] pair", item)
        pairs.append((_tile(item[0], f"{path}[{k}][0]", tiles, r), r.integer(item[1], f"{path}[{k}][1]")))
    return np.array(pairs, np.int64).reshape(-1, 2)


def _vertex_code(value: Any, path: str, tiles: int, r: FieldReader) -> tuple[np.ndarray, list[str], np.ndarray]:
    """[tile, vertex type name, bytes] triples as (tiles, names, bytes)."""
    items = r.list(value, path)
    quick = _quick_rows(items, (int, str, int), tiles)
    if quick is not None:
        return quick[:, 0], [item[1] for item in items], quick[:, 1]
    rows = []
    for k, item in enumerate(items):
        if not isinstance(item, list) or len(item) != 3:
            r.fail(f"{path}[{k}]", "a [tile, vertex type name, bytes] triple", item)
        rows.append((_tile(item[0], f"{path}[{k}][0]", tiles, r), r.string(item[1], f"{path}[{k}][1]"),
                     r.integer(item[2], f"{path}[{k}][2]")))
    return (np.array([t for t, _, _ in rows], np.int64), [name for _, name, _ in rows],
            np.array([n for _, _, n in rows], np.int64))


def _per_tile(value: Any, path: str, tiles: int, r: FieldReader, per: str = "tile") -> np.ndarray:
    r.list(value, path)
    if len(value) != tiles:
        r.fail(path, f"{tiles} values (one per {per})", f"{len(value)} values")
    return np.array([r.integer(x, f"{path}[{k}]") for k, x in enumerate(value)], np.int64)


def _ground_truth(value: Any, target: Target, nsteps: int, r: FieldReader) -> GroundTruth:
    p = "ground_truth"
    r.mapping(value, p)
    r.known_keys(value, p, {"always_live", "not_always_live", "categories", "step_trace"})
    categories = {}
    for name, arr in r.mapping(value.get("categories", {}), f"{p}.categories").items():
        categories[name] = _per_tile(arr, f"{p}.categories.{name}", target.tiles, r)
    gt = GroundTruth(always_live=_per_tile(r.get(value, "always_live", p), f"{p}.always_live", target.tiles, r),
                     not_always_live=_per_tile(r.get(value, "not_always_live", p), f"{p}.not_always_live",
                                               target.tiles, r),
                     categories=categories)
    if "step_trace" in value:
        trace = r.mapping(value["step_trace"], f"{p}.step_trace")
        tiles = [r.integer(t, f"{p}.step_trace.tiles[{k}]") for k, t in
                 enumerate(r.list(r.get(trace, "tiles", f"{p}.step_trace"), f"{p}.step_trace.tiles"))]
        rows = r.list(r.get(trace, "bytes", f"{p}.step_trace"), f"{p}.step_trace.bytes")
        if len(rows) != len(tiles):
            r.fail(f"{p}.step_trace.bytes", f"{len(tiles)} rows (one per traced tile)", len(rows))
        gt.step_tiles = np.array(tiles, np.int64)
        gt.step_bytes = np.array([_per_tile(row, f"{p}.step_trace.bytes[{k}]", nsteps, r, per="step")
                                  for k, row in enumerate(rows)], np.int64).reshape(len(tiles), nsteps)
    return gt


# --------------------------------------------------------------------------------------------
# Writer

def profile_to_document(profile: Profile, lazy: bool = False) -> dict:
    """The full-form JSON document for ``profile`` (the inverse of ``profile_from_document``);
    with ``lazy``, programs and operations are iterators of records, made as they are read."""
    p = profile
    t = p.target
    target = {"name": t.name, "kind": t.kind, "tiles": t.tiles, "bytes_per_tile": t.bytes_per_tile}
    for key in ("clock_hz", "link_bytes_per_s", "flops_per_s", "memory_bytes_per_s"):
        if getattr(t, key) is not None:
            target[key] = getattr(t, key)
    if t.description:
        target["description"] = t.description
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "kind": "full", "name": p.info.name,
                           "description": p.info.description, "synthetic": p.info.synthetic,
                           "source": p.info.source, "compute_source": p.info.compute_source,
                           "warnings": list(p.info.warnings),
                           "target": target, "compute_unit": p.compute_unit, "steps": list(p.steps)}
    if p.info.layer_grouping is not None:
        doc["layer_grouping"] = grouping_record(p.info.layer_grouping)
    if p.info.parallel_layout is not None:
        doc["parallel_layout"] = layout_record(p.info.parallel_layout)
    if p.info.precision is not None:
        doc["precision"] = precision_record(p.info.precision)
    if p.info.batch_size is not None:
        doc["batch_size"] = p.info.batch_size
    v = p.variables
    intervals = p.liveness.intervals
    class_lists = [intervals[c].tolist() for c in range(len(intervals))]
    variables = []
    for i in range(len(v)):
        rec: dict[str, Any] = {}
        if v.name[i] >= 0:
            rec["name"] = p.names[v.name[i]]
        rec["bytes"] = int(v.bytes[i])
        rec["tile"] = int(v.tile[i])
        rec["live"] = "always" if v.always_live[i] else (class_lists[v.live_class[i]] if v.live_class[i] >= 0 else [])
        if v.role is not None:
            rec["role"] = ROLES[int(v.role[i])]
        variables.append(rec)
    doc["variables"] = variables

    doc["programs"] = _program_records(p.programs)
    doc["operations"] = _operation_records(p.operations)
    gt = p.ground_truth
    if gt is not None:
        g: dict[str, Any] = {"always_live": gt.always_live.tolist(), "not_always_live": gt.not_always_live.tolist(),
                             "categories": {k: a.tolist() for k, a in gt.categories.items()}}
        if len(gt.step_tiles):
            g["step_trace"] = {"tiles": gt.step_tiles.tolist(), "bytes": gt.step_bytes.tolist()}
        doc["ground_truth"] = g
    if not lazy:
        doc["programs"] = list(doc["programs"])
        doc["operations"] = list(doc["operations"])
    return doc


def _program_records(pr) -> Iterator[dict[str, Any]]:
    """One record per program, made one at a time (the per-tile code lists are the bulk of a
    large profile's document)."""
    n = len(pr)
    grouped = []
    for cat, costs in [("vertex_code", pr.vertex_code)] + list(pr.categories().items()):
        order = np.argsort(costs.program, kind="stable")
        grouped.append((cat, costs, order, np.searchsorted(costs.program[order], np.arange(n + 1))))
    for i in range(n):
        rec: dict[str, Any] = {"name": pr.name[i], "type": pr.kind[i]}
        if not math.isnan(pr.cycles[i]):
            rec["cycles"] = float(pr.cycles[i])
        if pr.vertices[i]:
            rec["vertices"] = int(pr.vertices[i])
        for cat, costs, order, offsets in grouped:
            k = order[offsets[i]:offsets[i + 1]]
            if not len(k):
                continue
            if cat == "vertex_code":
                types = pr.vertex_types
                rec[cat] = [[t, types[vt], b] for t, vt, b in zip(costs.tile[k].tolist(),
                                                                 costs.vertex_type[k].tolist(), costs.bytes[k].tolist())]
            else:
                rec[cat] = [[t, b] for t, b in zip(costs.tile[k].tolist(), costs.bytes[k].tolist())]
        yield rec


def _operation_records(ops) -> Iterator[dict[str, Any]]:
    for i in range(len(ops)):
        rec: dict[str, Any] = {"name": ops.name[i]}
        if ops.layer[i] is not None:
            rec["layer"] = ops.layer[i]
        if ops.debug_id[i] >= 0:
            rec["debug_id"] = int(ops.debug_id[i])
        if ops.inputs[i]:
            rec["inputs"] = list(ops.inputs[i])
        if ops.first_step[i] >= 0:
            rec["first_step"] = int(ops.first_step[i])
            rec["last_step"] = int(ops.last_step[i])
        rec["vars"] = ops.vars[i].tolist()
        rec["programs"] = ops.programs[i].tolist()
        if not math.isnan(ops.compute[i]):
            rec["compute"] = float(ops.compute[i])
        if not math.isnan(ops.bytes_accessed[i]):
            rec["bytes_accessed"] = float(ops.bytes_accessed[i])
        if ops.phase[i] != Phase.UNKNOWN:
            rec["phase"] = Phase(int(ops.phase[i])).label
        yield rec


def dumps_profile(profile: Profile) -> str:
    """JSON text with one record per line, so large profiles stay readable and diffable. Lists
    of records are written as they are made, never held whole as Python objects."""
    doc = profile_to_document(profile, lazy=True)
    out = io.StringIO()
    out.write("{\n")
    items = list(doc.items())
    for n, (key, value) in enumerate(items):
        comma = "," if n < len(items) - 1 else ""
        one_per_line = isinstance(value, Iterator) or (
            isinstance(value, list) and value and isinstance(value[0], (dict, list)) or key == "steps" and value)
        records = iter(value) if one_per_line else None
        first = next(records, None) if records is not None else None
        if first is None:
            out.write(f"  {json.dumps(key)}: {json.dumps([] if records is not None else value)}{comma}\n")
            continue
        assert records is not None          # a first record came from them
        out.write(f'  "{key}": [\n    {json.dumps(first, separators=(", ", ": "))}')
        for record in records:
            out.write(",\n    " + json.dumps(record, separators=(", ", ": ")))
        out.write(f"\n  ]{comma}\n")
    out.write("}\n")
    return out.getvalue()
