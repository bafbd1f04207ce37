"""A pipeline plan as typed records: the chosen split, what each stage needs, what it was
solved from (``PlanInputs``: the request, recorded once, and what it resolved to), and how the
answer was obtained. ``plan/files.py`` writes and reads it as versioned JSON or YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..common import hooks
from ..common.text import one_line
from ..io.profile import Target
from ..model.stagememory import MemoryBreakdown
from ..model.tied import TiedParameter
from ..model.traffic import WideTensor
from ..solver.problem import SolveOptions, bubble_fraction
from ..solver.request import Objective, Schedule, SharedPolicy, SolveRequest
from ..solver.runtime_reserve import RuntimeReserve
from .text import seconds_text, split_text

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd
    from matplotlib.figure import Figure

    from ..model.costmodel import StageCostModel

__all__ = ["MEMORY_KEYS", "PhaseRecord", "Plan", "PlanInputs", "PlanProfile", "PlanRun", "PlanVariant", "RankRecord",
           "ScheduleCandidate", "ScheduleRecord", "StagePlan"]

MEMORY_KEYS = MemoryBreakdown.keys()
#: the stages frame's columns a notebook shows (``Plan.stages_frame()`` has them all)
HTML_STAGE_COLUMNS = ("device", "target", "first_layer_name", "last_layer_name", "num_layers", "in_flight",
                      "memory_bytes", "capacity_bytes", "headroom", "fits", "compute", "stage_time", "time_s",
                      "bytes_received", "bytes_sent")


@dataclass
class StagePlan:
    """One stage of a plan: its layers, its device, and the memory and time priced for it."""

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
    #: without ``communication``); None in plans written before it was recorded
    time: float | None = None
    #: each of the stage's layers' activation recompute (none / selective / full); empty: none
    recompute: tuple[str, ...] = ()
    #: stash bytes one micro-batch no longer holds thanks to the recompute, and the time it adds
    #: to the stage's backward (in the schedule's time unit)
    recompute_saved_bytes: int = 0
    recompute_time: float = 0.0
    #: solved with profile variants: the memory proportion of the variant whose figures the stage
    #: takes (its IPU's availableMemoryProportion), and that variant's name; None: one profile
    memory_proportion: float | None = None
    variant: str | None = None

    @property
    def recomputed_layers(self) -> int:
        return sum(1 for r in self.recompute if r != "none")

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


@dataclass(frozen=True)
class PlanProfile:
    """The profile a plan was made from: its name and device, and the file and hash it was read
    from (None for a profile built in memory)."""

    name: str = ""
    source: str = ""
    synthetic: bool = False
    target: str = ""                   # the device it was captured on
    tiles: int = 1
    bytes_per_tile: int = 0
    path: str | None = None
    sha256: str | None = None
    #: the profile is one rank of this many tensor-parallel ranks (a capture's ``parallel_layout``): every
    #: pipeline device is a group of that many GPUs, each holding what the profile holds
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    #: the tensor-parallel plan torch applied (module path, style), as the capture recorded it
    tensor_parallel_styles: tuple[tuple[str, str], ...] = ()
    #: what sequence parallelism added to that plan (module path, what), as the capture recorded it
    sequence_parallel_additions: tuple[tuple[str, str], ...] = ()
    #: the profile is one rank of this many context-parallel ranks (each holds a shard of every
    #: sequence; attention as a ring): with the tensor-parallel ranks, each pipeline device is a
    #: group of tensor_parallel x context_parallel GPUs
    context_parallel: int = 1
    #: the profile is one rank of this many expert-parallel ranks (1/ep of the routed experts)
    expert_parallel: int = 1
    #: the precision the profile's step was captured in (io/profile.py's ``TrainingPrecision``): the
    #: parameters' dtype ("" where the profile does not record it), autocast's ("" for none), and
    #: float32 gradients and master weights; the exports set them so that what runs is what was priced
    parameter_dtype: str = ""
    autocast_dtype: str = ""
    master_weights: bool = False

    @property
    def one_tile(self) -> bool:
        """A one-tile device (a GPU): memory is one pool, not per tile."""
        return self.tiles == 1


@dataclass(frozen=True)
class PlanVariant:
    """One profile variant a plan was solved with (``stagesplit solve a.pop=0.2 b.pop=0.6``): the
    name its stages record, the memory proportion it was compiled with, and the file and hash
    it was read from (None for a profile built in memory)."""

    name: str
    proportion: float | None
    path: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class PlanInputs:
    """What the plan was solved from: the ``request`` as the user gave it (the one record of the
    options), and what it resolved to on the profile (``options``: layer indices, capacities,
    the micro-batch count chosen), with each device position's target."""

    request: SolveRequest
    options: SolveOptions
    #: the target of each device position (the profile's own device when none was named)
    targets: tuple[Target, ...] = ()
    #: SHA-256 of the layer-compute file the request names, when it was read from one
    layer_compute_sha256: str | None = None
    #: on a GPU, what the plan keeps back on every device for what the profile does not hold (the CUDA
    #: context, NCCL's buffers: solver/runtime_reserve.py), itemised; ``options.kept_back`` holds its
    #: bytes per device. None: not a GPU, or a plan written before it was recorded
    runtime_reserve: RuntimeReserve | None = None
    #: samples per micro-batch and per step where a layout search chose them (None: not recorded,
    #: the micro-batch is the profile's own)
    micro_batch_size: int | None = None
    global_batch: int | None = None

    # the fields readers of a plan use, by name
    @property
    def objective(self) -> Objective:
        return self.request.objective

    @property
    def schedule(self) -> Schedule:
        return self.request.schedule

    @property
    def micro_batches(self) -> int:
        """The micro-batch count used (the request's, or the one chosen when it gave none)."""
        return self.options.micro_batches

    @property
    def micro_batches_auto(self) -> bool:
        return self.options.micro_batches_auto

    @property
    def headroom(self) -> float:
        return self.request.headroom

    @property
    def communication(self) -> bool:
        return self.request.communication

    @property
    def shared(self) -> SharedPolicy:
        return self.request.shared

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.targets)


