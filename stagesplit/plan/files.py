"""Plan files: the versioned JSON (or YAML) document, written atomically and read back with
every field checked (a hand-edited or hostile plan fails in one line naming the file and the
field), and the readers of version-1 and version-2 plans.

Version 2 records the request once (``request``, the options record's own fields) and what it
resolved to on the profile (``resolved``: the micro-batch count chosen, capacities, pins as
layer indices, each position's target). Everything but ``run`` is a function of the inputs.

Version 3 speaks the device's words: a GPU plan (a one-tile profile) names the device's memory
``profile.device_bytes`` and each stage's ``peak_bytes`` and ``memory`` (weights, gradients and
optimizer state; activations and temporaries; stashed activations), and leaves out what only an
IPU has (the worst tile, and vertex code, vertex state and exchange code, which are zero on a
GPU). An IPU plan keeps version 2's words. Version 1 and 2 plans, GPU ones included, are read
with the old names. The in-memory records (``StagePlan``) keep one set of names for both.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..common.fields import FieldReader
from ..common.fileio import atomic_write_text
from ..common.limits import MAX_MICRO_BATCHES, MAX_PLAN_FIGURE
from ..common.safeinput import read_document
from ..common.text import show
from ..errors import StagesplitError
from ..io.profile import AUTOCAST_DTYPES, PARAMETER_DTYPES, Target
from ..io.targets import known_targets, target_from_mapping, target_record
from ..model.stagememory import MemoryBreakdown
from ..model.tied import TiedParameter
from ..model.traffic import WideTensor
from ..solver.problem import SolveOptions
from ..solver.request import SolveRequest
from ..solver.runtime_reserve import Communicator, RuntimeReserve
from ..solver.schedule_kinds import ScheduleKind
from .records import (
    MEMORY_KEYS,
    PhaseRecord,
    Plan,
    PlanInputs,
    PlanProfile,
    PlanRun,
    PlanVariant,
    RankRecord,
    RuntimeConditions,
    ScheduleCandidate,
    ScheduleRecord,
    StagePlan,
)

__all__ = ["FORMAT", "GPU_MEMORY_WORDS", "VERSION", "plan_document", "read_plan", "write_plan"]

FORMAT = "stagesplit-plan"
VERSION = 3
#: the versions this reader accepts
READABLE = (1, 2, 3)
#: from this version on a GPU plan uses GPU words (``peak_bytes``, ``memory``, ``device_bytes``)
GPU_WORDS_VERSION = 3
#: a GPU plan's memory categories: the breakdown's field -> the word a GPU plan writes
GPU_MEMORY_WORDS = {"always_live": "weights_gradients_optimizer_state",
                    "not_always_live": "activations_and_temporaries",
                    "stashed_copies": "stashed_activations"}
#: the categories only an IPU has; a GPU plan writes one only where it is not zero (a one-tile
#: profile that records IPU code), so that reading it back loses nothing
IPU_ONLY_MEMORY = ("vertex_code", "vertex_state", "exchange_code", "control_code")
#: the stage fields that name a tile (an IPU plan's, and version 1 and 2 GPU plans')
IPU_STAGE_FIELDS = ("worst_tile", "worst_tile_bytes", "memory_at_worst_tile", "memory_total")
#: the stage fields a version-3 GPU plan writes in their place
GPU_STAGE_FIELDS = ("peak_bytes", "memory")


# -- writing ------------------------------------------------------------------------------------


def _figure(r: FieldReader, value: Any, path: str) -> float:
    """A time or compute figure of the plan: a number in 0..MAX_PLAN_FIGURE (see limits.py)."""
    number = r.number(value, path)
    if number > MAX_PLAN_FIGURE:
        r.fail(path, f"a number in 0..{MAX_PLAN_FIGURE:g}", value)
    return number

def _record_dict(value: Any) -> Any:
    """``dataclasses.asdict`` for the plan file: records become dicts, lists, tuples and dicts are
    rebuilt, and every other value is taken as it is rather than deep-copied (the document is only
    written out; a plan's copying its several thousand numbers and strings one by one cost a small
    solve 10 ms)."""
    if hasattr(type(value), "__dataclass_fields__"):
        return {f.name: _record_dict(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        items = [_record_dict(v) for v in value]
        if hasattr(value, "_fields"):                        # a named tuple, as asdict rebuilds one
            return type(value)(*items)
        return type(value)(items)
    if isinstance(value, dict):
        return {_record_dict(k): _record_dict(v) for k, v in value.items()}
    return value


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as the JSON/YAML document ``write_plan`` writes."""
    o = plan.inputs.options
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "profile": _profile_document(plan.profile),
           "request": plan.inputs.request.to_record(),
           "resolved": {"micro_batches": o.micro_batches, "micro_batches_auto": o.micro_batches_auto,
                        "capacities": list(o.capacities) if o.capacities else None,
                        "pinned_splits": list(o.pinned_splits), "pinned_layers": [list(x) for x in o.pinned_layers],
                        "link_bytes_per_s": o.link_bytes_per_s,
                        "targets": [target_record(t) for t in plan.inputs.targets],
                        "layer_compute_sha256": plan.inputs.layer_compute_sha256},
           "layers": plan.layer_names, "devices": plan.devices, "method": plan.method, "status": plan.status,
           "feasible": plan.feasible, "message": plan.message, "split": plan.split_text,
           "compute_unit": plan.compute_unit, "module_paths": plan.module_paths, "notes": plan.notes,
           "tied_parameters": [{"name": t.name, "layers": list(t.layers)} for t in plan.tied],
           "wide_tensors": [{"name": w.name, "first_layer": w.first, "last_layer": w.last} for w in plan.wide_tensors],
           "schedule": None if plan.schedule is None else _schedule_document(plan.schedule),
           "schedule_candidates": [_record_dict(c) for c in plan.candidates],
           "variants": [_record_dict(v) for v in plan.variants],
           "objective": [p.document() for p in plan.phases],
           "bottleneck_stage": plan.bottleneck.stage if plan.bottleneck else None,
           "stages": [], "run": {**_record_dict(plan.run), "phase_seconds": list(plan.run.phase_seconds),
                                 "versions": dict(plan.run.versions)}}
    if plan.inputs.runtime_reserve is not None:
        doc["resolved"]["runtime_reserve"] = _reserve_document(plan.inputs.runtime_reserve)
    if plan.inputs.micro_batch_size is not None:
        doc["resolved"]["micro_batch_size"] = plan.inputs.micro_batch_size
        doc["resolved"]["global_batch"] = plan.inputs.global_batch
    for s in plan.stages:
        rec = _record_dict(s)
        rec["recompute"] = list(s.recompute)
        rec["headroom_bytes"] = s.headroom_bytes
        rec["headroom"] = round(s.headroom, 6)
        doc["stages"].append(_gpu_stage(rec, s) if plan.profile.one_tile else rec)
    return doc


