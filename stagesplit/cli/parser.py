"""The command line's grammar: every command, its arguments and their syntax (numbers in
range, byte counts with units). Values are checked by the options record and the API; this
module only parses. The solver's options are made from their declarations (``api.SOLVE_OPTIONS``,
solver/options.py); building the parser loads nothing heavy (no numpy): ``--help`` is quick."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

from .. import api
from ..errors import StagesplitError, one_line

__all__ = ["FLAGS", "SCHEDULES", "build_parser", "command_word", "flag_text"]

#: the --schedule choices (solver/request.py's Schedule values; tests check they agree)
SCHEDULES = api.SCHEDULE_NAMES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, like every other error
        command = self.prog.removeprefix("stagesplit").strip()
        raise StagesplitError(f"{command}: {message}" if command else message)

    def format_help(self) -> str:
        # an epilog given as a function (the export formats) is made only when the help is shown
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


class _Later:
    """Choices made only when first read (the export formats: loading the exporters is what the
    rest of the command line does not pay for)."""

    def __init__(self, make: Callable[[], tuple[str, ...]]) -> None:
        self._make = make
        self._items: tuple[str, ...] | None = None

    def _all(self) -> tuple[str, ...]:
        if self._items is None:
            self._items = self._make()
        return self._items

    def __contains__(self, item: object) -> bool:
        return item in self._all()

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def degrees(text: str) -> int | list[int]:
    """An argparse type: one tensor-parallel degree, or a comma-separated list of them (1..4096)."""
    one = int_in(1, 4096)
    parts = text.split(",")
    if len(parts) == 1:
        return one(text)
    if len(parts) > 64:
        raise argparse.ArgumentTypeError(f"expected at most 64 degrees, got {len(parts)}")
    return [one(part) for part in parts]


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number in lo..hi."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip()) if len(text) <= 30 else None
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            bounds = f"<= {hi:,}" if lo <= -2**63 else f"in {lo}..{hi:,}"
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, got {one_line(text)[:40]!r}")
        return value
    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float, *, low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in the interval (brackets as given)."""
    left, right = "(" if low_open else "[", ")" if high_open else "]"

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > lo if low_open else value >= lo) and \
            (value < hi if high_open else value <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected a finite number in {left}{lo:g}, {hi:g}{right}, "
                                             f"got {one_line(text)[:40]!r}")
        return value
    parse.__name__ = "number"
    return parse


def flag_text(text: str) -> str:
    """A declaration's text with each ``{flag:NAME}`` written as the flag ``--NAME``."""
    return re.sub(r"\{flag:([a-z-]+)\}", lambda m: "--" + m.group(1), text)


def _solve_option(g: Any, name: str, help: str | None = None, several: bool = False) -> None:
    """The command-line argument of the solve option ``name``, as declared (solver/options.py);
    ``help``: what it does where a command reads it otherwise (layouts' compare); ``several``: a
    choice that takes several of its values separated by commas (the layout search's schedules)."""
    o = api.solve_option(name)
    kw: dict[str, Any] = {"help": help or flag_text(o.help_text)}
    if o.metavar:
        kw["metavar"] = o.metavar
    if o.parse == "int":
        assert o.low is not None and o.high is not None        # a number option declares its range
        kw["type"] = int_in(int(o.low), int(o.high))
    elif o.parse == "float":
        assert o.low is not None and o.high is not None
        kw["type"] = float_in(o.low, o.high, low_open=o.low_open, high_open=o.high_open)
    elif o.parse == "bytes":
        kw["type"] = _byte_count
    elif o.parse == "auto_bytes":
        kw["type"] = _auto_or_byte_count
    elif o.parse == "choice" and several:
        kw["type"] = _several_of(tuple(o.choices or ()))
        kw["metavar"] = f"{o.metavar or 'VALUE'}[,{o.metavar or 'VALUE'}...]"
    elif o.parse == "choice":
        kw["choices"] = o.choices
    elif o.parse == "switch":
        kw.update(action="store_true", default=None)
    elif o.parse == "append":
        kw.update(action="append", default=[])
    if o.cli_default is not None:
        kw["default"] = o.cli_default
    assert o.flag is not None                                  # an option on the command line has its flag
    g.add_argument("--" + o.flag, **kw)