@dataclass(frozen=True)
class RankRecord:
    """One device of a scheduled plan: its chunks, its peak memory over the step and where it
    occurs, and how long it is busy."""

    rank: int
    chunks: tuple[int, ...]
    peak_bytes: int
    capacity_bytes: int
    peak_at: str                       # the action at the peak ("F3 of chunk 5", "the optimizer step")
    busy: float                        # time computing in the step (the schedule's time unit)
    #: on a GPU, what torch's caching allocator reserves (solver/schedule_allocator.py): the replay of the
    #: rank's allocations in schedule order with cuBLAS's workspaces, plus what the priced peak holds that
    #: the replay does not (the runtime's buffers); None: not replayed (not a GPU, or the replay off)
    reserved_bytes: int | None = None
    #: the replay's allocated peak (workspaces included), beside ``peak_bytes``
    replayed_bytes: int | None = None
    #: where ``reserved_bytes`` passes the capacity: whether the allocator, freeing cached blocks and
    #: retrying as torch does before it runs out of memory, keeps the rank within it, and how many times
    #: it does so in a step (None: not over, or not replayed)
    fits_after_retries: bool | None = None
    allocator_retries: int | None = None

    @property
    def needed_bytes(self) -> int:
        """What the device must hold: the reserved bytes where replayed, else the priced peak."""
        return self.peak_bytes if self.reserved_bytes is None else self.reserved_bytes

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.capacity_bytes or self.fits_after_retries is True


@dataclass(frozen=True)
class RuntimeConditions:
    """What torch.distributed.pipelining's runtime does that the per-rank memory depends on, as a plan
    priced it: whether ``schedule.step`` keeps every micro-batch's output (``return_outputs``), and
    whether the gradients are freed between steps (``zero_grad(set_to_none=...)``: the plan counts
    them allocated all step when not)."""

    return_outputs: bool = False
    gradients_set_to_none: bool = False


#: the runtime every schedule plan is priced under (solver/chunk_problem.py's rules)
RUNTIME_PRICED = RuntimeConditions()