def _reserve_document(kept: RuntimeReserve) -> dict[str, Any]:
    """What the plan keeps back on every device, itemised (``_reserve`` reads it back)."""
    doc: dict[str, Any] = _record_dict(kept)
    doc["communicators"] = [_record_dict(c) for c in kept.communicators]
    doc["retry_bytes"] = list(kept.retry_bytes)
    return doc


def _reserve(r: FieldReader, value: Any, path: str, devices: int) -> RuntimeReserve:
    """A plan's record of what it keeps back (``_reserve_document``), every field checked."""
    doc = r.mapping(value, path)
    names = {f.name for f in fields(RuntimeReserve)}
    r.known_keys(doc, path, names)
    comms = []
    for i, c in enumerate(r.list(doc.get("communicators", []), f"{path}.communicators")):
        at = f"{path}.communicators[{i}]"
        c = r.mapping(c, at)
        r.known_keys(c, at, {f.name for f in fields(Communicator)})
        comms.append(Communicator(name=r.string(r.get(c, "name", at), f"{at}.name"),
                                  ranks=r.integer(r.get(c, "ranks", at), f"{at}.ranks", minimum=2),
                                  peers=r.integer(r.get(c, "peers", at), f"{at}.peers", minimum=1),
                                  channels=r.integer(r.get(c, "channels", at), f"{at}.channels", minimum=1),
                                  connection_bytes=r.integer(r.get(c, "connection_bytes", at),
                                                             f"{at}.connection_bytes")))
    retry = tuple(r.integer(x, f"{path}.retry_bytes[{i}]")
                  for i, x in enumerate(r.list(doc.get("retry_bytes", []), f"{path}.retry_bytes")))
    if retry and len(retry) != devices:
        r.fail(f"{path}.retry_bytes", f"one byte count per device ({devices})", f"{len(retry)} entries")
    return RuntimeReserve(setting=r.choice(doc.get("setting", "auto"), f"{path}.setting", ("auto", "off", "given")),
                          cuda_context_bytes=r.integer(doc.get("cuda_context_bytes", 0), f"{path}.cuda_context_bytes"),
                          communicators=tuple(comms),
                          given_bytes=r.integer(doc.get("given_bytes", 0), f"{path}.given_bytes"),
                          source=r.string(doc.get("source", ""), f"{path}.source"), retry_bytes=retry,
                          nccl_channels=r.integer(doc.get("nccl_channels", 0), f"{path}.nccl_channels"))


def _profile_document(profile: PlanProfile) -> dict[str, Any]:
    """The profile section: a GPU's memory is ``device_bytes`` (no tiles)."""
    doc: dict[str, Any] = _record_dict(profile)
    if profile.tensor_parallel == 1:                 # a plan of one device per stage writes what it always did
        del doc["tensor_parallel"], doc["sequence_parallel"], doc["tensor_parallel_styles"]
    else:
        doc["tensor_parallel_styles"] = [list(pair) for pair in profile.tensor_parallel_styles]
    if profile.sequence_parallel_additions:
        doc["sequence_parallel_additions"] = [list(pair) for pair in profile.sequence_parallel_additions]
    else:                                            # written only where sequence parallelism added something
        del doc["sequence_parallel_additions"]
    if profile.context_parallel == 1:                # written only where set: other plans' files unchanged
        del doc["context_parallel"]
    if profile.expert_parallel == 1:
        del doc["expert_parallel"]
    if not profile.parameter_dtype:                  # a profile that records no precision
        del doc["parameter_dtype"], doc["autocast_dtype"], doc["master_weights"]
    else:
        if not profile.autocast_dtype:
            del doc["autocast_dtype"]
        if not profile.master_weights:
            del doc["master_weights"]
    if profile.one_tile:
        doc = {("device_bytes" if k == "bytes_per_tile" else k): v for k, v in doc.items() if k != "tiles"}
    return doc


def _gpu_stage(rec: dict[str, Any], stage: StagePlan) -> dict[str, Any]:
    """A GPU stage's record in GPU words: ``peak_bytes`` for the worst tile's bytes (the device
    is one pool, so the worst tile is the device and the sum over tiles is the same breakdown)
    and one ``memory`` breakdown in place of the two."""
    memory = stage.memory_at_worst_tile
    words = {GPU_MEMORY_WORDS[k]: getattr(memory, k) for k in GPU_MEMORY_WORDS}
    words.update({k: getattr(memory, k) for k in IPU_ONLY_MEMORY if getattr(memory, k)})
    out: dict[str, Any] = {}
    for key, value in rec.items():
        if key == "worst_tile_bytes":
            out["peak_bytes"] = value
        elif key == "memory_at_worst_tile":
            out["memory"] = words
        elif key not in IPU_STAGE_FIELDS:
            out[key] = value
    return out