def _solve_options(g: Any, group: str, skip: tuple[str, ...] = ()) -> None:
    """Every declared solve option of ``group`` that has a flag, in the order declared; the schedule
    takes a list separated by commas, for the layout search (--layout auto, sweep --gpus) only."""
    for o in api.SOLVE_OPTIONS:
        if o.group == group and o.flag and o.name not in skip:
            _solve_option(g, o.name, several=o.name == "schedule")


def _several_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parser of one of ``choices`` or several separated by commas."""
    def parse(text: str) -> str:
        names = [n.strip() for n in text.split(",")]
        if not all(name in choices for name in names):
            raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(choices)} (separated by commas), "
                                             f"got '{text[:80]}'")
        return ",".join(names)
    return parse


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


def _auto_or_byte_count(text: str) -> str | int:
    """``auto``, ``off``, or a byte count as ``_byte_count`` reads it."""
    if text.strip().lower() in ("auto", "off"):
        return text.strip().lower()
    try:
        return _byte_count(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto, off or a number of bytes, optionally with a unit (e.g. "
                                         f"1GiB), got '{text[:40]}'") from None


# -- shared option groups ---------------------------------------------------------------------------

def _add_profile(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("profile", nargs="?" if optional else None,
                   help="profile: stagesplit JSON, compact .stagesplit, or PopVision profile.pop")
    p.add_argument("debug_cbor", nargs="?", metavar="DEBUG", help="debug.cbor (with a profile.pop only)")


def _add_layer_options(p: argparse.ArgumentParser) -> None:
    defaults = api.LAYER_DEFAULTS
    g = p.add_argument_group("layer grouping")
    g.add_argument("--layer-regex", default=defaults["layer_regex"], metavar="RE",
                   help="regex whose capture group names an operation's layer (default: %(default)s)")
    g.add_argument("--first-layer-regex", default=defaults["first_layer_regex"], metavar="RE",
                   help="operations whose name or inputs match join the first layer (default: %(default)s)")
    g.add_argument("--last-layer-regex", default=defaults["last_layer_regex"], metavar="RE",
                   help="operations whose name or inputs match join the last layer (default: %(default)s)")
    g.add_argument("--call-regex", default=defaults["call_regex"], metavar="RE",
                   help="unlayered operations named like this join the following layer (default: %(default)s)")
    g.add_argument("--layer-order", choices=("steps", "natural"), default="steps",
                   help="order layers by program steps or by natural sort of their names")
    _solve_options(g, "layer grouping")


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
        g.add_argument("--devices", metavar="RANGE",
                       help="device counts: a range like 1..16 or a list like 2,4,8 (or --gpus: layouts)")
    _solve_options(g, "solver", skip=("devices",) if sweep else ())
    g.add_argument("--config", metavar="FILE", help="solver settings YAML (default: configs/solver.yaml)")


def _add_layout_options(p: argparse.ArgumentParser, command: str) -> None:
    """The layout search's own options (plan/layouts.py), declared once for the three commands
    that run it: ``layouts`` (where --gpus, --global-batch and --target are required), ``solve
    --layout auto`` and ``sweep --gpus RANGE`` (a range of GPU counts). --dp, --zero, --schedule,
    --time-limit and --reshard-after-forward are the declared solve options (solver/options.py):
    each command has them, from its solver options or as ``layouts`` adds them."""
    g = p.add_argument_group("layout search") if command != "layouts" else p
    if command == "solve":
        g.add_argument("--layout", choices=("auto",),
                       help="auto: search the layout of --gpus GPUs as stagesplit layouts does (tensor, pipeline and "
                            "data parallelism, ZeRO, micro-batches from --global-batch) and solve the best one's "
                            "split: the plan (--out) is that layout's, the table says why each other loses")
    if command == "sweep":
        g.add_argument("--gpus", metavar="RANGE",
                       help="GPU counts, each laid out as stagesplit layouts does: a range like 8..64 (its powers of "
                            "two) or a list like 8,16,24; needs --global-batch and --target (instead of --devices)")
    else:
        g.add_argument("--gpus", type=int, required=command == "layouts", metavar="G", help="GPUs in the cluster")
    g.add_argument("--gpus-per-node", type=int, metavar="K", help="GPUs per node (default: the target's node)")
    g.add_argument("--global-batch", type=int, required=command == "layouts", metavar="B",
                   help="samples per step: micro-batch size x micro-batches x data-parallel ranks")
    g.add_argument("--micro-batch-size", type=int, metavar="S",
                   help="fix the samples per micro-batch (default: searched, every divisor of the batch per "
                        "data-parallel rank that fits)")
    g.add_argument("--captured-batch", type=int, metavar="S",
                   help="samples in the micro-batch the profiles were captured with (default: the batch their "
                        "capture recorded; for profiles that record none, --micro-batch-size where given, else 1); "
                        "other sizes scale their activations and work")
    g.add_argument("--seq-len", type=int, metavar="T", help="tokens per sample, for tokens/s per GPU")
    if command == "layouts":
        g.add_argument("--target", required=True, metavar="T", help="GPU target with a node (stagesplit targets)")
        _solve_option(g, "compare", help="also price the layouts a user would otherwise take with the same model: "
                      "NeMo auto-configurator's grid, torchtitan's Llama-3 preset, Megatron's published Llama "
                      "configurations, pure pipeline, pure FSDP")
    g.add_argument("--tp-profile", action="append", default=[], metavar="T=FILE",
                   help="one rank's profile at tensor-parallel degree T (PROFILE is degree 1, or holds a rank at each "
                        "degree as capture --tp 1,2,4,8 writes); repeatable")
    g.add_argument("--cp-profile", action="append", default=[], metavar="C=FILE",
                   help="one rank's profile at context-parallel degree C (capture --cp C, at the tensor-parallel "
                        "degree it records); repeatable")
    g.add_argument("--ep-profile", action="append", default=[], metavar="E=FILE",
                   help="one rank's profile at expert-parallel degree E (capture --ep E); the expert-parallel ranks "
                        "are taken from the data x context-parallel ranks, as Megatron does; repeatable")
    g.add_argument("--tp-layer-compute", action="append", default=[], metavar="T=FILE",
                   help="measured per-layer compute of one rank at tensor-parallel degree T (as --layer-compute, "
                        "which is degree 1's): that degree's ranks take it instead of degree 1's scaled by their "
                        "capture (docs/layouts.md); repeatable")
    for flag in ("tp", "cp", "ep", "pp"):
        g.add_argument(f"--{flag}", type=int, metavar="N", help=f"fix the {flag} degree (default: searched)")


class _Undeclared:
    """The parser of a command this run does not parse: what would declare its arguments does
    nothing (argparse takes about 0.03 ms per argument, and the command line names one command of
    the hundreds of arguments); the command itself is declared, with its help, for the list of
    commands and for argparse's choice of one."""

    def __getattr__(self, name: str) -> Callable[..., _Undeclared]:
        return lambda *args, **kwargs: self


