"""The compact columnar profile form (``.stagesplit``): the same content as the JSON format,
stored as compressed numpy arrays in a zip (``.npz`` layout), loaded with pickling disabled.

Large profiles (a million variables) load in about a second from this form, against minutes
for JSON. Strings are stored as one UTF-8 byte blob plus offsets, never as Python objects.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..common.fields import FieldReader
from ..common.fileio import atomic_output
from ..common.limits import EXPANSION_RATIO, MIN_EXPANDED_BYTES
from ..common.safeinput import InputFile, load_json
from ..errors import ProfileError
from .compactformat import (
    BOOL,
    DESCR,
    FLOAT64,
    FORMAT,
    INFO_KEYS,
    INFO_OPTIONAL_KEYS,
    INT,
    INT64,
    KIND_LETTER,
    VERSION,
    CompactWriter,
    column_for,
    header_bytes,
)
from .documents import (
    grouping_from_record,
    grouping_record,
    layout_from_record,
    layout_record,
    precision_from_record,
    precision_record,
)
from .profile import (
    ROLES,
    GroundTruth,
    Liveness,
    Operations,
    Phase,
    Profile,
    ProfileInfo,
    Programs,
    Ragged,
    Target,
    TileCosts,
    Variables,
    VertexCode,
    narrowest_int,
)

__all__ = ["profile_columns", "profile_header", "profile_to_arrays", "read_compact", "with_compact_field",
           "write_columns", "write_compact"]

# what a damaged zip member can raise while it is read (bad CRC, bad deflate stream, cut short, an
# unsupported or encrypted member); object arrays raise ValueError as pickling is disabled
_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError)


def _encode_strings(items: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [s.encode("utf-8", "surrogatepass") for s in items]     # lone surrogates (JSON escapes) kept
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets


def profile_header(p: Profile) -> bytes:
    """The ``header`` array of ``p``'s compact file."""
    t = p.target
    gt = p.ground_truth
    target = {"name": t.name, "kind": t.kind, "tiles": t.tiles, "bytes_per_tile": t.bytes_per_tile,
              "clock_hz": t.clock_hz, "link_bytes_per_s": t.link_bytes_per_s, "flops_per_s": t.flops_per_s,
              "memory_bytes_per_s": t.memory_bytes_per_s, "description": t.description}
    info = {"name": p.info.name, "source": p.info.source, "description": p.info.description,
            "synthetic": p.info.synthetic, "compute_source": p.info.compute_source, "warnings": list(p.info.warnings)}
    if p.info.layer_grouping is not None:          # optional: the grouping the source used
        info["layer_grouping"] = grouping_record(p.info.layer_grouping)
    if p.info.parallel_layout is not None:         # optional: the parallel layout of a captured rank
        info["parallel_layout"] = layout_record(p.info.parallel_layout)
    if p.info.precision is not None:               # optional: the precision a capture ran in
        info["precision"] = precision_record(p.info.precision)
    if p.info.batch_size is not None:              # optional: the samples per batch a capture ran
        info["batch_size"] = p.info.batch_size
    return header_bytes(target, p.compute_unit, info, list(gt.categories) if gt is not None else None)


