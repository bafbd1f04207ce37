"""The ``stagesplit`` command line: a thin layer over the library.

Every command reads its inputs, calls one library function and prints or writes the result.
Bad input ends with one line on stderr and exit status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Callable, Sequence

from . import __version__
from .errors import StagesplitError

EXIT_USAGE = 2
EXIT_INTERNAL = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, like every other error
        raise StagesplitError(f"{self.prog}: {message}")


def _warn(message: str) -> None:
    print(f"stagesplit: warning: {message}", file=sys.stderr)


def _emit(text: str, out: str | None) -> None:
    if out:
        from .fileio import atomic_write_text
        atomic_write_text(out, text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


# -- shared option groups ---------------------------------------------------------------------------

def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", help="profile: stagesplit JSON, compact .stagesplit, or PopVision profile.pop")
    p.add_argument("debug_cbor", nargs="?", metavar="DEBUG", help="debug.cbor (with a profile.pop only)")


def _add_layer_options(p: argparse.ArgumentParser) -> None:
    from .layers import (DEFAULT_CALL_REGEX, DEFAULT_FIRST_LAYER_REGEX, DEFAULT_LAST_LAYER_REGEX,
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


def _layer_options(args: argparse.Namespace):
    from .layers import LayerOptions
    return LayerOptions(layer_regex=args.layer_regex, first_layer_regex=args.first_layer_regex,
                        last_layer_regex=args.last_layer_regex, call_regex=args.call_regex, order=args.layer_order)


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "csv", "tsv", "json"), default="text", help="output format")
    p.add_argument("--out", metavar="FILE", help="write the output to FILE (atomically) instead of stdout")


def _analysis(args: argparse.Namespace, shared: str | None = None):
    from .analysis import Analysis
    analysis = Analysis.load(args.profile, args.debug_cbor, _layer_options(args), shared or args.shared or "every")
    for message in analysis.layers.warnings:
        _warn(message)
    return analysis


# -- commands -------------------------------------------------------------------------------------------

def cmd_breakdown(args: argparse.Namespace) -> int:
    from .breakdown import SECTIONS, Breakdown
    from .table import render
    sections = tuple(args.sections.split(",")) if args.sections else SECTIONS
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise StagesplitError(f"--sections: unknown section '{unknown[0]}': expected some of {', '.join(SECTIONS)}")
    analysis = _analysis(args)
    tables = Breakdown.of(analysis.model).tables(sections, top_tiles=args.top_tiles)
    _emit(render(tables, args.format), args.out)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .io import load_profile, save_profile
    profile = load_profile(args.profile, args.debug_cbor)
    save_profile(profile, args.output)
    print(f"wrote {args.output}: {len(profile.variables):,} variables, {len(profile.operations):,} operations, "
          f"{len(profile.programs):,} programs, {profile.num_steps:,} steps", file=sys.stderr)
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from .config import load_target
    from .io import save_profile
    from .synth import synthesize
    params = {}
    if args.layers is not None:
        if args.family not in ("bert-base", "gpt"):
            raise StagesplitError(f"--layers applies to bert-base and gpt, not {args.family}")
        params["layers"] = args.layers
    profile = synthesize(args.family, load_target(args.target), seed=args.seed, piece_bytes=args.piece_bytes,
                         programs_per_op=args.programs_per_op, **params)
    save_profile(profile, args.output)
    print(f"wrote {args.output}: {profile.info.name} (synthetic), {len(profile.variables):,} variables, "
          f"{len(profile.operations):,} operations, {profile.num_steps:,} steps", file=sys.stderr)
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    from .config import known_targets
    from .table import Column, Table, render
    t = Table("Device targets", [Column("name"), Column("kind"), Column("tiles", "int"),
                                 Column("bytes per tile", "int"), Column("device memory", "bytes"),
                                 Column("description")])
    for name, target in known_targets().items():
        t.add(name, target.kind, target.tiles, target.bytes_per_tile, target.device_bytes, target.description)
    _emit(render([t], args.format), args.out)
    return 0


# -- parser ----------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="stagesplit", description="Pipeline-stage partition advisor: where to split a model "
                     "that does not fit on one accelerator.")
    parser.add_argument("--version", action="version", version=f"stagesplit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("breakdown", help="memory and compute by operation, layer, category and tile")
    _add_profile(p)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--sections", metavar="LIST",
                   help="comma-separated sections: grouping,operations,layers,totals,tiles,affinity,communication")
    p.add_argument("--top-tiles", type=int, default=10, metavar="N", help="how many of the most loaded tiles to list")
    p.set_defaults(run=cmd_breakdown)

    p = sub.add_parser("convert", help="convert a profile (e.g. profile.pop + debug.cbor) to JSON or compact form")
    _add_profile(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output: .stagesplit or .npz for the compact form, anything else for JSON")
    p.set_defaults(run=cmd_convert)

    p = sub.add_parser("synth", help="generate a synthetic profile (labelled synthetic)")
    p.add_argument("family", choices=("bert-base", "bert-large", "gpt", "cnn"))
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument("--target", default="ipu-mk2", help="device target (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="number of encoder/decoder layers (bert-base, gpt)")
    p.add_argument("--piece-bytes", type=int, help="split tensors into lowered variables of about this size")
    p.add_argument("--programs-per-op", type=int, help="forward programs (liveness steps) per operation")
    p.set_defaults(run=cmd_synth)

    p = sub.add_parser("targets", help="list the shipped device targets")
    _add_output(p)
    p.set_defaults(run=cmd_targets)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "command", None):
            build_parser().print_help(sys.stderr)
            return EXIT_USAGE
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except StagesplitError as exc:
        if debug:
            traceback.print_exc()
        print(f"stagesplit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stagesplit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        print(f"stagesplit: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
