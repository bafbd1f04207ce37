"""The command line's grammar: every command, its arguments and their syntax (numbers in
range, byte counts with units). Values are checked by the options record and the API; this
module only parses."""

from __future__ import annotations

import argparse
import re

from ..common.guards import float_in, int_in
from ..common.limits import MAX_CHUNKS_PER_RANK, MAX_DEVICES, MAX_MICRO_BATCHES, MAX_TIME_LIMIT, MAX_WORKERS
from ..common.versions import VERSION
from ..errors import StagesplitError

__all__ = ["FLAGS", "SCHEDULES", "build_parser"]

#: the --schedule choices (solver/request.py's Schedule values; tests check they agree)
SCHEDULES = ("none", "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev", "auto")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, like every other error
        command = self.prog.removeprefix("stagesplit").strip()
        raise StagesplitError(f"{command}: {message}" if command else message)


def _count(text: str) -> int:
    """A non-negative integer option value."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got '{text}'")
    return value


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
               "gib": 2**30, "tib": 2**40}


def _byte_count(text: str) -> int:
    """A byte count >= 0: a whole number, or a number with a unit (KB, MB, GB, KiB, MiB, GiB...)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text[:40])
    unit = m.group(2).lower() if m else None
    if not m or unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, optionally with a unit (e.g. 2GiB), "
                                         f"got '{text[:40]}'")
    value = float(m.group(1)) * _BYTE_UNITS[unit]
    if value > 2**62:
        raise argparse.ArgumentTypeError(f"expected at most {2**62:,} bytes, got '{text[:40]}'")
    return int(value)


# -- shared option groups ---------------------------------------------------------------------------

def _add_profile(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("profile", nargs="?" if optional else None,
                   help="profile: stagesplit JSON, compact .stagesplit, or PopVision profile.pop")
    p.add_argument("debug_cbor", nargs="?", metavar="DEBUG", help="debug.cbor (with a profile.pop only)")


def _add_layer_options(p: argparse.ArgumentParser) -> None:
    from ..layers import (DEFAULT_CALL_REGEX, DEFAULT_FIRST_LAYER_REGEX, DEFAULT_LAST_LAYER_REGEX,
                         DEFAULT_LAYER_REGEX)
    g = p.add_argument_group("layer grouping")
    g.add_argument("--layer-regex", default=DEFAULT_LAYER_REGEX, metavar="RE",
                   help="regex whose capture group names an operation's layer (default: %(default)s)")
    g.add_argument("--first-layer-regex", default=DEFAULT_FIRST_LAYER_REGEX, metavar="RE",
                   help="operations whose name or inputs match join the first layer (default: %(default)s)")
    g.add_argument("--last-layer-regex", default=DEFAULT_LAST_LAYER_REGEX, metavar="RE",
                   help="operations whose name or inputs match join the last layer (default: %(default)s)")
    g.add_argument("--call-regex", default=DEFAULT_CALL_REGEX, metavar="RE",
                   help="unlayered operations named like this join the following layer (default: %(default)s)")
    g.add_argument("--layer-order", choices=("steps", "natural"), default="steps",
                   help="order layers by program steps or by natural sort of their names")
    g.add_argument("--shared", choices=("every", "none"), default=None,
                   help="count memory of items with no layer on every stage (default) or on none")
    g.add_argument("--layer-compute", metavar="FILE",
                   help="YAML/JSON mapping of layer name to compute, replacing the profile's figures for those layers")


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "csv", "tsv", "json"), default="text", help="output format")
    p.add_argument("--out", metavar="FILE", help="write the output to FILE (atomically) instead of stdout")
    _add_wide(p)


def _add_wide(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wide", action="store_true",
                   help="show every table column (by default text tables in a terminal leave out the columns it "
                        "cannot fit and say which)")


