"""A pipeline plan: the chosen split, what each stage needs, and how the answer was obtained.

Written as versioned JSON (or YAML for a ``.yaml``/``.yml`` path). Everything but the ``run``
section (wall time, date, version) is a function of the inputs, so the same profile and
options give the same plan.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..model.costmodel import StageCostModel
from ..model.stagememory import MemoryBreakdown
from ..common.fileio import atomic_write_text, file_sha256
from ..common.fields import FieldReader
from ..solver.problem import Split, SplitProblem, SolveOptions, bubble_fraction, evaluate, schedule_note, stage_in_flight
from ..solver.cpsat import PHASE_NAMES, SolverResult
from ..model.traffic import Traffic

FORMAT = "stagesplit-plan"
VERSION = 1
MEMORY_KEYS = MemoryBreakdown.keys()
#: the stages frame's columns a notebook shows (``Plan.stages_frame()`` has them all)
HTML_STAGE_COLUMNS = ("device", "target", "first_layer_name", "last_layer_name", "num_layers", "in_flight",
                      "memory_bytes", "capacity_bytes", "headroom", "fits", "compute", "stage_time", "time_s",
                      "bytes_received", "bytes_sent")


@dataclass
class StagePlan:
    stage: int
    device: int
    first_layer: int
    last_layer: int
    layers: list[str]
    in_flight: int
    capacity_bytes: int
    worst_tile: int
    worst_tile_bytes: int
    #: bytes by category on the worst tile, and summed over tiles
    memory_at_worst_tile: MemoryBreakdown
    memory_total: MemoryBreakdown
    compute: float
    time_s: float | None
    bytes_received: int
    bytes_sent: int
    #: stage time in the plan's compute unit with transfers in and out included (== compute
    #: without --communication); None in plans written before it was recorded
    time: float | None = None

    @property
    def stage_time(self) -> float:
        return self.compute if self.time is None else self.time

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.worst_tile_bytes

    @property
    def headroom(self) -> float:
        return self.headroom_bytes / self.capacity_bytes if self.capacity_bytes else 0.0

    @property
    def fits(self) -> bool:
        return self.worst_tile_bytes <= self.capacity_bytes


@dataclass
class PhaseRecord:
    """One objective phase. ``value`` and ``bound`` are in ``unit`` (the profile's compute unit
    for stage time, transfers included; bytes per tile, or a fraction of capacity on mixed
    devices, for memory; a count for devices). The solver works in integers: ``solver_value``
    = ``value`` x ``scale``. The phase's wall time is kept in the plan's ``run`` section."""

    quantity: str
    status: str
    value: float | int | None
    bound: float | int | None
    gap: float | None
    seconds: float = 0.0
    unit: str = ""
    scale: float = 1
    solver_value: int | None = None
    solver_bound: int | None = None
    proof: str = "cp-sat"              # what proved the bound: "cp-sat", or "dp" (the exact DP's optimum)

    def document(self) -> dict[str, Any]:
        """Everything but the wall time (which differs from run to run)."""
        doc = asdict(self)
        doc.pop("seconds")
        return doc


@dataclass
class Plan:
    profile: dict[str, Any]
    inputs: dict[str, Any]
    layer_names: list[str]
    devices: int
    method: str
    status: str
    feasible: bool
    message: str
    stages: list[StagePlan]
    phases: list[PhaseRecord] = field(default_factory=list)
    compute_unit: str = "cycles"
    run: dict[str, Any] = field(default_factory=dict)
    #: each layer's module path from the profile's operation names (None: not derivable);
    #: empty for plans written before module paths were recorded
    module_paths: list[str | None] = field(default_factory=list)
    #: things the user should know about the inputs (e.g. a defaulted micro-batch count)
    notes: list[str] = field(default_factory=list)
    #: not written to the plan file: the greedy and uniform plans solved alongside (``compare``),
    #: and what the command line prints as warnings
    baselines: list["Plan"] = field(default_factory=list, repr=False, compare=False)
    warnings: list[str] = field(default_factory=list, repr=False, compare=False)

    @property
    def split_text(self) -> str:
        return split_text(self.layer_names, [(s.first_layer, s.last_layer) for s in self.stages])

    def short_split_text(self, width: int = 100) -> str:
        """The split text, long stages shortened to first..last when it is wider than ``width``."""
        return split_text(self.layer_names, [(s.first_layer, s.last_layer) for s in self.stages], width)

    @property
    def bottleneck(self) -> StagePlan | None:
        """The slowest stage (transfers included)."""
        return max(self.stages, key=lambda s: (s.stage_time, -s.stage)) if self.stages else None

    @property
    def worst_memory(self) -> StagePlan | None:
        return max(self.stages, key=lambda s: (s.worst_tile_bytes / max(s.capacity_bytes, 1), -s.stage)) \
            if self.stages else None

    @property
    def gap(self) -> float | None:
        gaps = [p.gap for p in self.phases if p.gap is not None]
        return max(gaps) if gaps else None

    def pipeline_efficiency(self, micro_batches: int) -> float:
        """Useful share of a pipeline step: compute balance times (1 - bubble fraction)."""
        if not self.stages:
            return 0.0
        bottleneck = max(s.stage_time for s in self.stages)
        if bottleneck <= 0:
            return 1.0 - bubble_fraction(len(self.stages), micro_batches)
        balance = sum(s.compute for s in self.stages) / (len(self.stages) * bottleneck)
        return balance * (1.0 - bubble_fraction(len(self.stages), micro_batches))

    def to_document(self) -> dict[str, Any]:
        """The plan as the JSON/YAML document ``write_plan`` writes."""
        doc = {"format": FORMAT, "version": VERSION, "profile": self.profile, "inputs": self.inputs,
               "layers": self.layer_names, "devices": self.devices, "method": self.method, "status": self.status,
               "feasible": self.feasible, "message": self.message, "split": self.split_text,
               "compute_unit": self.compute_unit, "module_paths": self.module_paths, "notes": self.notes,
               "objective": [p.document() for p in self.phases],
               "bottleneck_stage": self.bottleneck.stage if self.bottleneck else None,
               "stages": [], "run": self.run}
        for s in self.stages:
            rec = asdict(s)
            rec["headroom_bytes"] = s.headroom_bytes
            rec["headroom"] = round(s.headroom, 6)
            doc["stages"].append(rec)
        return doc

    # -- notebooks (pandas is imported only here) -----------------------------------------------
    def stage_target(self, stage: StagePlan) -> str:
        """The name of the device target a stage runs on: the plan's per-position targets when
        it was solved for named (possibly mixed) targets, else the profile's own device."""
        targets = self.inputs.get("targets") or []
        if 0 <= stage.device < len(targets):
            return str(targets[stage.device])
        return str(self.profile.get("target", ""))

    def stages_frame(self):
        """A pandas DataFrame with one row per stage, indexed by stage number.

        Columns: ``device`` (position), ``target``, ``first_layer``/``last_layer`` (layer
        indices), ``first_layer_name``/``last_layer_name``, ``num_layers``, ``in_flight``,
        ``memory_bytes`` (bytes on the stage's fullest tile, the whole device on a one-tile
        GPU: what must fit), ``worst_tile``, ``capacity_bytes``, ``headroom_bytes``,
        ``headroom`` (fraction of capacity left), ``fits``, the fullest tile's bytes by
        category (``always_live_bytes`` ... ``control_code_bytes``), ``total_bytes`` (summed
        over tiles), ``compute`` (in ``attrs["compute_unit"]``), ``stage_time`` (compute unit,
        transfers included), ``time_s`` (NaN when the target gives no seconds),
        ``bytes_received``, ``bytes_sent`` and ``bottleneck``. Bytes are int64; an
        infeasible plan gives an empty frame with the same columns and dtypes."""
        from ..common.frames import frame
        st = self.stages
        bottleneck = self.bottleneck
        cols: dict[str, tuple[Any, Any]] = {
            "device": ([s.device for s in st], "int64"),
            "target": ([self.stage_target(s) for s in st], object),
            "first_layer": ([s.first_layer for s in st], "int64"),
            "last_layer": ([s.last_layer for s in st], "int64"),
            "first_layer_name": ([self.layer_names[s.first_layer] for s in st], object),
            "last_layer_name": ([self.layer_names[s.last_layer] for s in st], object),
            "num_layers": ([s.last_layer - s.first_layer + 1 for s in st], "int64"),
            "in_flight": ([s.in_flight for s in st], "int64"),
            "memory_bytes": ([s.worst_tile_bytes for s in st], "int64"),
            "worst_tile": ([s.worst_tile for s in st], "int64"),
            "capacity_bytes": ([s.capacity_bytes for s in st], "int64"),
            "headroom_bytes": ([s.headroom_bytes for s in st], "int64"),
            "headroom": ([s.headroom for s in st], "float64"),
            "fits": ([s.fits for s in st], "bool"),
        }
        for key in MEMORY_KEYS:
            cols[f"{key}_bytes"] = ([getattr(s.memory_at_worst_tile, key) for s in st], "int64")
        cols.update({
            "total_bytes": ([s.memory_total.total for s in st], "int64"),
            "compute": ([s.compute for s in st], "float64"),
            "stage_time": ([s.stage_time for s in st], "float64"),
            "time_s": ([s.time_s for s in st], "float64"),
            "bytes_received": ([s.bytes_received for s in st], "int64"),
            "bytes_sent": ([s.bytes_sent for s in st], "int64"),
            "bottleneck": ([s is bottleneck for s in st], "bool"),
        })
        return frame(cols, index=("stage", [s.stage for s in st], "int64"),
                     attrs={"compute_unit": self.compute_unit, "method": self.method, "status": self.status})

    def layers_frame(self):
        """A pandas DataFrame with one row per layer (indexed by layer number): ``name``,
        ``module_path`` (None where not derivable), and the ``stage`` and ``device`` holding it
        (nullable Int64: <NA> everywhere when the plan has no split)."""
        from ..common.frames import frame
        n = len(self.layer_names)
        stage: list[int | None] = [None] * n
        device: list[int | None] = [None] * n
        for s in self.stages:
            for layer in range(s.first_layer, min(s.last_layer, n - 1) + 1):
                stage[layer], device[layer] = s.stage, s.device
        paths = self.module_paths if len(self.module_paths) == n else [None] * n
        return frame({"name": (self.layer_names, object), "module_path": (paths, object),
                      "stage": (stage, "Int64"), "device": (device, "Int64")},
                     index=("layer", range(n), "int64"))

    def _repr_html_(self) -> str:
        """Notebook display: the plan's summary (split, status, bottleneck, memory) and its
        stages frame; names are escaped."""
        from ..common.frames import html_summary
        from ..reporting.summary import plan_summary
        micro = self.inputs.get("micro_batches")
        summary = plan_summary(self, micro if isinstance(micro, int) and micro > 0 else 1,
                               gpu=self.profile.get("tiles") == 1)
        title = f"stagesplit plan ({self.method}) of {self.profile.get('name') or 'a profile'}: " \
                f"{len(self.layer_names)} layers on {self.devices} devices"
        table = self.stages_frame()[list(HTML_STAGE_COLUMNS)].to_html() if self.stages else ""
        return html_summary(title, summary.splitlines(), table)