def profile_columns(p: Profile, costs: Mapping[str, Any] | None = None) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` for every array of ``p``'s compact file, in the format's order: the
    header as bytes, a string table (``name`` without ``_blob``/``_offsets``) as a list of
    strings, anything else as a numpy array as the profile holds it (the writer stores it as
    the format says). ``costs`` replaces the per-program cost arrays (``vertex_code_*`` and the
    three categories' ``*_program``/``*_tile``/``*_bytes``) by name, for a writer that streams
    them from elsewhere (``Spill`` columns)."""
    ops = p.operations
    gt = p.ground_truth
    v = p.variables
    pr = p.programs
    yield "header", profile_header(p)
    yield "steps", p.steps
    yield "names", p.names
    yield from (("var_bytes", v.bytes), ("var_tile", v.tile), ("var_always_live", v.always_live),
                ("var_live_class", v.live_class), ("var_name", v.name),
                ("live_offsets", p.liveness.intervals.offsets),
                ("live_intervals", p.liveness.intervals.values.reshape(-1, 2)))
    yield from (("program_name", pr.name), ("program_kind", pr.kind), ("vertex_types", pr.vertex_types),
                ("program_cycles", pr.cycles), ("program_vertices", pr.vertices))
    vc = pr.vertex_code
    held = [("vertex_code_program", vc.program), ("vertex_code_tile", vc.tile), ("vertex_code_type", vc.vertex_type),
            ("vertex_code_bytes", vc.bytes)]
    for cat, tile_costs in pr.categories().items():
        held += [(f"{cat}_program", tile_costs.program), (f"{cat}_tile", tile_costs.tile), (f"{cat}_bytes", tile_costs.bytes)]
    for name, values in held:
        yield name, (values if costs is None else costs[name])
    yield "op_name", ops.name
    yield "op_layer", [l or "" for l in ops.layer]
    yield "op_has_layer", np.array([l is not None for l in ops.layer], bool)
    yield "op_inputs", [x for row in ops.inputs for x in row]
    yield from (("op_inputs_count", np.array([len(row) for row in ops.inputs], np.int64)),
                ("op_debug_id", ops.debug_id), ("op_first_step", ops.first_step), ("op_last_step", ops.last_step),
                ("op_compute", ops.compute), ("op_vars_offsets", ops.vars.offsets), ("op_vars", ops.vars.values),
                ("op_programs_offsets", ops.programs.offsets), ("op_programs", ops.programs.values))
    if np.any(np.isfinite(ops.bytes_accessed)):      # optional: files without it load as unknown (NaN)
        yield "op_bytes_accessed", ops.bytes_accessed
    if np.any(ops.phase != Phase.UNKNOWN):            # optional: files without it load as all UNKNOWN
        yield "op_phase", ops.phase
    if v.role is not None:                             # optional: files without it load with roles not recorded
        yield "var_role", v.role
    if gt is not None:
        yield from (("gt_always_live", gt.always_live), ("gt_not_always_live", gt.not_always_live),
                    ("gt_step_tiles", gt.step_tiles), ("gt_step_bytes", gt.step_bytes))
        for k, values in enumerate(gt.categories.values()):
            yield f"gt_category_{k}", values


def _stored(name: str, values: np.ndarray) -> np.ndarray:
    """``values`` in the type the format stores array ``name`` in."""
    kind = column_for(name).kind
    if kind == INT:
        return narrowest_int(values)
    return np.asarray(values).astype(DESCR[{INT64: "int64", FLOAT64: "float64", BOOL: "bool"}[kind]])


def profile_to_arrays(p: Profile) -> dict[str, np.ndarray]:
    """Every array of ``p``'s compact file, as stored (``np.savez_compressed(**arrays)`` writes
    the same file as ``write_compact``)."""
    arrays: dict[str, np.ndarray] = {}
    for name, value in profile_columns(p):
        if name == "header":
            arrays[name] = np.frombuffer(value, np.uint8).copy()
        elif column_for(name) is None:                   # a string table
            arrays[f"{name}_blob"], arrays[f"{name}_offsets"] = _encode_strings(value)
        else:
            arrays[name] = _stored(name, value)
    return arrays


def write_columns(writer: CompactWriter, columns: Iterable[tuple[str, Any]]) -> None:
    """Write ``profile_columns``-style items (numpy values, Spills) with ``writer``."""
    for name, value in columns:
        if name == "header":
            writer.raw_bytes(name, value)
        elif column_for(name) is None:
            writer.strings(name, value)
        else:
            writer.values(name, value)


def write_compact(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` as a compact file, atomically, array by array (no copy of the whole
    file in memory)."""
    with atomic_output(Path(path)) as handle:
        writer = CompactWriter(handle)
        write_columns(writer, profile_columns(profile))
        writer.close()


class _Arrays:
    """Typed access to the arrays of one compact file, naming the array on bad content."""

    def __init__(self, data: Any, source: str):
        self.data = data
        self.source = source

    def get(self, key: str, *, narrow: bool = False) -> np.ndarray:
        """The array ``key``, of the kind and dimensions the format gives it; integers widened to
        int64 (kept as stored, at most int32, with ``narrow``: the per-program code arrays are
        the bulk of a large profile, and their users widen before any arithmetic that could
        overflow)."""
        column = column_for(key)
        kind, ndim = KIND_LETTER[column.kind], column.ndim
        if key not in self.data.files:
            raise ProfileError(self.source, key, "this array in a stagesplit compact profile (file incomplete)")
        try:
            a = self.data[key]
        except _READ_ERRORS as exc:
            raise ProfileError(self.source, key, "a readable numpy array", str(exc)) from None
        if not isinstance(a, np.ndarray):    # a member stored without the .npy suffix: raw bytes
            raise ProfileError(self.source, key, "a readable numpy array", "a member that is not a .npy array")
        if a.dtype.kind not in kind or a.ndim != ndim:
            raise ProfileError(self.source, key, f"a {ndim}-d array of kind '{kind}'", f"{a.dtype} with {a.ndim} dims")
        if kind == "i":
            if narrow and a.dtype.itemsize <= 4:
                return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))
            return a.astype(np.int64)
        return a

    def strings(self, key: str) -> list[str]:
        blob = self.get(f"{key}_blob")
        offsets = self.get(f"{key}_offsets")
        if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(blob) or np.any(np.diff(offsets) < 0):
            raise ProfileError(self.source, f"{key}_offsets", "non-decreasing offsets from 0 to the blob's length")
        try:
            text = blob.tobytes().decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise ProfileError(self.source, f"{key}_blob", "UTF-8 text") from None
        if len(text) == len(blob):           # pure ASCII: byte offsets are character offsets
            return [text[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        raw = blob.tobytes()
        try:
            return [raw[offsets[i]:offsets[i + 1]].decode("utf-8", "surrogatepass") for i in range(len(offsets) - 1)]
        except UnicodeDecodeError:         # an offset inside a character
            raise ProfileError(self.source, f"{key}_offsets", "offsets at UTF-8 character boundaries") from None

    def ragged(self, offsets_key: str, values_key: str, rows: int) -> Ragged:
        offsets = self.get(offsets_key)
        values = self.get(values_key)
        if len(offsets) != rows + 1 or offsets[0] != 0 or offsets[-1] != len(values) or np.any(np.diff(offsets) < 0):
            raise ProfileError(self.source, offsets_key, f"{rows + 1} non-decreasing offsets ending at {len(values)}")
        return Ragged(offsets, values)


def _roles(a: _Arrays, nvars: int) -> np.ndarray | None:
    """``var_role`` (optional: absent in files written before roles existed, which load with none)."""
    if "var_role" not in a.data.files:
        return None
    role = a.get("var_role")
    if len(role) != nvars:
        raise ProfileError(a.source, "var_role", f"{nvars} entries (one per variable)", len(role))
    if len(role) and (role.min() < 0 or role.max() >= len(ROLES)):
        bad = int(np.flatnonzero((role < 0) | (role >= len(ROLES)))[0])
        raise ProfileError(a.source, f"var_role[{bad}]", f"a role in 0..{len(ROLES) - 1}", int(role[bad]))
    return role.astype(np.int8)


def _phases(a: _Arrays, nops: int) -> np.ndarray:
    """``op_phase`` (optional: absent in files written before it existed, which load as all UNKNOWN)."""
    if "op_phase" not in a.data.files:
        return np.full(nops, Phase.UNKNOWN, np.int8)
    phase = a.get("op_phase")
    if len(phase) != nops:
        raise ProfileError(a.source, "op_phase", f"{nops} entries (one per operation)", len(phase))
    if len(phase) and (phase.min() < min(Phase) or phase.max() > max(Phase)):
        bad = int(np.flatnonzero((phase < min(Phase)) | (phase > max(Phase)))[0])
        raise ProfileError(a.source, f"op_phase[{bad}]", f"a phase in {int(min(Phase))}..{int(max(Phase))}",
                           int(phase[bad]))
    return phase.astype(np.int8)


def _check_members(raw: bytes, source: str) -> None:
    """Refuse a zip whose members would expand past the budget, or whose .npy headers promise
    more (or other) data than the member holds, before any array is allocated: a few
    kilobytes of zip can otherwise expand to gigabytes or ask numpy for terabytes."""
    budget = max(MIN_EXPANDED_BYTES, EXPANSION_RATIO * len(raw))
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            members = zf.infolist()
            total = sum(m.file_size for m in members)
            if total > budget:
                raise ProfileError(source, "", f"a compact profile expanding to at most {budget:,} bytes "
                                   f"(max({MIN_EXPANDED_BYTES:,}, {EXPANSION_RATIO} x the file's size)); its arrays "
                                   f"declare {total:,} bytes")
            for m in members:
                if not m.filename.endswith(".npy"):
                    continue                # never read as an array (a missing array is named later)
                key = m.filename.removesuffix(".npy")
                try:
                    with zf.open(m) as fp:
                        version = np.lib.format.read_magic(fp)
                        if version == (1, 0):
                            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
                        elif version == (2, 0):
                            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
                        else:
                            raise ValueError(f".npy format version {version}")
                        header = fp.tell()
                except _READ_ERRORS as exc:
                    raise ProfileError(source, key, "a readable numpy array", str(exc)) from None
                if dtype.hasobject:
                    raise ProfileError(source, key, "a readable numpy array",
                                       "an array of Python objects (pickles are never loaded)")
                count = 1
                for n in shape:
                    count *= int(n)
                if header + count * dtype.itemsize != m.file_size:
                    raise ProfileError(source, key, "a readable numpy array",
                                       f"a header promising {count * dtype.itemsize:,} bytes of data where the "
                                       f"file holds {max(m.file_size - header, 0):,}")
    except ProfileError:
        raise
    except _READ_ERRORS as exc:
        raise ProfileError(source, "", "a stagesplit compact profile (a zip of numpy arrays)", str(exc)) from None


def read_compact(path: str | Path, raw: bytes | None = None) -> Profile:
    """Read a compact profile from ``path`` (opened once), or from its bytes ``raw``."""
    path = Path(path)
    source = str(path)
    if raw is None:
        with InputFile(path, "profile") as f:
            raw = f.read_all(None)
    _check_members(raw, source)
    try:
        data = np.load(io.BytesIO(raw), allow_pickle=False)
    except _READ_ERRORS as exc:
        raise ProfileError(source, "", "a stagesplit compact profile (a zip of numpy arrays)", str(exc)) from None
    with data:
        arrays = _Arrays(data, source)
        try:
            return _read(arrays)
        except ProfileError as exc:
            raise with_compact_field(exc, arrays) from None


def with_compact_field(exc: ProfileError, arrays: _Arrays | None = None,
                       categories: list[str] | None = None) -> ProfileError:
    """``exc`` (naming a field as the JSON form does, ``variables[3].bytes``) with the compact
    array and index that hold that field added: ``... (stored in var_bytes[3])``. ``categories``:
    the ground-truth category names in stored order (``gt_category_K``)."""
    stored = _compact_field(exc.field, arrays)
    if stored is None and categories and exc.field.startswith("ground_truth.categories."):
        name, _, index = exc.field.removeprefix("ground_truth.categories.").rpartition("[")
        if name in categories:
            stored = f"gt_category_{categories.index(name)}[{index}"
    if stored is None:
        return exc
    return ProfileError(exc.file, exc.field, f"{exc.expected} (stored in {stored})", exc.got)


def _read(a: _Arrays) -> Profile:
    raw_header = a.get("header").tobytes()
    try:
        header = load_json(raw_header.decode("utf-8"), a.source)
    except UnicodeDecodeError as exc:
        raise ProfileError(a.source, "header", f"a JSON header (UTF-8 text; byte {exc.start} is not)") from None
    except ProfileError as exc:          # keep the field (or line and column) inside the header
        if exc.field.startswith(("line ", "document")):
            raise ProfileError(a.source, "header", f"a JSON header ({exc.field}: {exc.expected})", exc.got) from None
        raise ProfileError(a.source, f"header.{exc.field}", exc.expected, exc.got) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ProfileError(a.source, "header.format", f'"{FORMAT}"', header.get("format") if isinstance(header, dict) else header)
    if header.get("version") != VERSION:
        raise ProfileError(a.source, "header.version", f"{VERSION} (this stagesplit reads compact version {VERSION})",
                           header.get("version"))
    from .targets import target_from_mapping
    r = FieldReader(a.source)
    tspec = {k: v for k, v in r.mapping(header.get("target"), "header.target").items() if v is not None}
    target: Target = target_from_mapping(str(tspec.get("name", "target")), tspec, a.source, "header.target")
    info_spec = r.mapping(header.get("info", {}), "header.info")
    r.known_keys(info_spec, "header.info", set(INFO_KEYS) | set(INFO_OPTIONAL_KEYS))
    info = ProfileInfo(**{k: r.string(info_spec.get(k, ""), f"header.info.{k}")
                          for k in ("name", "source", "description", "compute_source")},
                       synthetic=r.boolean(info_spec.get("synthetic", False), "header.info.synthetic"),
                       warnings=[r.string(w, f"header.info.warnings[{i}]")
                                 for i, w in enumerate(r.list(info_spec.get("warnings", []), "header.info.warnings"))],
                       layer_grouping=(grouping_from_record(info_spec["layer_grouping"], r, "header.info.layer_grouping")
                                       if info_spec.get("layer_grouping") is not None else None),
                       parallel_layout=(layout_from_record(info_spec["parallel_layout"], r,
                                                           "header.info.parallel_layout")
                                        if info_spec.get("parallel_layout") is not None else None),
                       precision=(precision_from_record(info_spec["precision"], r, "header.info.precision")
                                  if info_spec.get("precision") is not None else None),
                       batch_size=(r.integer(info_spec["batch_size"], "header.info.batch_size", 1)
                                   if info_spec.get("batch_size") is not None else None))
    compute_unit = r.string(header.get("compute_unit", "cycles"), "header.compute_unit")

    steps = a.strings("steps")
    names = a.strings("names")
    nvars = len(a.get("var_bytes"))
    live_offsets = a.get("live_offsets")
    intervals = a.get("live_intervals")
    if intervals.shape[1:] != (2,) or len(live_offsets) < 1 or live_offsets[-1] != len(intervals):
        raise ProfileError(a.source, "live_intervals", "(K, 2) start/end pairs matching live_offsets")
    if live_offsets[0] != 0 or np.any(np.diff(live_offsets) < 0):
        raise ProfileError(a.source, "live_offsets", "non-decreasing offsets from 0")
    variables = Variables(bytes=a.get("var_bytes"), tile=a.get("var_tile"),
                          always_live=a.get("var_always_live"), live_class=a.get("var_live_class"),
                          name=a.get("var_name"))
    if any(len(x) != nvars for x in (variables.tile, variables.always_live, variables.live_class, variables.name)):
        raise ProfileError(a.source, "var_*", f"{nvars} entries in every variable array")
    variables.role = _roles(a, nvars)

    def costs(cat: str) -> TileCosts:
        return TileCosts(a.get(f"{cat}_program", narrow=True), a.get(f"{cat}_tile", narrow=True),
                         a.get(f"{cat}_bytes", narrow=True))

    prog_names = a.strings("program_name")
    vc = VertexCode(a.get("vertex_code_program", narrow=True), a.get("vertex_code_tile", narrow=True),
                    a.get("vertex_code_type", narrow=True), a.get("vertex_code_bytes", narrow=True))
    if len({len(vc.program), len(vc.tile), len(vc.vertex_type), len(vc.bytes)}) != 1:
        raise ProfileError(a.source, "vertex_code_*", "arrays of equal length")
    programs = Programs(name=prog_names, kind=a.strings("program_kind"), cycles=a.get("program_cycles"),
                        vertices=a.get("program_vertices"), vertex_types=a.strings("vertex_types"), vertex_code=vc,
                        vertex_state=costs("vertex_state"), exchange_code=costs("exchange_code"),
                        control_code=costs("control_code"))
    for cat, c in programs.categories().items():
        if not len(c.program) == len(c.tile) == len(c.bytes):
            raise ProfileError(a.source, f"{cat}_*", "arrays of equal length")

    op_names = a.strings("op_name")
    nops = len(op_names)
    layer_names = a.strings("op_layer")
    has_layer = a.get("op_has_layer")
    counts = a.get("op_inputs_count")
    flat_inputs = a.strings("op_inputs")
    if len(layer_names) != nops or len(has_layer) != nops or len(counts) != nops:
        raise ProfileError(a.source, "op_*", f"{nops} entries in every operation array")
    if len(counts) and (counts.min() < 0 or counts.sum() != len(flat_inputs)):
        raise ProfileError(a.source, "op_inputs_count", f"counts >= 0 summing to {len(flat_inputs)} (the number "
                           "of op_inputs strings)", int(counts.min()) if counts.min() < 0 else int(counts.sum()))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    operations = Operations(
        name=op_names, debug_id=a.get("op_debug_id"),
        inputs=[tuple(flat_inputs[bounds[i]:bounds[i + 1]]) for i in range(nops)],
        first_step=a.get("op_first_step"), last_step=a.get("op_last_step"), compute=a.get("op_compute"),
        vars=a.ragged("op_vars_offsets", "op_vars", nops), programs=a.ragged("op_programs_offsets", "op_programs", nops),
        layer=[name if has else None for name, has in zip(layer_names, has_layer)],
        bytes_accessed=(a.get("op_bytes_accessed") if "op_bytes_accessed" in a.data.files
                        else np.full(nops, np.nan)),
        phase=_phases(a, nops))

    ground_truth = None
    categories = header.get("ground_truth_categories")
    if categories is not None:
        categories = [r.string(c, f"header.ground_truth_categories[{k}]")
                      for k, c in enumerate(r.list(categories, "header.ground_truth_categories"))]
        ground_truth = GroundTruth(
            always_live=a.get("gt_always_live"), not_always_live=a.get("gt_not_always_live"),
            categories={name: a.get(f"gt_category_{k}") for k, name in enumerate(categories)},
            step_tiles=a.get("gt_step_tiles"), step_bytes=a.get("gt_step_bytes"))
    profile = Profile(target=target, steps=steps, names=names, variables=variables,
                      liveness=Liveness(Ragged(live_offsets, intervals)), programs=programs, operations=operations,
                      compute_unit=compute_unit, ground_truth=ground_truth, info=info)
    return profile.validate(a.source)


# a field path of the JSON form (what Profile.validate and the limits name) -> the compact array
_ARRAY_OF = {"variables": {"bytes": "var_bytes", "tile": "var_tile", "live": "var_live_class", "name": "var_name",
                           "role": "var_role"},
             "operations": {"first_step": "op_first_step", "last_step": "op_last_step", "compute": "op_compute",
                            "bytes_accessed": "op_bytes_accessed", "debug_id": "op_debug_id"}}


def _compact_field(field: str, a: _Arrays | None) -> str | None:
    """Where the field ``variables[3].bytes`` (as Profile.validate and the limits name it) is
    stored in a compact file: ``var_bytes[3]``; None for a field named as stored already."""
    import re
    m = re.fullmatch(r"(variables|operations)\[(\d+)\]\.(\w+)", field)
    if m and m.group(3) in _ARRAY_OF[m.group(1)]:
        return f"{_ARRAY_OF[m.group(1)][m.group(3)]}[{m.group(2)}]"
    m = re.fullmatch(r"(liveness|operations)\[(\d+)\]\.(intervals|vars|programs)\[(\d+)\]", field)
    if m:
        key = {"intervals": "live", "vars": "op_vars", "programs": "op_programs"}[m.group(3)]
        if a is None:
            return None
        try:
            flat = int(a.data[f"{key}_offsets"][int(m.group(2))]) + int(m.group(4))
        except (*_READ_ERRORS, IndexError, KeyError):
            return None
        return f"{'live_intervals' if key == 'live' else key}[{flat}]"
    m = re.fullmatch(r"programs\.(\w+)\[(\d+)\]\.(program|tile|bytes|vertex_type)", field)
    if m:
        return f"{m.group(1)}_{'type' if m.group(3) == 'vertex_type' else m.group(3)}[{m.group(2)}]"
    m = re.fullmatch(r"programs\[(\d+)\]\.(\w+)\[(\d+)\]\[\d\]", field)
    if m:
        return f"{m.group(2)}_bytes, entry {m.group(3)} of program {m.group(1)}"
    m = re.fullmatch(r"programs\[(\d+)\]\.(cycles|vertices)", field)
    if m:
        return f"program_{m.group(2)}[{m.group(1)}]"
    m = re.fullmatch(r"ground_truth\.(always_live|not_always_live|step_trace\.tiles|step_trace\.bytes)(\[.*)?", field)
    if m:
        key = {"always_live": "gt_always_live", "not_always_live": "gt_not_always_live",
               "step_trace.tiles": "gt_step_tiles", "step_trace.bytes": "gt_step_bytes"}[m.group(1)]
        return f"{key}{m.group(2) or ''}"
    if field.startswith("target."):
        return f"header.{field}"
    return None