def _add_solver_options(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    g = p.add_argument_group("solver")
    if sweep:
        g.add_argument("--devices", required=True, metavar="RANGE",
                       help="device counts: a range like 1..16 or a list like 2,4,8")
    else:
        g.add_argument("--devices", type=int_in(-2**63, MAX_DEVICES), metavar="N",
                       help="number of devices (pipeline stages); required unless --from-plan")
    g.add_argument("--target", metavar="T[,T...]",
                   help="device target name or YAML file (default: the profile's device); a comma-separated list "
                        "of N targets gives each device its own capacity")
    _add_efficiency(g)
    g.add_argument("--objective", choices=("compute", "memory", "devices"),
                   help="compute: fastest slowest stage, then least memory (default); memory: least worst-stage "
                        "memory, then compute; devices: fewest devices that fit, then compute")
    g.add_argument("--exact", action="store_true", default=None, help="use exactly N devices (default: at most N)")
    g.add_argument("--schedule", choices=SCHEDULES, metavar="SCHEDULE",
                   help="pipeline schedule: " + ", ".join(SCHEDULES) + "; auto tries each (and 1..4 chunks per "
                        "device) and keeps the fastest that fits (default: none)")
    g.add_argument("--chunks-per-rank", type=int_in(1, MAX_CHUNKS_PER_RANK), metavar="V",
                   help="chunks (virtual stages) per device for the looped and V-shaped schedules (default: the "
                        "schedule's: 1 for gpipe and 1f1b, 2 for the others)")
    g.add_argument("--recompute", choices=("auto", "none", "selective", "full"), metavar="MODE",
                   help="activation recompute per layer: auto (chosen with the split where it pays), none, "
                        "selective or full on every layer (default: none where the plan fits without, else auto); "
                        "needs a captured profile and a schedule")
    g.add_argument("--micro-batches", type=int_in(1, MAX_MICRO_BATCHES), metavar="M",
                   help="micro-batches per step (default: the number of devices with --schedule, else 1)")
    g.add_argument("--headroom", type=float_in(0, 1, high_open=True), metavar="F",
                   help="fraction of every device kept free, e.g. 0.1")
    g.add_argument("--reserve", type=_byte_count, default=0, metavar="BYTES",
                   help="memory kept back on every device before layers are placed (CUDA context, cuBLAS/NCCL "
                        "workspaces, fragmentation): bytes, or with a unit, e.g. 2GiB or 1.5GB (default: 0)")
    g.add_argument("--min-layers", type=int_in(1, 10**9), default=1, metavar="K", help="at least K layers per stage")
    g.add_argument("--max-layers", type=int_in(1, 10**9), metavar="K", help="at most K layers per stage")
    g.add_argument("--pin-split", action="append", default=[], metavar="LAYER",
                   help="a stage must start at this layer (name as shown by breakdown); repeatable")
    g.add_argument("--pin-layer", action="append", default=[], metavar="LAYER=STAGE",
                   help="this layer must be on this device position (0-based); repeatable")
    g.add_argument("--communication", action="store_true", default=None,
                   help="add the transfer time of bytes crossing each cut (over the link bandwidth) to stage time")
    g.add_argument("--link-bandwidth", type=float_in(1, 1e300), metavar="BYTES_PER_S",
                   help="device-to-device bandwidth")
    g.add_argument("--time-limit", type=float_in(0, MAX_TIME_LIMIT, low_open=True), metavar="S",
                   help="seconds for the whole search, the exact DP and CP-SAT together (default: 60)")
    g.add_argument("--workers", type=int_in(1, MAX_WORKERS), metavar="W",
                   help="CP-SAT workers (default 1: deterministic)")
    g.add_argument("--config", metavar="FILE", help="solver settings YAML (default: configs/solver.yaml)")


def _add_efficiency(g) -> None:
    g.add_argument("--efficiency", type=float_in(0, 1, low_open=True), metavar="F",
                   help="achieved over peak FLOP/s on the target (0 < F <= 1, default 1): FLOP time is divided by F")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="stagesplit", description="Pipeline-stage partition advisor: where to split a model "
                     "that does not fit on one accelerator.")
    parser.add_argument("--version", action="version", version=f"stagesplit {VERSION}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common.add_argument("--progress", action="store_true",
                        help="show progress on stderr even when it is not a terminal")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    p = command("breakdown", help="memory and compute by layer (and on request by operation, category and tile)")
    _add_profile(p)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--sections", metavar="LIST",
                   help="comma-separated sections, or 'all': summary,grouping,operations,layers,totals,tiles,affinity,"
                        "communication (default: summary,layers)")
    p.add_argument("--top-tiles", type=_count, default=10, metavar="N", help="how many of the most loaded tiles to list")
    p.add_argument("--ipu-columns", action="store_true",
                   help="on a GPU target, still show bytes, the tiles section and the code columns")
    p.add_argument("--target", metavar="T", help="device target name or YAML file whose rates give the time columns "
                   "(default: the profile's device)")
    _add_efficiency(p)

    p = command("solve", help="optimal split points for N devices (CP-SAT), with a plan file and plots")
    p.add_argument("profile", nargs="*", metavar="PROFILE",
                   help="profile: stagesplit JSON, compact .stagesplit, or PopVision profile.pop (its debug.cbor "
                        "after it); or profile variants of one model compiled at different memory proportions, "
                        "each stage taking the one that suits it: PROFILE=PROPORTION words (a.pop=0.2 b.pop=0.6) "
                        "or a variants file (.yaml)")
    _add_solver_options(p)
    p.add_argument("--from-plan", metavar="PLAN",
                   help="run the request recorded in PLAN again (on its recorded profile unless one is given) and "
                        "report whether the split is identical (exit 1 if not)")
    _add_layer_options(p)
    p.add_argument("--compare", action="store_true",
                   help="compare with what you would do otherwise, each split priced by the same cost model: on a "
                        "GPU, Megatron's even layout, DeepSpeed's \"parameters\" and \"uniform\" partitions, "
                        "torchtitan's default split and torch pipelining's equal split; on an IPU, PopLiner's greedy "
                        "and an even split")
    p.add_argument("--unlayered-first", action="store_true",
                   help="with --compare, the greedy puts operations with no layer on the first stage only, "
                        "as PopLiner does (default: they count as --shared says, like every other method)")
    p.add_argument("--ipu-columns", action="store_true",
                   help="on a GPU target, still show bytes and the per-tile and code columns")
    p.add_argument("--format", choices=("text", "json"), default="text", help="summary format on stdout")
    _add_wide(p)
    p.add_argument("--out", metavar="PLAN", help="write the plan (.json, or .yaml/.yml) atomically")
    p.add_argument("--plot", metavar="FILE", help="write per-stage memory and compute plots (.png or .svg)")

    p = command("sweep", help="how few devices can I use? solve for a range of device counts")
    _add_profile(p)
    _add_solver_options(p, sweep=True)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--plot", metavar="FILE", help="plot bottleneck compute and memory against devices (.png/.svg)")

    p = command("diagnose", help="bottleneck tile and step, live variables, ground truth, grouping health")
    _add_profile(p)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--plan", metavar="PLAN", help="diagnose each stage of this plan (from solve --out)")
    p.add_argument("--layers", metavar="FIRST:LAST", help="diagnose one stage holding these layers (names)")
    p.add_argument("--top", type=_count, default=10, metavar="N", help="how many live variables to list")
    p.add_argument("--window", type=_count, default=5, metavar="W", help="steps to show either side of the peak")
    p.add_argument("--plot", metavar="FILE", help="liveness plot of the fullest stage's bottleneck tile (.png/.svg)")

    p = command("convert", help="convert a profile (e.g. profile.pop + debug.cbor) to JSON or compact form")
    _add_profile(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output: .stagesplit or .npz for the compact form, anything else for JSON")

    p = command("import", help="import an ONNX model as a profile (needs pip install 'stagesplit[onnx]', or "
                               "'.[onnx]' in a checkout)")
    p.add_argument("model", metavar="MODEL.onnx", help="ONNX model (external data files next to it)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output: .stagesplit or .npz for the compact form, anything else for JSON")
    p.add_argument("--batch", type=int_in(1, 2**40), metavar="N", help="bind each input's symbolic first dimension")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="bind a symbolic dimension by name; repeatable")
    p.add_argument("--training", choices=("adam", "sgd", "none"), default="adam",
                   help="adam: gradients + 2 fp32 moments per parameter, backward = 2x forward compute; sgd: "
                        "gradients only; none: inference (default: %(default)s)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                   help="element type of floating tensors (default: as stored in the model)")
    p.add_argument("--target", default="a100-80gb", help="device target name or YAML file (default: %(default)s)")
    p.add_argument("--name", help="profile name (default: the file's stem)")
    _add_layer_options(p)

    p = command("synth", help="generate a synthetic profile (labelled synthetic)")
    p.add_argument("family", choices=("bert-base", "bert-large", "gpt", "cnn"))
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument("--target", default="ipu-mk2", help="device target (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="number of encoder/decoder layers (bert-base, gpt)")
    p.add_argument("--piece-bytes", type=int, help="split tensors into lowered variables of about this size")
    p.add_argument("--programs-per-op", type=int, help="forward programs (liveness steps) per operation")

    from ..exporters import FORMATS
    p = command("export", help="write a plan's split in a training framework's own form (snippet or config)",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="formats:\n" + "\n".join(f"  {f.name:<17} {f.description}" for f in FORMATS.values()))
    p.add_argument("plan", metavar="PLAN", help="plan file from solve --out (.json or .yaml)")
    p.add_argument("--to", required=True, choices=tuple(FORMATS), metavar="FORMAT",
                   help="one of: " + ", ".join(FORMATS))
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    p.add_argument("--inference", action="store_true", help="inference options: no gradient accumulation; the device "
                   "iterations or batches per step that pipelined inference needs")
    p.add_argument("--model", default="model", metavar="NAME", help="the model's dotted Python name in snippets "
                   "(default: %(default)s)")

    p = command("capture", help="record a PyTorch training step's memory and FLOPs on CPU (fake tensors) as a profile",
                description="Run one training step (forward, loss, backward, optimizer step) of a PyTorch model "
                "under torch's FakeTensorMode on the CPU: no real memory is allocated and no GPU is needed. Every "
                "aten operation is one program step; every tensor storage a variable with its bytes and live "
                "interval. Parameters, buffers, gradients and optimizer state are always live. Writes the full "
                "form (one tile holding the target's memory) with FLOPs as compute. Needs pip install "
                "'stagesplit[torch]' (in a checkout of stagesplit: pip install '.[torch]').")
    p.add_argument("model", metavar="MODEL",
                   help="path/to/file.py:function or package.module:function; the function takes no arguments and "
                        "returns (model, inputs) or (model, inputs, loss_fn); inputs: a tensor, a tuple of arguments "
                        "or a dict of keyword arguments; build the model on torch.device('meta') or under "
                        "FakeTensorMode (a real model works too). Without loss_fn the loss is the output's sum")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output profile: .stagesplit (compact, recommended) or .json; written atomically")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd", "none"), default="adam",
                   help="optimizer whose state is always live: adam/adamw (two states per parameter), sgd (momentum "
                        "0.9: one), none (default: %(default)s)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="dtype of the parameters and floating-point inputs (with --amp: the autocast dtype) "
                        "(default: %(default)s)")
    p.add_argument("--amp", action="store_true",
                   help="mixed precision: parameters, gradients and optimizer state stay float32 and the forward "
                        "runs under torch.autocast in --dtype (bfloat16 when --dtype is float32)")
    p.add_argument("--target", metavar="NAME|FILE",
                   help="device the profile is for: a shipped target name or a YAML file (default: a100-80gb)")
    p.add_argument("--layer-regex", metavar="RE",
                   help="regex whose capture group names a block in the module paths, instead of the default: the "
                        "repeated blocks of the model's nn.ModuleList/nn.Sequential stacks, by module path. Either way "
                        "the grouping is recorded in the profile, so later commands need no --layer-regex")
    p.add_argument("--allocator-round", type=int_in(1, 2**30), default=512, metavar="BYTES",
                   help="round every storage up to a multiple of BYTES, as the CUDA caching allocator does "
                        "(default: %(default)s; 1 for exact bytes)")
    p.add_argument("--name", metavar="NAME", help="profile name shown in reports (default: from MODEL)")

    p = command("report", help="write a plan as one self-contained HTML page to share (figures, schedule, snippets)")
    p.add_argument("plan", metavar="PLAN", help="plan file from solve --out (.json or .yaml)")
    p.add_argument("profile", nargs="?", metavar="PROFILE",
                   help="the profile the plan was solved on: adds why the split binds, per-layer figures and the "
                        "comparison with the frameworks' defaults")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write (atomically)")

    p = command("targets", help="list the shipped device targets")
    _add_output(p)
    return parser