def write_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` atomically as JSON, or YAML for a .yaml/.yml path."""
    path = Path(path)
    doc = plan_document(plan)
    if path.suffix in (".yaml", ".yml"):
        import yaml  # only here: a solve that writes JSON need not import PyYAML
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    else:
        text = json.dumps(doc, indent=1) + "\n"
    atomic_write_text(path, text)


# -- reading ------------------------------------------------------------------------------------

#: what a file that is not a plan is, by its first bytes
_KNOWN_BINARY = ((b"PK\x03\x04", "a zip archive, as a compact stagesplit profile (.stagesplit, .npz) is"),
                 (b"SQLite format 3\x00", "an SQLite database, as a PopVision profile.pop is"),
                 (b"\x08", "binary data (an ONNX model or another protobuf?)"))


def _not_a_profile(path: Path) -> None:
    """Refuse, saying what it is, a file that is recognisably not a plan (a profile above all)."""
    try:
        if not path.is_file():              # a folder, a device, a FIFO (opening it would block)
            return                          # read_document says why it cannot be read
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return
    for magic, what in _KNOWN_BINARY:
        if head.startswith(magic):
            hint = (f"; a profile? make a plan from it with stagesplit solve {show(str(path))} --devices N --out "
                    "plan.json" if magic == b"PK\x03\x04" else "")
            raise StagesplitError(f"{show(str(path))} is not a plan: it is {what}{hint}")


def read_plan(path: str | Path) -> Plan:
    """Read a plan file (version 1, 2 or 3), checking every field; a bad one raises
    ``ProfileError`` naming the file and the field (``request.devices``, ``stages[2].layers``)."""
    path = Path(path)
    _not_a_profile(path)
    doc = read_document(path, "plan")       # opened once, size-capped, strict JSON / safe YAML
    r = FieldReader(str(path))
    r.mapping(doc, "document")
    if doc.get("format") == "stagesplit-profile":
        raise StagesplitError(f"{show(str(path))} is a stagesplit profile (format \"stagesplit-profile\"), not a plan: "
                              f"make a plan from it first with stagesplit solve {show(str(path))} --devices N --out "
                              "plan.json")
    if doc.get("format") != FORMAT:
        r.fail("format", f'"{FORMAT}" (a plan written by stagesplit solve --out; is this a profile or another '
               "file?)", doc.get("format"))
    version = doc.get("version")
    if version not in READABLE or isinstance(version, bool):
        r.fail("version", f"one of {', '.join(map(str, READABLE))} (the plan versions this stagesplit reads)", version)
    names = [r.string(x, f"layers[{i}]") for i, x in enumerate(r.list(r.get(doc, "layers", ""), "layers"))]
    if len(set(names)) != len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        r.fail("layers", "distinct layer names", dup)
    devices = r.integer(r.get(doc, "devices", ""), "devices", minimum=1)
    profile = _profile(r, doc.get("profile", {}), version)
    inputs = _inputs_v2(r, doc, names) if version >= 2 else _inputs_v1(r, doc.get("inputs", {}), names, devices,
                                                                      profile)
    if inputs.options.devices != devices:
        r.fail("devices", f"the request's device count ({inputs.options.devices})", devices)
    stages = _stages(r, doc, names, devices, gpu_words=version >= GPU_WORDS_VERSION and profile.one_tile)
    variants = _variants(r, doc.get("variants") or [], stages)
    paths = r.list(doc.get("module_paths") or [], "module_paths")
    if paths and len(paths) != len(names):
        r.fail("module_paths", f"one entry per layer ({len(names)})", f"{len(paths)} entries")
    paths = [None if x is None else r.string(x, f"module_paths[{i}]") for i, x in enumerate(paths)]
    run = _run(r, doc.get("run", {}))
    phases = [_phase(r, ph, f"objective[{i}]", run.phase_seconds[i] if i < len(run.phase_seconds) else 0.0)
              for i, ph in enumerate(r.list(doc.get("objective", []), "objective"))]
    return Plan(profile=profile, inputs=inputs, layer_names=names, devices=devices,
                method=r.string(doc.get("method", ""), "method"), status=r.string(doc.get("status", ""), "status"),
                feasible=r.boolean(doc.get("feasible", True), "feasible"),
                message=r.string(doc.get("message", ""), "message"), stages=stages, phases=phases,
                compute_unit=r.string(doc.get("compute_unit", "cycles"), "compute_unit"), run=run,
                module_paths=paths, tied=_tied(r, doc.get("tied_parameters", []), len(names)),
                wide_tensors=_wide(r, doc.get("wide_tensors") or [], len(names)),
                schedule=_schedule(r, doc.get("schedule"), len(stages), devices), variants=variants,
                candidates=_candidates(r, doc.get("schedule_candidates") or []),
                notes=[r.string(x, f"notes[{i}]") for i, x in enumerate(r.list(doc.get("notes") or [], "notes"))])


def _candidates(r: FieldReader, value: Any) -> tuple[ScheduleCandidate, ...]:
    """``schedule='auto'``'s table of every schedule tried."""
    out = []
    for i, item in enumerate(r.list(value, "schedule_candidates")):
        p = f"schedule_candidates[{i}]"
        r.mapping(item, p)
        r.known_keys(item, p, {f.name for f in fields(ScheduleCandidate)})

        def optional_number(key: str) -> float | None:
            # called only within this iteration, so the loop's current item and p are the ones meant
            x = item.get(key)  # noqa: B023
            return None if x is None else _figure(r, x, f"{p}.{key}")  # noqa: B023
        out.append(ScheduleCandidate(
            schedule=r.choice(r.get(item, "schedule", p), f"{p}.schedule", tuple(k.value for k in ScheduleKind)),
            chunks_per_rank=r.integer(r.get(item, "chunks_per_rank", p), f"{p}.chunks_per_rank", minimum=1),
            status=r.string(r.get(item, "status", p), f"{p}.status"), step_time=optional_number("step_time"),
            bubble=optional_number("bubble"), worst_memory=optional_number("worst_memory"),
            seconds=r.number(item.get("seconds", 0.0), f"{p}.seconds"), note=r.string(item.get("note", ""), f"{p}.note")))
    return tuple(out)


def _schedule_document(s: ScheduleRecord) -> dict[str, Any]:
    doc: dict[str, Any] = _record_dict(s)
    doc["ranks"] = [{**_record_dict(r), "chunks": list(r.chunks)} for r in s.ranks]
    doc["chunk_times"] = [list(x) for x in s.chunk_times]
    doc["runtime"] = _record_dict(s.runtime)
    for key, values in (("transfer_times", s.transfer_times), ("optimizer_times", s.optimizer_times)):
        if values:
            doc[key] = list(values)
        else:                                        # a plan read from an older file has none
            doc.pop(key)
    return doc



def _micro_batches(r: FieldReader, value: Any) -> int:
    count = r.integer(value, "schedule.micro_batches", minimum=1)
    if count > MAX_MICRO_BATCHES:
        r.fail("schedule.micro_batches", f"an integer in 1..{MAX_MICRO_BATCHES:,}", value)
    return count

def _schedule(r: FieldReader, value: Any, num_stages: int, devices: int) -> ScheduleRecord | None:
    """The plan's schedule record, every field checked (the exports build their schedule from it)."""
    if value is None:
        return None
    s = r.mapping(value, "schedule")
    r.known_keys(s, "schedule", {f.name for f in fields(ScheduleRecord)})
    kind = r.choice(r.get(s, "kind", "schedule"), "schedule.kind", tuple(k.value for k in ScheduleKind))
    v = r.integer(r.get(s, "chunks_per_rank", "schedule"), "schedule.chunks_per_rank", minimum=1)
    ranks = []
    for i, item in enumerate(r.list(r.get(s, "ranks", "schedule"), "schedule.ranks")):
        p = f"schedule.ranks[{i}]"
        r.mapping(item, p)
        r.known_keys(item, p, {f.name for f in fields(RankRecord)})
        chunks = tuple(r.integer(c, f"{p}.chunks[{j}]") for j, c in enumerate(r.list(r.get(item, "chunks", p),
                                                                                     f"{p}.chunks")))
        if any(c >= num_stages for c in chunks):
            r.fail(f"{p}.chunks", f"stage indices in 0..{num_stages - 1}", list(chunks))
        ranks.append(RankRecord(rank=r.integer(r.get(item, "rank", p), f"{p}.rank"), chunks=chunks,
                                peak_bytes=r.integer(r.get(item, "peak_bytes", p), f"{p}.peak_bytes"),
                                capacity_bytes=r.integer(r.get(item, "capacity_bytes", p), f"{p}.capacity_bytes"),
                                peak_at=r.string(item.get("peak_at", ""), f"{p}.peak_at"),
                                busy=_figure(r, item.get("busy", 0.0), f"{p}.busy"),
                                # the caching allocator's replay (absent or null: not replayed, or an older plan)
                                reserved_bytes=None if item.get("reserved_bytes") is None else
                                r.integer(item["reserved_bytes"], f"{p}.reserved_bytes"),
                                replayed_bytes=None if item.get("replayed_bytes") is None else
                                r.integer(item["replayed_bytes"], f"{p}.replayed_bytes"),
                                fits_after_retries=None if item.get("fits_after_retries") is None else
                                r.boolean(item["fits_after_retries"], f"{p}.fits_after_retries"),
                                allocator_retries=None if item.get("allocator_retries") is None else
                                r.integer(item["allocator_retries"], f"{p}.allocator_retries")))
    if len(ranks) != devices or sorted(c for x in ranks for c in x.chunks) != list(range(num_stages)) or \
            num_stages != v * devices:
        r.fail("schedule.ranks", f"{devices} devices holding the {num_stages} stages, {v} each", len(ranks))
    times: list[tuple[float, float, float]] = []
    for i, item in enumerate(r.list(s.get("chunk_times", []), "schedule.chunk_times")):
        item = r.list(item, f"schedule.chunk_times[{i}]")
        if len(item) != 3:
            r.fail(f"schedule.chunk_times[{i}]", "[forward, backward, weight] times", item)
        forward, backward, weight = (_figure(r, x, f"schedule.chunk_times[{i}][{j}]") for j, x in enumerate(item))
        times.append((forward, backward, weight))
    optional: dict[str, Any] = {}
    if s.get("runtime") is not None:                 # older plans: the one runtime priced then
        runtime = r.mapping(s["runtime"], "schedule.runtime")
        r.known_keys(runtime, "schedule.runtime", {f.name for f in fields(RuntimeConditions)})
        optional["runtime"] = RuntimeConditions(**{f.name: r.boolean(runtime.get(f.name, f.default),
                                                                     f"schedule.runtime.{f.name}")
                                                   for f in fields(RuntimeConditions)})
    for key, size, what in (("transfer_times", max(num_stages - 1, 0), "one transfer time per boundary"),
                            ("optimizer_times", devices, "one optimizer time per device")):
        if s.get(key) is None:
            continue
        items = r.list(s[key], f"schedule.{key}")
        if len(items) != size:
            r.fail(f"schedule.{key}", f"{size} numbers ({what})", len(items))
        optional[key] = tuple(_figure(r, x, f"schedule.{key}[{j}]") for j, x in enumerate(items))
    return ScheduleRecord(kind=kind, chunks_per_rank=v,
                          micro_batches=_micro_batches(r, r.get(s, "micro_batches", "schedule")),
                          step_time=_figure(r, r.get(s, "step_time", "schedule"), "schedule.step_time"),
                          time_unit=r.string(s.get("time_unit", "seconds"), "schedule.time_unit"),
                          bubble=r.number(s.get("bubble", 0.0), "schedule.bubble"), ranks=tuple(ranks),
                          chunk_times=tuple(times), **optional)


def _tied(r: FieldReader, value: Any, num_layers: int) -> tuple[TiedParameter, ...]:
    out = []
    for i, item in enumerate(r.list(value, "tied_parameters")):
        where = f"tied_parameters[{i}]"
        r.mapping(item, where)
        r.known_keys(item, where, {"name", "layers"})
        layers = tuple(r.integer(x, f"{where}.layers[{j}]") for j, x in enumerate(r.list(r.get(item, "layers", where),
                                                                                         f"{where}.layers")))
        bad = [x for x in layers if x >= num_layers]
        if bad:
            r.fail(f"{where}.layers", f"layer indices in 0..{num_layers - 1}", bad[0])
        out.append(TiedParameter(r.string(r.get(item, "name", where), f"{where}.name"), layers))
    return tuple(out)


def _wide(r: FieldReader, value: Any, num_layers: int) -> tuple[WideTensor, ...]:
    out = []
    for i, item in enumerate(r.list(value, "wide_tensors")):
        where = f"wide_tensors[{i}]"
        r.mapping(item, where)
        r.known_keys(item, where, {"name", "first_layer", "last_layer"})
        first, last = (r.integer(r.get(item, key, where), f"{where}.{key}") for key in ("first_layer", "last_layer"))
        if not 0 <= first < last < num_layers:
            r.fail(f"{where}.last_layer", f"layer indices first_layer < last_layer in 0..{num_layers - 1}", last)
        out.append(WideTensor(r.string(r.get(item, "name", where), f"{where}.name"), first, last))
    return tuple(out)


def _optional_string(r: FieldReader, value: Any, path: str) -> str | None:
    return None if value is None else r.string(value, path)


def _profile(r: FieldReader, value: Any, version: int) -> PlanProfile:
    """The profile section; from version 3 a GPU's is ``device_bytes`` (one tile) in place of
    ``tiles`` and ``bytes_per_tile``."""
    p = r.mapping(value, "profile")
    known = {f.name for f in fields(PlanProfile)}
    r.known_keys(p, "profile", known | {"device_bytes"} if version >= GPU_WORDS_VERSION else known)
    tiles, per_tile = p.get("tiles", 1), p.get("bytes_per_tile", 0)
    if "device_bytes" in p:
        if "tiles" in p or "bytes_per_tile" in p:
            r.fail("profile.device_bytes", "either device_bytes (a GPU) or tiles and bytes_per_tile (an IPU), "
                   "not both", p["device_bytes"])
        tiles, per_tile = 1, r.integer(p["device_bytes"], "profile.device_bytes")
    return PlanProfile(name=r.string(p.get("name", ""), "profile.name"),
                       source=r.string(p.get("source", ""), "profile.source"),
                       synthetic=r.boolean(p.get("synthetic", False), "profile.synthetic"),
                       target=r.string(p.get("target", ""), "profile.target"),
                       tiles=r.integer(tiles, "profile.tiles", minimum=1),
                       bytes_per_tile=r.integer(per_tile, "profile.bytes_per_tile"),
                       path=_optional_string(r, p.get("path"), "profile.path"),
                       sha256=_sha256(r, p.get("sha256"), "profile.sha256"),
                       tensor_parallel=r.integer(p.get("tensor_parallel", 1), "profile.tensor_parallel", minimum=1),
                       sequence_parallel=r.boolean(p.get("sequence_parallel", False), "profile.sequence_parallel"),
                       tensor_parallel_styles=_styles(r, p.get("tensor_parallel_styles", []),
                                                      "profile.tensor_parallel_styles"),
                       sequence_parallel_additions=_styles(r, p.get("sequence_parallel_additions", []),
                                                           "profile.sequence_parallel_additions"),
                       context_parallel=r.integer(p.get("context_parallel", 1), "profile.context_parallel", minimum=1),
                       expert_parallel=r.integer(p.get("expert_parallel", 1), "profile.expert_parallel", minimum=1),
                       **_precision(r, p))


def _precision(r: FieldReader, p: dict[str, Any]) -> dict[str, Any]:
    """The profile's precision fields, checked alone and together (as a profile's ``precision``)."""
    parameters = r.choice(p.get("parameter_dtype", ""), "profile.parameter_dtype", ("", *PARAMETER_DTYPES))
    autocast = r.choice(p.get("autocast_dtype", ""), "profile.autocast_dtype", ("", *AUTOCAST_DTYPES))
    master = r.boolean(p.get("master_weights", False), "profile.master_weights")
    if (autocast or master) and not parameters:
        r.fail("profile.parameter_dtype", "the parameters' dtype where autocast_dtype or master_weights is given",
               parameters)
    if master and (parameters == "float32" or autocast):
        r.fail("profile.master_weights", "false with float32 parameters or autocast (master weights are float32 "
               "copies of low-precision parameters)", master)
    return {"parameter_dtype": parameters, "autocast_dtype": autocast, "master_weights": master}


def _styles(r: FieldReader, value: Any, path: str) -> tuple[tuple[str, str], ...]:
    """A tensor-parallel plan: a list of [module path, style] pairs (text only; an export renders it)."""
    if not isinstance(value, list):
        r.fail(path, "a list of [module path, style] pairs", value)
    out = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            r.fail(f"{path}[{i}]", "a [module path, style] pair of strings", pair)
        out.append((pair[0], pair[1]))
    return tuple(out)


def _sha256(r: FieldReader, value: Any, path: str) -> str | None:
    if value is None:
        return None
    text = r.string(value, path)
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        r.fail(path, "64 lowercase hexadecimal digits (a SHA-256)", text)
    return text


def _source(r: FieldReader) -> str:
    """The plan file's name (``read_plan`` reads a plan from a path)."""
    assert r.source is not None
    return r.source


def _targets(r: FieldReader, value: Any, path: str) -> tuple[Target, ...]:
    return tuple(target_from_mapping(t.get("name", "target") if isinstance(t, dict) else "target", t, r.source,
                                     f"{path}[{i}]") for i, t in enumerate(r.list(value, path)))


def _options(r: FieldReader, request: SolveRequest, resolved: dict[str, Any], names: list[str], prefix: str) -> SolveOptions:
    """The resolved options: the request's values, with what ``resolve`` chose, each checked."""
    L = len(names)
    micro = r.integer(r.get(resolved, "micro_batches", prefix), f"{prefix}.micro_batches", minimum=1)
    caps = resolved.get("capacities")
    if caps is not None:
        caps = tuple(r.integer(c, f"{prefix}.capacities[{i}]", minimum=1)
                     for i, c in enumerate(r.list(caps, f"{prefix}.capacities")))
        if len(caps) != request.devices:
            r.fail(f"{prefix}.capacities", f"one capacity per device ({request.devices})", f"{len(caps)} entries")
    splits = tuple(r.integer(j, f"{prefix}.pinned_splits[{i}]", minimum=1)
                   for i, j in enumerate(r.list(resolved.get("pinned_splits", []), f"{prefix}.pinned_splits")))
    for i, j in enumerate(splits):
        if j >= L:
            r.fail(f"{prefix}.pinned_splits[{i}]", f"a layer index in 1..{L - 1}", j)
    pins = []
    for i, item in enumerate(r.list(resolved.get("pinned_layers", []), f"{prefix}.pinned_layers")):
        item = r.list(item, f"{prefix}.pinned_layers[{i}]")
        if len(item) != 2:
            r.fail(f"{prefix}.pinned_layers[{i}]", "a [layer index, device position] pair", item)
        layer = r.integer(item[0], f"{prefix}.pinned_layers[{i}][0]")
        position = r.integer(item[1], f"{prefix}.pinned_layers[{i}][1]")
        if layer >= L or position >= request.devices:
            r.fail(f"{prefix}.pinned_layers[{i}]", f"a layer in 0..{L - 1} and a position in "
                   f"0..{request.devices - 1}", item)
        pins.append((layer, position))
    link = resolved.get("link_bytes_per_s")
    link = None if link is None else r.number(link, f"{prefix}.link_bytes_per_s", minimum=1)
    return SolveOptions(devices=request.devices, objective=request.objective, exact=request.exact,
                        schedule=request.schedule, micro_batches=micro,
                        micro_batches_auto=r.boolean(resolved.get("micro_batches_auto", False),
                                                     f"{prefix}.micro_batches_auto"),
                        headroom=request.headroom, capacities=caps, reserve=request.reserve,
                        min_layers=request.min_layers, max_layers=request.max_layers, pinned_splits=splits,
                        pinned_layers=tuple(pins), communication=request.communication, link_bytes_per_s=link,
                        time_limit=request.time_limit, workers=request.workers)


def _inputs_v2(r: FieldReader, doc: dict[str, Any], names: list[str]) -> PlanInputs:
    request = SolveRequest.from_record(r.get(doc, "request", ""), _source(r), "request")
    resolved = r.mapping(r.get(doc, "resolved", ""), "resolved")
    r.known_keys(resolved, "resolved", {"micro_batches", "micro_batches_auto", "capacities", "pinned_splits",
                                        "pinned_layers", "link_bytes_per_s", "targets", "layer_compute_sha256",
                                        "runtime_reserve", "micro_batch_size", "global_batch"})
    options = _options(r, request, resolved, names, "resolved")
    targets = _targets(r, resolved.get("targets", []), "resolved.targets")
    if targets and len(targets) != request.devices:
        r.fail("resolved.targets", f"one target per device ({request.devices})", f"{len(targets)} entries")
    kept = None                # plans written before it was recorded kept nothing back
    if resolved.get("runtime_reserve") is not None:
        kept = _reserve(r, resolved["runtime_reserve"], "resolved.runtime_reserve", request.devices)
        options = replace(options, kept_back=kept.per_device(request.devices))
    size = batch = None             # recorded by a layout search only
    if resolved.get("micro_batch_size") is not None:
        size = r.integer(resolved["micro_batch_size"], "resolved.micro_batch_size", 1)
        batch = r.integer(resolved.get("global_batch"), "resolved.global_batch", 1)
        per_step = size * options.micro_batches * request.dp
        if batch != per_step:
            r.fail("resolved.global_batch", f"micro_batch_size x micro-batches x dp = {per_step}", str(batch))
    return PlanInputs(request=request, options=options, targets=targets,
                      layer_compute_sha256=_sha256(r, resolved.get("layer_compute_sha256"),
                                                   "resolved.layer_compute_sha256"), runtime_reserve=kept,
                      micro_batch_size=size, global_batch=batch)



def _inputs_v1(r: FieldReader, value: Any, names: list[str], devices: int, profile: PlanProfile) -> PlanInputs:
    """A version-1 plan's ``inputs``: the resolved options (pins as indices) with the layer
    grouping and, from later version-1 plans on, the request as given (``inputs.request``)."""
    inputs = r.mapping(value, "inputs")
    record = inputs.get("request")
    if record is not None:
        record = dict(r.mapping(record, "inputs.request"))
        extra = {k: record.pop(k) for k in ("resolved_targets", "layer_compute_sha256") if k in record}
        request = SolveRequest.from_record(record, _source(r), "inputs.request")
        targets = _targets(r, extra.get("resolved_targets", []), "inputs.request.resolved_targets")
        sha = _sha256(r, extra.get("layer_compute_sha256"), "inputs.request.layer_compute_sha256")
    else:                          # the earliest plans: rebuild the request from the resolved options
        values: dict[str, Any] = {"devices": inputs.get("devices", devices)}
        for key in ("objective", "exact", "schedule", "headroom", "reserve", "min_layers", "max_layers",
                    "communication", "time_limit", "workers", "shared"):
            if key in inputs:
                values[key] = inputs[key]
        if not inputs.get("micro_batches_auto") and inputs.get("schedule", "none") != "none":
            values["micro_batches"] = inputs.get("micro_batches")
        splits = r.list(inputs.get("pinned_splits", []), "inputs.pinned_splits")
        values["pin_splits"] = [_layer_name(r, names, j, f"inputs.pinned_splits[{i}]") for i, j in enumerate(splits)]
        pins = r.list(inputs.get("pinned_layers", []), "inputs.pinned_layers")
        values["pin_layers"] = [(_layer_name(r, names, r.list(p, f"inputs.pinned_layers[{i}]")[0],
                                             f"inputs.pinned_layers[{i}][0]"), p[1]) for i, p in enumerate(pins)]
        if inputs.get("layer_grouping") is not None:
            values["layering"] = inputs["layer_grouping"]
        request = SolveRequest.from_record(values, _source(r), "inputs")
        targets, sha = (), None
    resolved = {"micro_batches": inputs.get("micro_batches", request.micro_batches or 1),
                "micro_batches_auto": inputs.get("micro_batches_auto", False),
                "capacities": inputs.get("capacities"), "pinned_splits": inputs.get("pinned_splits", []),
                "pinned_layers": inputs.get("pinned_layers", []), "link_bytes_per_s": inputs.get("link_bytes_per_s")}
    options = _options(r, request, resolved, names, "inputs")
    if not targets:                # only each position's target name: a shipped target
        named = r.list(inputs.get("targets") or [], "inputs.targets")
        targets = tuple(_shipped_target(r, t, f"inputs.targets[{i}]") for i, t in enumerate(named))
    if len(targets) == 1:          # one target, written once for every device: a later version lists each's
        targets *= request.devices
    return PlanInputs(request=request, options=options, targets=targets, layer_compute_sha256=sha)


def _shipped_target(r: FieldReader, value: Any, path: str) -> Target:
    name = r.string(value, path)
    targets = known_targets()
    if name not in targets:
        r.fail(path, "the name of a shipped target (" + ", ".join(targets) + ")", name)
    return targets[name]


def _layer_name(r: FieldReader, names: list[str], index: Any, path: str) -> str:
    index = r.integer(index, path)
    if index >= len(names):
        r.fail(path, f"a layer index in 0..{len(names) - 1}", index)
    return str(names[index])


def _stages(r: FieldReader, doc: dict[str, Any], names: list[str], devices: int, gpu_words: bool) -> list[StagePlan]:
    """The stages; with ``gpu_words`` (a version-3 GPU plan) each names its memory ``peak_bytes``
    and ``memory``, and a tile's field there is refused (a hand edit that mixes the two)."""
    stages = []
    for i, s in enumerate(r.list(r.get(doc, "stages", ""), "stages")):
        p = f"stages[{i}]"
        r.mapping(s, p)
        if gpu_words:
            tile, peak, at_tile, total = _gpu_memory(r, s, p)
        else:
            for key in GPU_STAGE_FIELDS:
                if key in s:
                    r.fail(f"{p}.{key}", "no such field in this plan (an IPU plan, or one written before version "
                           f"{GPU_WORDS_VERSION}, names the stage's memory worst_tile_bytes)", key)
            tile = r.integer(s.get("worst_tile", 0), f"{p}.worst_tile")
            peak = r.integer(s.get("worst_tile_bytes", 0), f"{p}.worst_tile_bytes")
            at_tile = _breakdown(r, s.get("memory_at_worst_tile"), f"{p}.memory_at_worst_tile")
            total = _breakdown(r, s.get("memory_total"), f"{p}.memory_total")
        first = r.integer(r.get(s, "first_layer", p), f"{p}.first_layer")
        last = r.integer(r.get(s, "last_layer", p), f"{p}.last_layer")
        if last < first or last >= len(names):
            r.fail(f"{p}.last_layer", f"a layer index >= first_layer ({first}) and < {len(names)}", last)
        device = r.integer(s.get("device", i), f"{p}.device")
        if device >= devices:
            r.fail(f"{p}.device", f"a device position in 0..{devices - 1}", device)
        stages.append(StagePlan(
            stage=r.integer(s.get("stage", i), f"{p}.stage"), device=device,
            first_layer=first, last_layer=last, layers=_stage_layers(r, s, p, names[first:last + 1]),
            in_flight=r.integer(s.get("in_flight", 1), f"{p}.in_flight", minimum=1),
            capacity_bytes=r.integer(s.get("capacity_bytes", 0), f"{p}.capacity_bytes"),
            worst_tile=tile, worst_tile_bytes=peak, memory_at_worst_tile=at_tile, memory_total=total,
            compute=_figure(r, s.get("compute", 0.0), f"{p}.compute"),
            time_s=None if s.get("time_s") is None else _figure(r, s["time_s"], f"{p}.time_s"),
            bytes_received=r.integer(s.get("bytes_received", 0), f"{p}.bytes_received"),
            bytes_sent=r.integer(s.get("bytes_sent", 0), f"{p}.bytes_sent"),
            time=None if s.get("time") is None else _figure(r, s["time"], f"{p}.time"),
            recompute=_recompute_of(r, s.get("recompute", []), f"{p}.recompute", last - first + 1),
            recompute_saved_bytes=r.integer(s.get("recompute_saved_bytes", 0), f"{p}.recompute_saved_bytes"),
            recompute_time=_figure(r, s.get("recompute_time", 0.0), f"{p}.recompute_time"),
            memory_proportion=_proportion(r, s.get("memory_proportion"), f"{p}.memory_proportion"),
            variant=_optional_string(r, s.get("variant"), f"{p}.variant")))
    for prev, cur in zip(stages, stages[1:]):
        if cur.first_layer != prev.last_layer + 1:
            r.fail(f"stages[{cur.stage}].first_layer", f"{prev.last_layer + 1} (stages are contiguous)", cur.first_layer)
    return stages


def _proportion(r: FieldReader, value: Any, path: str) -> float | None:
    """A memory proportion: null, or a number in (0, 1]."""
    if value is None:
        return None
    number = r.number(value, path)
    if not 0 < number <= 1:
        r.fail(path, "a memory proportion in (0, 1] or null", value)
    return number


def _variants(r: FieldReader, value: Any, stages: list[StagePlan]) -> tuple[PlanVariant, ...]:
    """The plan's profile variants; each stage's variant must be one of them, at its proportion."""
    out = []
    for i, item in enumerate(r.list(value, "variants")):
        where = f"variants[{i}]"
        r.mapping(item, where)
        r.known_keys(item, where, {f.name for f in fields(PlanVariant)})
        out.append(PlanVariant(name=r.string(r.get(item, "name", where), f"{where}.name"),
                               proportion=_proportion(r, item.get("proportion"), f"{where}.proportion"),
                               path=_optional_string(r, item.get("path"), f"{where}.path"),
                               sha256=_sha256(r, item.get("sha256"), f"{where}.sha256")))
    by_name = {v.name: v for v in out}
    if len(by_name) != len(out):
        r.fail("variants", "distinct variant names", [v.name for v in out])
    for s in stages:
        if out and s.variant not in by_name:
            r.fail(f"stages[{s.stage}].variant", "one of the plan's variants (" + ", ".join(by_name) + ")", s.variant)
        variant = by_name[s.variant] if out and s.variant is not None else None   # (r.fail raised on others)
        if out and variant is not None and s.memory_proportion != variant.proportion:
            r.fail(f"stages[{s.stage}].memory_proportion", f"variant {s.variant}'s proportion "
                   f"({variant.proportion})", s.memory_proportion)
        if not out and s.variant is not None:
            r.fail(f"stages[{s.stage}].variant", "null (the plan lists no profile variants)", s.variant)
    return tuple(out)


#: a layer's recompute options as plans write them (model/recompute.py)
RECOMPUTE_OPTIONS = ("none", "selective", "full")


def _recompute_of(r: FieldReader, value: Any, path: str, layers: int) -> tuple[str, ...]:
    items = r.list(value, path)
    if items and len(items) != layers:
        r.fail(path, f"one option per layer of the stage ({layers})", f"{len(items)} options")
    return tuple(r.choice(x, f"{path}[{i}]", RECOMPUTE_OPTIONS) for i, x in enumerate(items))


def _stage_layers(r: FieldReader, stage: dict[str, Any], where: str, default: list[str]) -> list[str]:
    """A stage's layer names as the document lists them (kept as written, so that ``export``
    can reject a hand edit that drops or repeats a layer), else those of its index range."""
    if "layers" not in stage:
        return default
    return [r.string(x, f"{where}.layers[{i}]") for i, x in enumerate(r.list(stage["layers"], f"{where}.layers"))]


def _gpu_memory(r: FieldReader, stage: dict[str, Any], where: str) -> tuple[int, int, MemoryBreakdown, MemoryBreakdown]:
    """A version-3 GPU stage's memory as the records hold it: the device is its one tile
    (``worst_tile`` 0, ``peak_bytes`` its bytes, the same breakdown at the tile and in total)."""
    for key in IPU_STAGE_FIELDS:
        if key in stage:
            r.fail(f"{where}.{key}", f"no such field in a GPU plan (version {GPU_WORDS_VERSION} names the stage's "
                   "memory peak_bytes and memory)", key)
    memory = r.mapping(stage.get("memory", {}), f"{where}.memory")
    r.known_keys(memory, f"{where}.memory", set(GPU_MEMORY_WORDS.values()) | set(IPU_ONLY_MEMORY))
    words = {key: GPU_MEMORY_WORDS.get(key, key) for key in MEMORY_KEYS}
    breakdown = MemoryBreakdown(**{key: r.integer(memory.get(word, 0), f"{where}.memory.{word}", minimum=0)
                                   for key, word in words.items()})
    return 0, r.integer(stage.get("peak_bytes", 0), f"{where}.peak_bytes"), breakdown, breakdown


def _breakdown(r: FieldReader, value: Any, where: str) -> MemoryBreakdown:
    values = r.mapping(value if value is not None else {}, where)
    return MemoryBreakdown(**{k: r.integer(values.get(k, 0), f"{where}.{k}", minimum=0) for k in MEMORY_KEYS})


def _run(r: FieldReader, value: Any) -> PlanRun:
    run = r.mapping(value if value is not None else {}, "run")
    seconds = r.list(run.get("phase_seconds", []), "run.phase_seconds")
    versions = r.mapping(run.get("versions", {}), "run.versions")
    return PlanRun(stagesplit=r.string(run.get("stagesplit", ""), "run.stagesplit"),
                   created=r.string(run.get("created", ""), "run.created"),
                   solver_seconds=None if run.get("solver_seconds") is None else
                   r.number(run["solver_seconds"], "run.solver_seconds"),
                   phase_seconds=tuple(r.number(x, f"run.phase_seconds[{i}]") for i, x in enumerate(seconds)),
                   dp_seconds=None if run.get("dp_seconds") is None else r.number(run["dp_seconds"], "run.dp_seconds"),
                   cpsat_seconds=None if run.get("cpsat_seconds") is None else
                   r.number(run["cpsat_seconds"], "run.cpsat_seconds"),
                   versions={r.string(k, "run.versions"): r.string(v, f"run.versions.{k}") for k, v in versions.items()})


def _phase(r: FieldReader, value: Any, path: str, seconds: float) -> PhaseRecord:
    ph = r.mapping(value, path)
    r.known_keys(ph, path, {f.name for f in fields(PhaseRecord)})

    def num(key: str) -> float | int | None:
        v = ph.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            r.fail(f"{path}.{key}", "a number or null", v)
        return v if isinstance(v, int) else r.number(v, f"{path}.{key}", minimum=None)

    def whole(key: str) -> int | None:
        v = ph.get(key)
        return None if v is None else r.integer(v, f"{path}.{key}", minimum=None)

    return PhaseRecord(quantity=r.string(r.get(ph, "quantity", path), f"{path}.quantity"),
                       status=r.string(r.get(ph, "status", path), f"{path}.status"),
                       value=num("value"), bound=num("bound"), gap=num("gap"),
                       seconds=r.number(ph.get("seconds", seconds) or 0.0, f"{path}.seconds"),
                       unit=r.string(ph.get("unit", ""), f"{path}.unit"),
                       scale=r.number(ph.get("scale", 1), f"{path}.scale"),
                       solver_value=whole("solver_value"), solver_bound=whole("solver_bound"),
                       proof=r.string(ph.get("proof", "cp-sat"), f"{path}.proof"))