def command_word(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top level's options
    take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``only``: the one command to declare the arguments of (every
    command's where None; none where it names no command, which argparse then refuses)."""
    parser = _Parser(prog="stagesplit", description="Pipeline-stage partition advisor: where to split a model "
                     "that does not fit on one accelerator.")
    parser.add_argument("--version", action="version", version=f"stagesplit {api.VERSION}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common.add_argument("--progress", action="store_true",
                        help="show progress on stderr even when it is not a terminal")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    every = only is None

    def command(name: str, **kw) -> argparse.ArgumentParser:
        # any parser can be a parent; argparse's stubs want the subparsers' own class
        made = sub.add_parser(name, parents=[common], **kw)  # type: ignore[list-item]
        return made if every or name == only else cast(argparse.ArgumentParser, _Undeclared())

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
    _solve_option(p, "efficiency")
    for name in ("dp", "zero", "reshard_after_forward"):     # with --dp, one rank's figures, and a table by ZeRO stage
        _solve_option(p, name)

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
    _solve_options(p, "solve")
    p.add_argument("--ipu-columns", action="store_true",
                   help="on a GPU target, still show bytes and the per-tile and code columns")
    p.add_argument("--format", choices=("text", "json"), default="text", help="summary format on stdout")
    _add_wide(p)
    p.add_argument("--out", metavar="PLAN", help="write the plan (.json, or .yaml/.yml) atomically")
    p.add_argument("--plot", metavar="FILE", help="write per-stage memory and compute plots (.png or .svg)")
    _add_layout_options(p, "solve")

    p = command("sweep", help="how few devices can I use? solve for a range of device counts")
    _add_profile(p)
    _add_solver_options(p, sweep=True)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--plot", metavar="FILE", help="plot bottleneck compute and memory against devices (.png/.svg)")
    _add_layout_options(p, "sweep")

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

    formats = _Later(lambda: tuple(api.export_formats()))
    p = command("export", help="write a plan's split in a training framework's own form (snippet or config)",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog=lambda: "formats:\n" + "\n".join(f"  {name:<17} {description}"
                                                         for name, description in api.export_formats().items()))
    p.add_argument("plan", metavar="PLAN", help="plan file from solve --out (.json or .yaml)")
    p.add_argument("--to", required=True, choices=formats, metavar="FORMAT",
                   help="one of: %(choices)s")
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
    p.add_argument("--master-weights", action="store_true",
                   help="mixed precision as Megatron (--bf16), DeepSpeed (bf16) and FSDP2 (MixedPrecisionPolicy) run "
                        "it: parameters in --dtype (bfloat16 when --dtype is float32), no autocast, gradients "
                        "accumulated in float32 and the optimizer updating float32 master copies; not with --amp")
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
    p.add_argument("--tp", type=degrees, default=1, metavar="N[,N...]",
                   help="capture rank 0 of N tensor-parallel ranks: torch's parallelize_module applies the plan under "
                        "a fake process group of N ranks; parameters, activations and collectives are one rank's. A "
                        "list (1,2,4,8) captures one rank at each degree into one file, for the layout search and "
                        "breakdown (default: %(default)s, no tensor parallelism)")
    p.add_argument("--sp", action="store_true",
                   help="with --tp: sequence parallelism between the blocks (norms under SequenceParallel, the "
                        "stream sharded on the sequence dimension)")
    p.add_argument("--loss-parallel", action="store_true",
                   help="with --tp: keep the head's logits split on the vocabulary and compute the loss on the split "
                        "(torch's loss_parallel), as torchtitan and Megatron do; a Hugging Face plan gathers them, "
                        "each rank then holding all of them")
    p.add_argument("--tp-plan", metavar="FILE",
                   help="with --tp: a YAML plan, module pattern -> style (colwise, rowwise, sequence, replicate, "
                        "...), instead of the model's declared one (a Hugging Face model's _tp_plan)")
    p.add_argument("--kernels", choices=("cpu", "cuda"), default="cpu",
                   help="whose kernels' saved tensors to record: cpu (the kernels the capture runs) or cuda (the "
                        "attention kernel the GPU target's CUDA dispatcher would choose: flash, memory-efficient or "
                        "math; docs/gpu.md) (default: %(default)s)")
    p.add_argument("--cp", type=int_in(1, 4096), default=1, metavar="N",
                   help="capture rank 0 of N context-parallel ranks: the sequence sharded N ways and attention run as "
                        "torch's ring attention (on the GPU target's attention kernels) under a fake process group; "
                        "N must divide the sequence (default: %(default)s)")
    p.add_argument("--ep", type=int_in(1, 4096), default=1, metavar="N",
                   help="capture rank 0 of N expert-parallel ranks of a mixture-of-experts model: each rank holds "
                        "E/N of every experts module's experts, the tokens' all-to-alls added (composed from rules; "
                        "docs/layouts.md); N must divide the experts (default: %(default)s)")

    p = command("report", help="write a plan as one self-contained HTML page to share (figures, schedule, snippets)")
    p.add_argument("plan", metavar="PLAN", help="plan file from solve --out (.json or .yaml)")
    p.add_argument("profile", nargs="?", metavar="PROFILE",
                   help="the profile the plan was solved on: adds why the split binds, per-layer figures and the "
                        "comparison with the frameworks' defaults")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write (atomically)")

    p = command("layouts", help="the fastest layout of G GPUs: tensor, pipeline and data parallelism, ZeRO, "
                "micro-batches, each split proven")
    _add_profile(p)
    _add_layout_options(p, "layouts")
    # as solve declares them; here dp and zero left out are searched, the schedule defaults to 1f1b
    for name in ("dp", "zero", "reshard_after_forward", "chunks_per_rank", "time_limit", "runtime_reserve"):
        _solve_option(p, name)
    _solve_option(p, "schedule", several=True,
                  help="pipeline schedule: " + ", ".join(SCHEDULES) + "; auto tries each per combination; several "
                       "separated by commas (e.g. 1f1b,interleaved-1f1b): each combination searched under each, a "
                       "looped one at 2 to 4 chunks per device unless --chunks-per-rank fixes it, each a row of its "
                       "own (default: 1f1b)")
    _solve_option(p, "layer_compute", help="YAML/JSON mapping of layer name to compute measured on one rank at "
                  "tensor-parallel degree 1 (as solve takes it); each combination's rank takes it scaled by its "
                  "capture: its share of each layer at its degrees and micro-batch size (docs/layouts.md)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument("--out", metavar="FILE", help="write the output to FILE (atomically) instead of stdout")

    p = command("targets", help="list the shipped device targets")
    _add_output(p)
    return parser


#: the Python API's parameter names (errors.OptionError.parameter) as command-line flags: the solve
#: options' from their declarations, the other commands' parameters here
FLAGS = {**{o.name: "--" + o.flag for o in api.SOLVE_OPTIONS if o.flag}, "target": "--target",
         "plan": "--plan", "layers": "--layers", "top": "--top", "window": "--window",
         "layer_regex": "--layer-regex", "first_layer_regex": "--first-layer-regex",
         "last_layer_regex": "--last-layer-regex", "call_regex": "--call-regex", "layer_order": "--layer-order",
         "batch": "--batch", "dims": "--dim", "training": "--training", "dtype": "--dtype", "name": "--name",
         "seed": "--seed", "piece_bytes": "--piece-bytes", "programs_per_op": "--programs-per-op",
         "family": "FAMILY", "output": "--output", "model": "--model", "profile": "PROFILE", "debug": "DEBUG",
         "plan_path": "--from-plan", "out": "--out", "plot": "--plot", "events": "events",
         "tp": "--tp", "sequence_parallel": "--sp", "loss_parallel": "--loss-parallel", "tp_plan": "--tp-plan", "kernels": "--kernels",
         "cp": "--cp", "ep": "--ep",
         "gpus": "--gpus", "gpus_per_node": "--gpus-per-node", "global_batch": "--global-batch",
         "micro_batch_size": "--micro-batch-size", "sequence_length": "--seq-len", "pp": "--pp",
         "tp_profiles": "--tp-profile", "captured_batch": "--captured-batch", "cp_profiles": "--cp-profile",
         "ep_profiles": "--ep-profile", "tp_layer_compute": "--tp-layer-compute", "optimizer": "--optimizer", "allocator_round": "--allocator-round",
         "fmt": "--to", "sections": "--sections", "wide": "--wide"}