def split_text(names: list[str], ranges: list[tuple[int, int]], width: int | None = None) -> str:
    """``[ 0 1 2 | 3 4 5 ]``: layer names with a bar at every split. With ``width``, stages of
    more than two layers are shortened to ``first..last`` when the full text is longer."""
    if not ranges:
        return "none"
    full = "[ " + " | ".join(" ".join(names[a:b + 1]) for a, b in ranges) + " ]"
    if width is None or len(full) <= width:
        return full
    return "[ " + " | ".join(" ".join(names[a:b + 1]) if b - a < 2 else f"{names[a]}..{names[b]}"
                             for a, b in ranges) + " ]"


def options_record(options: SolveOptions, shared: str, layer_options) -> dict[str, Any]:
    rec = asdict(options)
    rec["capacities"] = list(options.capacities) if options.capacities else None
    rec["pinned_splits"] = list(options.pinned_splits)
    rec["pinned_layers"] = [list(x) for x in options.pinned_layers]
    rec["shared"] = shared
    if layer_options is not None:
        rec["layer_grouping"] = asdict(layer_options)
    return rec


def make_plan(model: StageCostModel, problem: SplitProblem, split: Split | None, *, method: str,
              traffic: Traffic, profile_path: str | Path | None = None, result: SolverResult | None = None,
              message: str = "", target_names: list[str] | None = None) -> Plan:
    """Describe ``split`` stage by stage (per-tile detail recomputed from the cost model)."""
    p = model.profile
    o = problem.options
    evaluation = evaluate(problem, split) if split is not None else None
    stages: list[StagePlan] = []
    if split is not None:
        ks = stage_in_flight(problem, split)
        seconds = problem.seconds_per_unit
        for index, ((position, first, last), k) in enumerate(zip(split.stages, ks)):
            sm = model.stage_memory(first, last)
            total = sm.total(k)
            tile = int(total.argmax())
            received, sent = traffic.stage_io(first, last)
            compute = model.range_compute(first, last)
            stage_time = float(compute)
            unit_s = p.target.seconds_per_unit(p.compute_unit)
            if o.communication and o.link_bytes_per_s and unit_s:
                stage_time += float(traffic.cut_bytes[first] + traffic.cut_bytes[last + 1]) / o.link_bytes_per_s / unit_s
            time_s = None
            if seconds is not None:
                time_s = compute * seconds
                if getattr(model, "layer_time_s", None) is not None:     # roofline seconds (roofline.py)
                    time_s = float(sum(model.layer_time_s[first:last + 1]))
                if o.communication and o.link_bytes_per_s:
                    time_s += float(traffic.cut_bytes[first] + traffic.cut_bytes[last + 1]) / o.link_bytes_per_s
            stages.append(StagePlan(
                stage=index, device=position, first_layer=first, last_layer=last,
                layers=model.layers.names[first:last + 1], in_flight=k,
                capacity_bytes=int(problem.capacity[position]), worst_tile=tile, worst_tile_bytes=int(total[tile]),
                memory_at_worst_tile=sm.at_tile(tile, k), memory_total=sm.summed(k), compute=float(compute),
                time_s=time_s, bytes_received=int(received), bytes_sent=int(sent), time=stage_time))
    feasible = bool(evaluation is not None and evaluation.feasible)
    units = {"time": problem.time_unit, "memory": "bytes" if problem.homogeneous else "fraction of capacity",
             "devices": "devices"}
    # the split's own figures (unrounded) as values; the solver's integer bound converted back
    actual = {"time": max((s.stage_time for s in stages), default=None),
              "memory": max((s.worst_tile_bytes if problem.homogeneous else s.worst_tile_bytes / s.capacity_bytes
                             for s in stages), default=None),
              "devices": len(stages) if stages else None}
    phases = []
    for ph in (result.phases if result else []):
        value = actual[ph.quantity] if ph.value is not None and stages else problem.user_value(ph.quantity, ph.value)
        bound = value if ph.bound is not None and ph.bound == ph.value else problem.user_value(ph.quantity, ph.bound)
        if isinstance(bound, float):
            bound = float(f"{bound:.9g}")
        phases.append(PhaseRecord(PHASE_NAMES[ph.quantity], ph.status, value, bound, ph.gap, round(ph.seconds, 3),
                                  unit=units[ph.quantity], scale=problem.objective_scale(ph.quantity),
                                  solver_value=ph.value, solver_bound=ph.bound, proof=ph.proof))
    status = result.status if result is not None else ("feasible" if feasible else "infeasible")
    profile = {"name": p.info.name, "source": p.info.source, "synthetic": p.info.synthetic,
               "target": p.target.name, "tiles": p.target.tiles, "bytes_per_tile": p.target.bytes_per_tile}
    profile_path = profile_path if profile_path is not None else p.info.path
    if profile_path is not None:
        profile["path"] = str(profile_path)
    if p.info.sha256 is not None:                   # hashed from the bytes as they were read
        profile["sha256"] = p.info.sha256
    elif profile_path is not None:
        profile["sha256"] = file_sha256(profile_path)
    inputs = options_record(o, model.shared, model.layers.options)
    if target_names:
        inputs["targets"] = target_names
    return Plan(profile=profile, inputs=inputs, layer_names=list(model.layers.names), devices=o.devices, method=method,
                status=status, feasible=feasible, message=message, stages=stages, phases=phases,
                compute_unit=p.compute_unit, module_paths=list(model.layers.module_paths),
                notes=[n for n in (schedule_note(o),) if n] + (list(result.notes) if result is not None else []),
                run={"stagesplit": _version(), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                     "solver_seconds": round(result.seconds, 3) if result else 0.0,
                     "phase_seconds": [p.seconds for p in phases]})


