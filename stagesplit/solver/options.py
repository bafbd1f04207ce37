"""Every solve option declared once: its default, its help, its name in a solver settings file
and on the command line, and how the command line reads it.

``SolveRequest`` (solver/request.py) takes each field's default and metadata from here
(``declared``); the command line's solver options, the settings-file reader's list of keys and
the check of configs/solver.yaml are made from these declarations, so an option added here
reaches all of them. This module imports nothing heavy: the command line reads it (through
``stagesplit.api``) to build its parser before anything else is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..common.limits import MAX_CHUNKS_PER_RANK, MAX_DEVICES, MAX_GPUS, MAX_MICRO_BATCHES, MAX_TIME_LIMIT, MAX_WORKERS

__all__ = ["Option", "SCHEDULE_NAMES", "SETTINGS_KEYS", "SOLVE_OPTIONS", "declared", "option_named"]

#: the pipeline schedules by name (solver/request.py's ``Schedule`` values; a test checks they agree)
SCHEDULE_NAMES = ("none", "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev", "auto")


@dataclass(frozen=True)
class Option:
    """One solve option. ``name``: the ``SolveRequest`` field and the API's keyword; ``flag``: its
    command-line name without the leading dashes (None: not on the command line); ``settings``:
    its key in a solver settings file (None: not settable there); ``help``: the command line's
    help, ``{default}`` standing for ``shown_default`` (else the default) and ``{flag:NAME}`` for
    the command line's flag NAME (the command line writes it; no module below it names flags). ``parse`` says how the
    command line reads the value: "int" and "float" within ``low``..``high``, "bytes" (a count with
    an optional unit), "auto_bytes" ("auto", "off" or such a count), "choice" (one of ``choices``), "switch" (present or not), "append" (one
    value per use), "text"; ``cli_default`` is the parser's default (None leaves the settings
    file's value, or the declared default, in force); ``group``: its heading in the help."""

    name: str
    default: Any
    help: str
    flag: str | None = None
    settings: str | None = None
    parse: str = "text"
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    cli_default: Any = None
    group: str = "solver"
    shown_default: str | None = None

    @property
    def help_text(self) -> str:
        shown = self.shown_default if self.shown_default is not None else self.default
        return self.help.replace("{default}", str(shown))