@dataclass(frozen=True)
class ScheduleRecord:
    """How a plan runs as torch.distributed.pipelining runs its schedule: ``kind`` with
    ``chunks_per_rank`` chunks (virtual stages) per device, the step time and its bubble from
    the schedule simulated, and each device's memory from the schedule's own actions."""

    kind: str
    chunks_per_rank: int
    micro_batches: int
    step_time: float
    time_unit: str                     # "seconds", or the profile's compute unit
    bubble: float
    ranks: tuple[RankRecord, ...]
    #: per chunk: forward, backward (input gradients) and weight-gradient time
    chunk_times: tuple[tuple[float, float, float], ...]
    #: per boundary between chunks c and c + 1: the transfer time of one micro-batch's crossing
    #: (0 on one rank), and per rank its optimizer step: with ``chunk_times``, every duration the
    #: step time was simulated from, so the report draws the solved timeline (empty: not recorded)
    transfer_times: tuple[float, ...] = ()
    optimizer_times: tuple[float, ...] = ()
    #: the runtime the memory was priced under (``RUNTIME_PRICED``), which the torch-pipelining export sets
    runtime: RuntimeConditions = field(default_factory=lambda: RUNTIME_PRICED)

    @property
    def chunk_ranks(self) -> tuple[int, ...]:
        """The device of each chunk, model order."""
        out = [0] * sum(len(r.chunks) for r in self.ranks)
        for r in self.ranks:
            for c in r.chunks:
                out[c] = r.rank
        return tuple(out)


@dataclass(frozen=True)
class ScheduleCandidate:
    """One schedule ``schedule='auto'`` tried, and what it gave."""

    schedule: str
    chunks_per_rank: int
    status: str
    step_time: float | None
    bubble: float | None
    worst_memory: float | None        # the fullest device's share of its capacity
    seconds: float
    note: str = ""