#: the Python API's parameter names (errors.OptionError.parameter) as command-line flags
FLAGS = {"devices": "--devices", "targets": "--target", "target": "--target", "objective": "--objective",
         "schedule": "--schedule", "micro_batches": "--micro-batches", "chunks_per_rank": "--chunks-per-rank", "recompute": "--recompute", "headroom": "--headroom",
         "reserve": "--reserve", "min_layers": "--min-layers", "max_layers": "--max-layers",
         "pin_splits": "--pin-split", "pin_layers": "--pin-layer", "communication": "--communication",
         "link_bandwidth": "--link-bandwidth", "efficiency": "--efficiency", "shared": "--shared",
         "layer_compute": "--layer-compute", "time_limit": "--time-limit", "workers": "--workers",
         "plan": "--plan", "layers": "--layers", "top": "--top", "window": "--window",
         "layer_regex": "--layer-regex", "first_layer_regex": "--first-layer-regex",
         "last_layer_regex": "--last-layer-regex", "call_regex": "--call-regex", "layer_order": "--layer-order",
         "exact": "--exact", "compare": "--compare", "unlayered_first": "--unlayered-first",
         "batch": "--batch", "dims": "--dim", "training": "--training", "dtype": "--dtype", "name": "--name",
         "seed": "--seed", "piece_bytes": "--piece-bytes", "programs_per_op": "--programs-per-op",
         "family": "FAMILY", "output": "--output", "model": "--model", "profile": "PROFILE", "debug": "DEBUG",
         "plan_path": "--from-plan", "out": "--out", "plot": "--plot", "events": "events"}