SOLVE_OPTIONS: tuple[Option, ...] = (
    Option("devices", None, "number of devices (pipeline stages); required unless {flag:from-plan}", flag="devices",
           parse="int", metavar="N", low=-2**63, high=MAX_DEVICES),
    Option("targets", (), "device target name or YAML file (default: the profile's device); a comma-separated list "
           "of N targets gives each device its own capacity", flag="target", metavar="T[,T...]"),
    Option("efficiency", 1.0, "achieved over peak FLOP/s on the target (0 < F <= 1, default {default}): FLOP time is "
           "divided by F", flag="efficiency", parse="float", metavar="F", low=0, high=1, low_open=True,
           shown_default="1"),
    Option("objective", "compute", "compute: fastest slowest stage, then least memory (default); memory: least "
           "worst-stage memory, then compute; devices: fewest devices that fit, then compute", flag="objective",
           settings="objective", parse="choice", choices=("compute", "memory", "devices")),
    Option("exact", False, "use exactly N devices (default: at most N)", flag="exact", settings="stages",
           parse="switch"),
    Option("schedule", "none", "pipeline schedule: " + ", ".join(SCHEDULE_NAMES) + "; auto tries each (and 1..4 "
           "chunks per device) and keeps the fastest that fits (default: {default}); several separated by commas (e.g. "
           "1f1b,interleaved-1f1b, the layout search's default) with {flag:layout} auto or {flag:gpus}: each "
           "combination of the layout search under each", flag="schedule",
           settings="schedule", parse="choice", choices=SCHEDULE_NAMES, metavar="SCHEDULE"),
    Option("chunks_per_rank", None, "chunks (virtual stages) per device for the looped and V-shaped schedules "
           "(default: the schedule's: 1 for gpipe and 1f1b, 2 for the others)", flag="chunks-per-rank",
           settings="chunks_per_rank", parse="int", metavar="V", low=1, high=MAX_CHUNKS_PER_RANK),
    Option("recompute", None, "activation recompute per layer: auto (chosen with the split where it pays), none, "
           "selective or full on every layer (default: none where the plan fits without, else auto); needs a "
           "captured profile and a schedule", flag="recompute", settings="recompute", parse="choice",
           choices=("auto", "none", "selective", "full"), metavar="MODE"),
    Option("micro_batches", None, "micro-batches per step (default: the number of devices with {flag:schedule}, "
           "else 1)", flag="micro-batches", settings="micro_batches", parse="int", metavar="M", low=1,
           high=MAX_MICRO_BATCHES),
    Option("dp", 1, "data-parallel ranks: each pipeline stage is replicated on N ranks, each with its own "
           "micro-batches, and every figure is one rank's (default: {default}, no data parallelism)", flag="dp",
           settings="dp", parse="int", metavar="N", low=-2**63, high=MAX_GPUS),
    Option("zero", 0, "with {flag:dp}: 0 replicates (DDP, with its gradient buckets), 1 shards the optimizer state "
           "(ZeRO-1), 2 also the gradients, 3 also the parameters (FSDP2's fully_shard, one group per layer) "
           "(default: {default})", flag="zero", settings="zero", parse="int", metavar="Z", low=-2**63, high=2**63 - 1),
    Option("reshard_after_forward", True, "with {flag:zero} 3: on frees each group's unsharded parameters after its "
           "forward and gathers them again for its backward; off keeps them from the forward to the backward "
           "(default: on)", flag="reshard-after-forward", settings="reshard_after_forward", parse="choice",
           choices=("on", "off"), metavar="on|off"),
    Option("headroom", 0.0, "fraction of every device kept free, e.g. 0.1", flag="headroom", settings="headroom",
           parse="float", metavar="F", low=0, high=1, high_open=True),
    Option("reserve", 0, "memory kept back on every device before layers are placed (CUDA context, cuBLAS/NCCL "
           "workspaces, fragmentation): bytes, or with a unit, e.g. 2GiB or 1.5GB (default: {default})",
           flag="reserve", parse="bytes", metavar="BYTES", cli_default=0),
    Option("runtime_reserve", "auto", "on a GPU, memory kept back on every device for what the profile does not "
           "hold, outside torch's caching allocator: auto prices the CUDA context and NCCL's buffers for the layout "
           "(configs/targets.yaml), off keeps none, or bytes in their place, e.g. 1GiB; added to {flag:reserve} "
           "(default: {default})", flag="runtime-reserve", settings="runtime_reserve", parse="auto_bytes",
           metavar="auto|off|BYTES"),
    Option("allocator", "replay", "on a GPU, replay torch's CUDA caching allocator on each device's allocations in "
           "the schedule's order and check the plan fits what it reserves (with the cuBLAS workspaces): replay "
           "(default) or off", flag="allocator", settings="allocator", parse="choice", choices=("replay", "off")),
    Option("alloc_conf", "", "the PYTORCH_CUDA_ALLOC_CONF the GPUs run with, for the allocator's replay, e.g. "
           "expandable_segments:True or max_split_size_mb:512 (default: torch's defaults)", flag="alloc-conf",
           settings="alloc_conf", metavar="CONF"),
    Option("min_layers", 1, "at least K layers per stage", flag="min-layers", parse="int", metavar="K", low=1,
           high=10**9, cli_default=1),
    Option("max_layers", None, "at most K layers per stage", flag="max-layers", parse="int", metavar="K", low=1,
           high=10**9),
    Option("pin_splits", (), "a stage must start at this layer (name as shown by breakdown); repeatable",
           flag="pin-split", parse="append", metavar="LAYER"),
    Option("pin_layers", (), "this layer must be on this device position (0-based); repeatable", flag="pin-layer",
           parse="append", metavar="LAYER=STAGE"),
    Option("communication", False, "add the transfer time of bytes crossing each cut (over the link bandwidth) to "
           "stage time", flag="communication", settings="communication", parse="switch"),
    Option("link_bandwidth", None, "device-to-device bandwidth", flag="link-bandwidth", parse="float",
           metavar="BYTES_PER_S", low=1, high=1e300),
    Option("time_limit", 60.0, "seconds for the whole search, the exact DP and CP-SAT together (default: {default})",
           flag="time-limit", settings="time_limit", parse="float", metavar="S", low=0, high=MAX_TIME_LIMIT,
           low_open=True, shown_default="60"),
    Option("workers", 1, "CP-SAT workers (default {default}: deterministic)", flag="workers", settings="workers",
           parse="int", metavar="W", low=1, high=MAX_WORKERS),
    Option("shared", "every", "count memory of items with no layer on every stage (default) or on none",
           flag="shared", settings="shared", parse="choice", choices=("every", "none"), group="layer grouping"),
    Option("layer_compute", (), "YAML/JSON mapping of layer name to compute, replacing the profile's figures for "
           "those layers: a number, or {forward, backward, optimizer} measured apart", flag="layer-compute",
           metavar="FILE", group="layer grouping"),
    Option("layer_compute_source", None, "where layer_compute came from (a file path), for the plan's record"),
    Option("compare", False, "compare with what you would do otherwise, each split priced by the same cost model: "
           "on a GPU, Megatron's even layout, DeepSpeed's \"parameters\" and \"uniform\" partitions, torchtitan's "
           "default split and torch pipelining's equal split; on an IPU, PopLiner's greedy and an even split",
           flag="compare", parse="switch", group="solve"),
    Option("unlayered_first", False, "with {flag:compare}, the greedy puts operations with no layer on the first stage "
           "only, as PopLiner does (default: they count as {flag:shared} says, like every other method)",
           flag="unlayered-first", parse="switch", group="solve"),
)

_BY_NAME = {o.name: o for o in SOLVE_OPTIONS}

#: the keys a solver settings file may set, in the order of the declarations
SETTINGS_KEYS: tuple[str, ...] = tuple(o.settings for o in SOLVE_OPTIONS if o.settings)


def option_named(name: str) -> Option:
    return _BY_NAME[name]


def declared(name: str, convert: Callable[[Any], Any] | None = None) -> Any:
    """The ``SolveRequest`` field of option ``name``: its declared default (through ``convert``,
    e.g. an enum, where given) and the declaration as the field's metadata (``"option"``)."""
    o = _BY_NAME[name]
    default = convert(o.default) if convert is not None and o.default is not None else o.default
    return field(default=default, metadata={"option": o})