@dataclass(frozen=True)
class PlanRun:
    """How and when the plan was made: not a function of the inputs (a reproduction compares
    everything but this)."""

    stagesplit: str = ""
    created: str = ""
    solver_seconds: float | None = None          # the whole search (DP and CP-SAT); None: not recorded
    phase_seconds: tuple[float, ...] = ()
    #: wall seconds of the exact DP and of CP-SAT (None: that solver did not run, or not recorded)
    dp_seconds: float | None = None
    cpsat_seconds: float | None = None
    #: versions of stagesplit, Python and what the answer depends on (numpy, ortools)
    versions: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Plan:
    """A solve's answer: the split, each stage's figures, the schedule, how it was found and
    proven, and the request and profile it answers (what the plan file records)."""

    profile: PlanProfile
    inputs: PlanInputs
    layer_names: list[str]
    devices: int
    method: str
    status: str
    feasible: bool
    message: str
    stages: list[StagePlan]
    phases: list[PhaseRecord] = field(default_factory=list)
    compute_unit: str = "cycles"
    run: PlanRun = field(default_factory=PlanRun)
    #: each layer's module path from the profile's operation names (None: not derivable);
    #: empty for plans written before module paths were recorded
    module_paths: list[str | None] = field(default_factory=list)
    #: things the user should know about the inputs (e.g. a defaulted micro-batch count)
    notes: list[str] = field(default_factory=list)
    #: not written to the plan file: what the user would do otherwise, priced alongside (``compare``),
    #: and what the command line prints as warnings
    baselines: list[Plan] = field(default_factory=list, repr=False, compare=False)
    warnings: list[str] = field(default_factory=list, repr=False, compare=False)
    #: the cost model the plan was solved on (for plots and reports); None for a plan read from a file
    analysis: StageCostModel | None = field(default=None, repr=False, compare=False)
    #: parameters several layers use (tied embeddings), by layer index
    tied: tuple[TiedParameter, ...] = ()
    #: tensors layers more than one apart use (model/traffic.py): what a traced split sends past a stage
    wide_tensors: tuple[WideTensor, ...] = ()
    #: how the plan runs under a pipeline schedule's own actions (None: a stage-level plan, one
    #: stage per device with its in-flight micro-batches)
    schedule: ScheduleRecord | None = None
    #: with ``schedule='auto'``: every schedule tried (the plan is the best of them)
    candidates: tuple[ScheduleCandidate, ...] = ()
    #: the profile variants it was solved with (each stage records the one it takes); empty: one
    #: profile (``profile``, which with variants is the first variant's)
    variants: tuple[PlanVariant, ...] = ()
    #: not written to the plan file: with profile variants, each variant's cost model by name (for
    #: plots and reports; ``analysis`` is the first's); empty for a plan read from a file
    variant_models: dict[str, StageCostModel] = field(default_factory=dict, repr=False, compare=False)

    def stage_model(self, stage: StagePlan) -> StageCostModel | None:
        """The cost model ``stage`` was priced with: its profile variant's, else ``analysis``
        (None for a plan read from a file)."""
        if stage.variant is not None and stage.variant in self.variant_models:
            return self.variant_models[stage.variant]
        return self.analysis

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

    def tied_across_stages(self) -> list[tuple[TiedParameter, tuple[int, ...]]]:
        """The tied parameters whose layers this split puts on different stages, with those stages."""
        stage_of = {layer: s.stage for s in self.stages for layer in range(s.first_layer, s.last_layer + 1)}
        out = []
        for t in self.tied:
            stages = tuple(sorted({stage_of[layer] for layer in t.layers if layer in stage_of}))
            if len(stages) > 1:
                out.append((t, stages))
        return out

    # -- text ----------------------------------------------------------------------------------
    def status_line(self) -> str:
        """The status, which solver proved each phase and how long the search took, each solver's
        share when both ran (a second line for a note)."""
        if not self.feasible:
            return f"status: {self.status} - {self.message}"
        phases = "; ".join(f"{p.quantity} {p.status.lower()}" + (f" (gap {100 * p.gap:.2f}%)" if p.gap else "")
                           for p in self.phases)
        by = {"dp": [p.quantity for p in self.phases if p.proof == "dp"],
              "cp-sat": [p.quantity for p in self.phases if p.proof != "dp"]}
        if self.status != "optimal":
            proven = "NOT proven optimal"
        elif not by["cp-sat"]:
            proven = "proven optimal by the exact DP"
        elif not by["dp"]:
            proven = "proven optimal by CP-SAT"
        else:
            proven = (f"proven optimal by the exact DP ({', '.join(by['dp'])}) and CP-SAT "
                      f"({', '.join(by['cp-sat'])})")
        text = f"status: {self.status}, {proven}"
        run = self.run
        if run.solver_seconds is not None:
            text += f" in {run.solver_seconds:.2f} s"
            if run.dp_seconds is not None and run.cpsat_seconds is not None:
                text += f" (exact DP {run.dp_seconds:.2f} s, CP-SAT {run.cpsat_seconds:.2f} s)"
        text += f" [{phases}]" if phases else ""
        if self.message:
            text += f"\nnote: {self.message}"
        return text

    def summary(self, micro_batches: int = 1, gpu: bool = False) -> str:
        """The plan in a few lines; names from the input (layers, notes) are escaped, so each
        line stays one line whatever the names hold."""
        lines = [f"split: {self.short_split_text(200)}" if self.stages else "split: none",
                 *self.status_line().split("\n")]
        lines += [f"note: {n}" for n in self.notes]
        if self.stages and self.schedule is not None:
            lines += self._schedule_lines(gpu)
        elif self.stages:
            b = self.bottleneck
            w = self.worst_memory
            assert b is not None and w is not None          # a plan with stages has both
            lines.append(f"bottleneck: stage {b.stage} (layers {b.layers[0]}..{b.layers[-1]}): "
                         f"{self.time_text(b.stage_time, b.time_s)}"
                         + (" with transfers" if self.inputs.communication else ""))
            where = (f"{w.worst_tile_bytes / 2**30:,.2f} of {w.capacity_bytes / 2**30:,.2f} GiB" if gpu else
                     f"{w.worst_tile_bytes:,} of {w.capacity_bytes:,} bytes on tile {w.worst_tile}")
            lines.append(f"memory: fullest stage {w.stage} uses {where} "
                         f"({w.worst_tile_bytes / w.capacity_bytes:.1%}); {len(self.stages)} of {self.devices} "
                         f"devices used")
            if len(self.stages) < self.devices and self.inputs.schedule == Schedule.ONE_F_ONE_B:
                lines.append("note: with 1F1B, stage s of P holds min(M, P - s) micro-batches, so more stages put "
                             "more stashed activations on the first ones; here more devices do not fit or do not help")
            balance = self.pipeline_efficiency(1) / (1 - bubble_fraction(len(self.stages), 1))
            text = f"compute balance: {balance:.1%} (mean stage compute / bottleneck)"
            if micro_batches > 1:
                text += (f"; pipeline efficiency with {micro_batches} micro-batches: "
                         f"{self.pipeline_efficiency(micro_batches):.1%} (bubble "
                         f"{bubble_fraction(len(self.stages), micro_batches):.1%})")
            lines.append(text)
        return "\n".join(one_line(line) for line in lines)

    def _schedule_lines(self, gpu: bool) -> list[str]:
        s = self.schedule
        assert s is not None                                # only a plan under a schedule has these lines
        unit = s.time_unit
        step = seconds_text(s.step_time) if unit == "seconds" else f"{s.step_time:.4g} {unit}"
        lines = [f"step: {step} for {s.micro_batches} micro-batches with {s.kind}"
                 + (f", {s.chunks_per_rank} chunks per device" if s.chunks_per_rank > 1 else "")
                 + f" (bubble {s.bubble:.1%}, the schedule simulated)"]
        fullest = max(s.ranks, key=lambda r: (r.peak_bytes / max(r.capacity_bytes, 1), -r.rank))

        def amount(n: int) -> str:
            return f"{n / 2**30:,.2f} GiB" if gpu else f"{n:,} bytes"
        lines.append(f"memory: fullest device {fullest.rank} peaks at {amount(fullest.peak_bytes)} of "
                     f"{amount(fullest.capacity_bytes)} ({fullest.peak_bytes / max(fullest.capacity_bytes, 1):.1%}) "
                     f"at {fullest.peak_at}; per device: "
                     + ", ".join(f"{r.peak_bytes / max(r.capacity_bytes, 1):.0%}" for r in s.ranks)
                     + f"; {len(s.ranks)} of {self.devices} devices used")
        replayed = [r for r in s.ranks if r.reserved_bytes is not None and r.replayed_bytes is not None]
        if replayed:
            most = max(replayed, key=lambda r: (r.needed_bytes / max(r.capacity_bytes, 1), -r.rank))
            assert most.reserved_bytes is not None and most.replayed_bytes is not None
            left = most.capacity_bytes - most.needed_bytes
            lines.append(f"reserved: torch's caching allocator, replayed on each device's allocations in the "
                         f"schedule's order with cuBLAS's workspaces, reserves at most {amount(most.needed_bytes)} "
                         f"on device {most.rank} ({most.needed_bytes / max(most.capacity_bytes, 1):.1%} of "
                         f"{amount(most.capacity_bytes)}; the replay allocates {amount(most.replayed_bytes)}, "
                         f"the plan priced {amount(most.peak_bytes)}); "
                         + (f"{amount(left)} left" if left >= 0 else
                            f"{amount(-left)} over, but freeing cached blocks and retrying, as torch does before it "
                            f"runs out of memory, keeps it within ({most.allocator_retries} retries a step, each a "
                            f"synchronising cudaFree)" if most.fits_after_retries else
                            f"does not fit by {amount(-left)}")
                         + "; per device: " + ", ".join(f"{r.needed_bytes / max(r.capacity_bytes, 1):.0%}"
                                                        for r in s.ranks))
        return lines

    def time_text(self, compute: float, seconds: float | None) -> str:
        """A stage time in the plan's compute unit, with seconds where known."""
        if seconds is not None:
            return f"{compute:.4g} {self.compute_unit} ({seconds_text(seconds)})"
        return f"{compute:.4g} {self.compute_unit}"

    # -- pictures (drawn by stagesplit.reporting, bound through common/hooks.py) ---------------
    def plot(self) -> Figure:
        """The plan as a matplotlib Figure: each stage's memory by category against its
        capacity (and, on an IPU, its tiles), and each stage's time (``stagesplit.plot``)."""
        figure: Figure = hooks.call("plan.plot", self)
        return figure

    def report(self, path: str | Path, profile: Any = None) -> None:
        """Write the plan as one self-contained HTML page to ``path`` (``stagesplit.report``)."""
        hooks.call("plan.report", self, path, profile)

    # -- notebooks (pandas is imported only here) -----------------------------------------------
    def stage_target(self, stage: StagePlan) -> str:
        """The name of the device target a stage runs on: the plan's per-position targets when
        it was solved for named (possibly mixed) targets, else the profile's own device."""
        targets = self.inputs.targets
        if 0 <= stage.device < len(targets):
            return targets[stage.device].name
        return self.profile.target

    def stages_frame(self) -> pd.DataFrame:
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

    def layers_frame(self) -> pd.DataFrame:
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
        summary = self.summary(self.inputs.micro_batches, gpu=self.profile.one_tile)
        title = f"stagesplit plan ({self.method}) of {self.profile.name or 'a profile'}: " \
                f"{len(self.layer_names)} layers on {self.devices} devices"
        table = self.stages_frame()[list(HTML_STAGE_COLUMNS)].to_html() if self.stages else ""
        return html_summary(title, summary.splitlines(), table)
