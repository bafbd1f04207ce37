"""What the exports read from a plan, read in one place.

``view_of(plan, source)`` checks the plan's structure (every layer in exactly one stage, no
empty stage, stages of consecutive layers in the plan's order, devices increasing) and reads
every field the exports use (``plan.inputs``, ``plan.profile``, layer names, module paths,
stages) into a frozen ``PlanView``. This is the only function that touches ``plan.inputs`` and
``plan.profile`` (the plan's typed records).
Every error is an ``ExportError`` whose message starts with the plan file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..common.text import show
from ..errors import ExportError, OptionError, StagesplitError
from ..io.profile import TrainingPrecision
from ..layers import LayerOptions
from ..model.recompute import Recompute
from ..model.traffic import WideTensor
from ..plan.records import Plan, PlanInputs, PlanProfile, StagePlan

__all__ = ["RECOMPUTE_OPTIONS", "StageView", "PlanView", "view_of"]

#: a layer's recompute options as plans write them (model/recompute.py's ``Recompute``)
RECOMPUTE_OPTIONS = tuple(r.value for r in Recompute)


@dataclass(frozen=True)
class StageView:
    """One stage: its device and its layers (indices into the plan's layer list)."""

    index: int
    device: int
    layers: tuple[int, ...]
    worst_tile_bytes: int
    capacity_bytes: int
    in_flight: int
    #: the memory proportion of the profile variant the stage takes (None: one profile)
    memory_proportion: float | None = None


@dataclass(frozen=True)
class PlanView:
    """The plan as the exports read it. Names and paths are the plan's own (untrusted) text:
    they reach generated code only through ``export.render``."""

    source: str | None                       # the plan file, for messages (None: in memory)
    layer_names: tuple[str, ...]
    module_paths: tuple[str | None, ...]     # one per layer (None: not derivable)
    stages: tuple[StageView, ...]
    profile_name: str | None
    profile_path: str | None
    synthetic: bool
    target: str | None
    tiles: int | None
    sha256: str | None
    objective: str | None
    schedule: str                            # "none", "gpipe", "1f1b", ... as solved
    micro_batches: int
    chunks_per_rank: int                     # chunks (virtual stages) per device; stage k on devices[k]
    headroom: float
    status: str
    split_text: str
    #: the plan's first layer is the embedding / its last layer the head (their names match the
    #: plan's first-/last-layer regexes, e.g. ``embed_tokens`` and ``lm_head`` in a per-layer
    #: profile); a capture folds those into its first and last block instead
    embedding: bool
    head: bool
    #: each plan layer's activation recompute as the plan chose it: "none", "selective", "full"
    recompute: tuple[str, ...] = ()
    #: tensors layers more than one apart use (model/traffic.py's ``WideTensor``)
    wide_tensors: tuple[WideTensor, ...] = ()
    #: the runtime the plan's memory was priced under (plan/records.py's ``RuntimeConditions``)
    return_outputs: bool = False
    gradients_set_to_none: bool = False
    #: the profile is one rank of this many tensor-parallel ranks, with this plan (module path, style)
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    tensor_parallel_styles: tuple[tuple[str, str], ...] = ()
    sequence_parallel_additions: tuple[tuple[str, str], ...] = ()
    #: the profile is one rank of this many context-parallel ranks (the sequence sharded)
    context_parallel: int = 1
    #: the profile is one rank of this many expert-parallel ranks (taken from the data x context ranks)
    expert_parallel: int = 1
    #: data parallelism the plan was priced under: ranks, ZeRO stage, FSDP2's reshard after forward
    data_parallel: int = 1
    zero: int = 0
    reshard_after_forward: bool = True
    #: samples per micro-batch and per step where the plan records them (a layout search's plan);
    #: None: the micro-batch is the profile's own, the global batch unrecorded
    micro_batch_size: int | None = None
    global_batch: int | None = None
    #: the precision the plan was priced in (plan/records.py's ``PlanProfile``): the parameters' dtype
    #: ("" where the profile recorded none), autocast's ("" for none), float32 gradients and master weights
    parameter_dtype: str = ""
    autocast_dtype: str = ""
    master_weights: bool = False

    @property
    def precision_text(self) -> str:
        """The plan's precision in words (io/profile.py's ``TrainingPrecision.describe``)."""
        return TrainingPrecision(self.parameter_dtype, self.autocast_dtype, self.master_weights).describe()

    @property
    def samples_per_micro_batch(self) -> int:
        """The micro-batch size the exports write: the plan's, else 1 (the profile's batch)."""
        return self.micro_batch_size or 1

    @property
    def recomputes(self) -> bool:
        """Whether the plan recomputes any layer."""
        return any(r != "none" for r in self.recompute)

    def decoder_recompute(self) -> tuple[str, ...]:
        """The recompute of the plan's decoder (transformer) layers: its layers less the
        embedding and the head, which no framework checkpoints as a block."""
        return self.recompute[int(self.embedding):len(self.recompute) - int(self.head)]

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(s.device for s in self.stages)

    @property
    def ranks(self) -> int:
        """How many devices (pipeline ranks) the plan runs on."""
        return len(set(self.devices))

    @property
    def memory_proportions(self) -> tuple[float, ...] | None:
        """Each stage's memory proportion when the plan was solved on profile variants (``view_of``
        checks that every stage has one or none has), else None."""
        if self.stages[0].memory_proportion is None:
            return None
        return tuple(float(s.memory_proportion) for s in self.stages if s.memory_proportion is not None)  # all (checked)

    def one_stage_per_device(self, fmt: str) -> None:
        """Refuse (one line) a plan whose devices hold several chunks: ``fmt`` cannot say so."""
        if self.chunks_per_rank > 1 or self.schedule not in ("none", "gpipe", "1f1b"):
            raise self.error(f"{fmt} runs one stage per device with its own pipelining; this plan runs "
                             f"{self.schedule}" + (f" with {self.chunks_per_rank} chunks per device"
                                                   if self.chunks_per_rank > 1 else "")
                             + ": solve with `schedule='1f1b'` (or gpipe) for it")

    @property
    def stage_layers(self) -> tuple[tuple[int, ...], ...]:
        return tuple(s.layers for s in self.stages)

    def error(self, message: str) -> ExportError:
        """An ``ExportError`` naming this plan's file."""
        return ExportError(self.source, message)

    def layer(self, index: int) -> str:
        """Layer ``index``'s name, escaped for a message."""
        return show(self.layer_names[index])

    def decoder_counts(self) -> list[int]:
        """Decoder (transformer) layers per stage: the plan's layers less the embedding and head."""
        counts = [len(s.layers) for s in self.stages]
        counts[0] -= self.embedding
        counts[-1] -= self.head
        return counts


def view_of(plan: Plan, source: str | Path | None = None) -> PlanView:
    """Check ``plan``'s structure and read what the exports need (see the module docstring)."""
    if not isinstance(plan, Plan):
        raise OptionError("plan", f"expected a stagesplit Plan (from solve or read_plan), got {type(plan).__name__}")
    src = None if source is None else str(source)

    def fail(message: str) -> ExportError:
        return ExportError(src, message)

    names = plan.layer_names
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise fail("layers: expected a list of layer names")
    if not plan.stages:
        raise fail("the plan has no stages (no split fitted); nothing to export")
    if not all(isinstance(s, StagePlan) for s in plan.stages):
        raise fail("stages: expected stage records")
    paths = plan.module_paths or [None] * len(names)
    if len(paths) != len(names):
        raise fail(f"module_paths: expected one entry per layer ({len(names)}), got {len(paths)}")
    if not all(p is None or isinstance(p, str) for p in paths):
        raise fail("module_paths: expected strings or null")
    if len(set(names)) != len(names):
        seen: set[str] = set()
        dup = None
        for n in names:                             # the first name met a second time
            if n in seen:
                dup = n
                break
            seen.add(n)
        raise fail(f"the plan's layer list names layer '{show(dup)}' twice")
    index = {n: i for i, n in enumerate(names)}
    where: dict[str, list[int]] = {}
    for k, s in enumerate(plan.stages):
        if s.stage != k:
            raise fail(f"stages[{k}] is numbered {s.stage}: stages must be listed in order 0, 1, 2, ...")
        if not s.layers:
            raise fail(f"stage {k} holds no layer (an empty stage); remove it or give it layers")
        for name in s.layers:
            if name not in index:
                raise fail(f"stage {k} holds layer '{show(name)}', which is not in the plan's layer list")
            where.setdefault(name, []).append(k)
    for name, ks in where.items():
        if len(ks) > 1:
            raise fail(f"layer '{show(name)}' is in more than one stage (stages {', '.join(map(str, ks))})")
    missing = [n for n in names if n not in where]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise fail(f"layer '{show(missing[0])}'{more} is in no stage: the plan would drop it")
    stages = []
    expected = 0
    recompute: list[str] = []
    for k, s in enumerate(plan.stages):
        idx = [index[n] for n in s.layers]
        if idx != list(range(expected, expected + len(idx))):
            shown = ", ".join(show(n) for n in s.layers[:8]) + (", ..." if len(s.layers) > 8 else "")
            raise fail(f"stage {k} holds layers {shown}: expected consecutive layers from "
                       f"'{show(names[expected])}' in the plan's order")
        if (s.first_layer, s.last_layer) != (idx[0], idx[-1]):
            raise fail(f"stage {k}: first_layer..last_layer ({s.first_layer}..{s.last_layer}) disagree with its "
                       f"layers ({idx[0]}..{idx[-1]})")
        options = tuple(s.recompute) if s.recompute else ("none",) * len(idx)
        if len(options) != len(idx) or any(o not in RECOMPUTE_OPTIONS for o in options):
            raise fail(f"stages[{k}].recompute: expected one of {', '.join(RECOMPUTE_OPTIONS)} per layer of the stage "
                       f"({len(idx)}), got {', '.join(show(str(o)) for o in options[:8])}")
        recompute += options
        proportion = s.memory_proportion
        if proportion is not None and (isinstance(proportion, bool) or not isinstance(proportion, (int, float))
                                       or not 0 < proportion <= 1):
            raise fail(f"stage {k}: memory_proportion {show(repr(proportion))}: expected a number in (0, 1]")
        stages.append(StageView(index=k, device=int(s.device), layers=tuple(idx),
                                worst_tile_bytes=int(s.worst_tile_bytes), capacity_bytes=int(s.capacity_bytes),
                                in_flight=int(s.in_flight), memory_proportion=proportion))
        expected += len(idx)
    given = [s.memory_proportion is not None for s in stages]
    if any(given) and not all(given):
        raise fail(f"stage {given.index(False)} has no memory_proportion but stage {given.index(True)} has one: a "
                   "plan solved on profile variants gives every stage its proportion")
    devices = [s.device for s in stages]
    schedule = plan.schedule
    if schedule is not None:                 # chunks (virtual stages) on their schedule's devices
        if tuple(devices) != schedule.chunk_ranks:
            raise fail(f"stage devices {devices} are not the schedule's ({list(schedule.chunk_ranks)})")
    elif devices != sorted(set(devices)) or devices[0] < 0:
        raise fail(f"stage devices {devices} are not increasing: each stage needs its own device, in order")

    profile, inputs = plan.profile, plan.inputs
    if not isinstance(profile, PlanProfile) or not isinstance(inputs, PlanInputs):
        raise fail("profile, inputs: expected the plan's typed records (from solve or read_plan)")
    embedding, head = _roles(src, names, inputs.request.layering)
    return PlanView(
        source=src, layer_names=tuple(names), module_paths=tuple(paths), stages=tuple(stages),
        profile_name=profile.name or None, profile_path=profile.path, synthetic=profile.synthetic,
        target=profile.target or None, tiles=profile.tiles, sha256=profile.sha256,
        objective=inputs.objective.value, schedule=schedule.kind if schedule is not None else inputs.schedule.value,
        micro_batches=schedule.micro_batches if schedule is not None else inputs.micro_batches,
        chunks_per_rank=schedule.chunks_per_rank if schedule is not None else 1,
        headroom=inputs.headroom, status=str(plan.status), split_text=plan.split_text, embedding=embedding,
        head=head, recompute=tuple(recompute), wide_tensors=tuple(getattr(plan, "wide_tensors", ())),
        return_outputs=schedule.runtime.return_outputs if schedule is not None else False,
        gradients_set_to_none=schedule.runtime.gradients_set_to_none if schedule is not None else False,
        tensor_parallel=profile.tensor_parallel, sequence_parallel=profile.sequence_parallel,
        tensor_parallel_styles=profile.tensor_parallel_styles,
        sequence_parallel_additions=profile.sequence_parallel_additions, data_parallel=plan.inputs.request.dp,
        context_parallel=profile.context_parallel, expert_parallel=profile.expert_parallel,
        zero=plan.inputs.request.zero, reshard_after_forward=plan.inputs.request.reshard_after_forward,
        micro_batch_size=getattr(inputs, "micro_batch_size", None), global_batch=getattr(inputs, "global_batch", None),
        parameter_dtype=profile.parameter_dtype, autocast_dtype=profile.autocast_dtype,
        master_weights=profile.master_weights)


def _roles(source: str | None, names: list[str], grouping: LayerOptions) -> tuple[bool, bool]:
    """Whether the first plan layer is the embedding and the last the head, by the plan's own
    first-/last-layer regexes (compiled as layer grouping compiles them: RE2, linear time)."""
    try:
        _, first_re, last_re, _ = grouping.compiled()
    except StagesplitError as exc:
        raise ExportError(source, f"request.layering: {exc}") from None
    if len(names) < 2:
        return False, False
    return bool(first_re.search(names[0])), bool(last_re.search(names[-1]))