def _version() -> str:
    from .. import __version__
    return __version__


def write_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` atomically as JSON, or YAML for a .yaml/.yml path."""
    path = Path(path)
    doc = plan.to_document()
    if path.suffix in (".yaml", ".yml"):
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    else:
        text = json.dumps(doc, indent=1) + "\n"
    atomic_write_text(path, text)


def _stage_layers(r: FieldReader, stage: dict, where: str, default: list[str]) -> list[str]:
    """A stage's layer names as the document lists them (kept as written, so that ``export``
    can reject a hand edit that drops or repeats a layer), else those of its index range."""
    if "layers" not in stage:
        return default
    return [r.string(x, f"{where}.layers[{i}]") for i, x in enumerate(r.list(stage["layers"], f"{where}.layers"))]


def _plan_inputs(r: FieldReader, value: Any) -> dict[str, Any]:
    """The plan's recorded solve inputs, with the fields readers of a plan use type-checked
    (a hand-edited plan must fail with a one-line message, not deep inside a consumer)."""
    inputs = dict(r.mapping(value, "inputs"))
    if inputs.get("headroom") is not None:
        inputs["headroom"] = r.number(inputs["headroom"], "inputs.headroom")
        if inputs["headroom"] >= 1:
            r.fail("inputs.headroom", "a fraction in [0, 1)", inputs["headroom"])
    if inputs.get("micro_batches") is not None:
        inputs["micro_batches"] = r.integer(inputs["micro_batches"], "inputs.micro_batches", minimum=1)
    for key in ("objective", "schedule", "shared"):
        if inputs.get(key) is not None:
            r.string(inputs[key], f"inputs.{key}")
    if inputs.get("layer_grouping") is not None:
        grouping = r.mapping(inputs["layer_grouping"], "inputs.layer_grouping")
        for key, item in grouping.items():
            if item is not None:
                r.string(item, f"inputs.layer_grouping.{key}")
    return inputs


def _breakdown(r: FieldReader, value: Any, where: str) -> MemoryBreakdown:
    values = r.mapping(value if value is not None else {}, where)
    return MemoryBreakdown(**{k: r.integer(values.get(k, 0), f"{where}.{k}", minimum=0) for k in MEMORY_KEYS})


def read_plan(path: str | Path) -> Plan:
    """Read a plan file written by ``write_plan``, validating what ``diagnose`` relies on."""
    from ..common.safeinput import read_document
    path = Path(path)
    doc = read_document(path, "plan")       # opened once, size-capped, strict JSON / safe YAML
    r = FieldReader(str(path))
    r.mapping(doc, "document")
    if doc.get("format") != FORMAT:
        r.fail("format", f'"{FORMAT}"', doc.get("format"))
    if doc.get("version") != VERSION:
        r.fail("version", f"{VERSION} (this stagesplit reads plan version {VERSION})", doc.get("version"))
    names = [r.string(x, f"layers[{i}]") for i, x in enumerate(r.list(r.get(doc, "layers", ""), "layers"))]
    stages = []
    for i, s in enumerate(r.list(r.get(doc, "stages", ""), "stages")):
        p = f"stages[{i}]"
        r.mapping(s, p)
        first = r.integer(r.get(s, "first_layer", p), f"{p}.first_layer")
        last = r.integer(r.get(s, "last_layer", p), f"{p}.last_layer")
        if last < first or last >= len(names):
            r.fail(f"{p}.last_layer", f"a layer index >= first_layer ({first}) and < {len(names)}", last)
        stages.append(StagePlan(
            stage=r.integer(s.get("stage", i), f"{p}.stage"), device=r.integer(s.get("device", i), f"{p}.device"),
            first_layer=first, last_layer=last, layers=_stage_layers(r, s, p, names[first:last + 1]),
            in_flight=r.integer(s.get("in_flight", 1), f"{p}.in_flight", minimum=1),
            capacity_bytes=r.integer(s.get("capacity_bytes", 0), f"{p}.capacity_bytes"),
            worst_tile=r.integer(s.get("worst_tile", 0), f"{p}.worst_tile"),
            worst_tile_bytes=r.integer(s.get("worst_tile_bytes", 0), f"{p}.worst_tile_bytes"),
            memory_at_worst_tile=_breakdown(r, s.get("memory_at_worst_tile"), f"{p}.memory_at_worst_tile"),
            memory_total=_breakdown(r, s.get("memory_total"), f"{p}.memory_total"),
            compute=r.number(s.get("compute", 0.0), f"{p}.compute"),
            time_s=None if s.get("time_s") is None else r.number(s["time_s"], f"{p}.time_s"),
            bytes_received=r.integer(s.get("bytes_received", 0), f"{p}.bytes_received"),
            bytes_sent=r.integer(s.get("bytes_sent", 0), f"{p}.bytes_sent"),
            time=None if s.get("time") is None else r.number(s["time"], f"{p}.time")))
    for prev, cur in zip(stages, stages[1:]):
        if cur.first_layer != prev.last_layer + 1:
            r.fail(f"stages[{cur.stage}].first_layer", f"{prev.last_layer + 1} (stages are contiguous)", cur.first_layer)
    paths = r.list(doc.get("module_paths") or [], "module_paths")
    if paths and len(paths) != len(names):
        r.fail("module_paths", f"one entry per layer ({len(names)})", f"{len(paths)} entries")
    paths = [None if x is None else r.string(x, f"module_paths[{i}]") for i, x in enumerate(paths)]
    run = doc.get("run") if isinstance(doc.get("run"), dict) else {}
    phase_seconds = run.get("phase_seconds") if isinstance(run.get("phase_seconds"), list) else []
    phases = [PhaseRecord(**{k: ph.get(k) for k in ("quantity", "status", "value", "bound", "gap", "unit",
                                                     "solver_value", "solver_bound", "proof") if k in ph},
                          scale=ph.get("scale", 1), seconds=ph.get("seconds") or
                          (phase_seconds[i] if i < len(phase_seconds) else 0.0))
              for i, ph in enumerate(r.list(doc.get("objective", []), "objective")) if isinstance(ph, dict)]
    return Plan(profile=dict(r.mapping(doc.get("profile") or {}, "profile")),
                inputs=_plan_inputs(r, doc.get("inputs") or {}), layer_names=names,
                devices=r.integer(doc.get("devices", len(stages)), "devices", minimum=1),
                method=str(doc.get("method", "")), status=str(doc.get("status", "")),
                feasible=bool(doc.get("feasible", True)), message=str(doc.get("message", "")), stages=stages,
                phases=phases, compute_unit=str(doc.get("compute_unit", "cycles")), run=dict(r.mapping(doc.get("run") or {}, "run")),
                module_paths=paths,
                notes=[r.string(x, f"notes[{i}]") for i, x in enumerate(r.list(doc.get("notes") or [], "notes"))])
