"""The ``stagesplit`` command line: a thin layer over the library.

Every command reads its inputs, calls one library function and prints or writes the result.
Bad input ends with one line on stderr and exit status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Callable, Sequence

from . import __version__
from .errors import StagesplitError

EXIT_USAGE = 2
EXIT_INTERNAL = 1


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
    g.add_argument("--layer-compute", metavar="FILE",
                   help="YAML/JSON mapping of layer name to compute, replacing the profile's figures for those layers")


def _layer_options(args: argparse.Namespace):
    from .layers import LayerOptions
    return LayerOptions(layer_regex=args.layer_regex, first_layer_regex=args.first_layer_regex,
                        last_layer_regex=args.last_layer_regex, call_regex=args.call_regex, order=args.layer_order)


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "csv", "tsv", "json"), default="text", help="output format")
    p.add_argument("--out", metavar="FILE", help="write the output to FILE (atomically) instead of stdout")


def _load(args: argparse.Namespace):
    """Read the profile, with a progress line for PopVision profiles (which load slowly)."""
    from .io import load_profile
    progress = _progress(args)
    slow = str(args.profile).endswith(".pop")
    if slow:
        progress.start(f"reading {args.profile}")
    profile = load_profile(args.profile, args.debug_cbor, progress.update if slow else None)
    if slow:
        progress.done()
    return profile


def _analysis(args: argparse.Namespace, shared: str | None = None):
    """The profile, its layers and cost model; ``shared`` (else --shared, else every)."""
    from .analysis import Analysis
    analysis = Analysis.of(_load(args), _layer_options(args), shared or args.shared or "every")
    if args.layer_compute:
        from .config import load_layer_compute
        analysis.model.override_compute(load_layer_compute(args.layer_compute), args.layer_compute)
    for message in analysis.profile.info.warnings + analysis.layers.warnings:
        _warn(message)
    return analysis


def _add_solver_options(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    g = p.add_argument_group("solver")
    if sweep:
        g.add_argument("--devices", required=True, metavar="RANGE",
                       help="device counts: a range like 1..16 or a list like 2,4,8")
    else:
        g.add_argument("--devices", required=True, type=int, metavar="N", help="number of devices (pipeline stages)")
    g.add_argument("--target", metavar="T[,T...]",
                   help="device target name or YAML file (default: the profile's device); a comma-separated list "
                        "of N targets gives each device its own capacity")
    g.add_argument("--objective", choices=("compute", "memory", "devices"),
                   help="compute: fastest slowest stage, then least memory (default); memory: least worst-stage "
                        "memory, then compute; devices: fewest devices that fit, then compute")
    g.add_argument("--exact", action="store_true", default=None, help="use exactly N devices (default: at most N)")
    g.add_argument("--schedule", choices=("none", "1f1b", "gpipe"),
                   help="pipeline schedule whose in-flight micro-batches add stashed activations (default: none)")
    g.add_argument("--micro-batches", type=int, metavar="M", help="micro-batches per step (default: 1)")
    g.add_argument("--headroom", type=float, metavar="F", help="fraction of every device kept free, e.g. 0.1")
    g.add_argument("--min-layers", type=int, default=1, metavar="K", help="at least K layers per stage")
    g.add_argument("--max-layers", type=int, metavar="K", help="at most K layers per stage")
    g.add_argument("--pin-split", action="append", default=[], metavar="LAYER",
                   help="a stage must start at this layer (name as shown by breakdown); repeatable")
    g.add_argument("--pin-layer", action="append", default=[], metavar="LAYER=STAGE",
                   help="this layer must be on this device position (0-based); repeatable")
    g.add_argument("--communication", action="store_true", default=None,
                   help="add the transfer time of bytes crossing each cut (over the link bandwidth) to stage time")
    g.add_argument("--link-bandwidth", type=float, metavar="BYTES_PER_S", help="device-to-device bandwidth")
    g.add_argument("--time-limit", type=float, metavar="S", help="CP-SAT seconds per objective phase (default: 60)")
    g.add_argument("--workers", type=int, metavar="W", help="CP-SAT workers (default 1: deterministic)")
    g.add_argument("--config", metavar="FILE", help="solver settings YAML (default: configs/solver.yaml)")


def _targets(args: argparse.Namespace, profile, devices: int):
    """Per-device capacities (bytes per tile) and target names, checked against the profile."""
    from .config import load_target
    if not args.target:
        return None, [profile.target.name] * devices
    names = [t.strip() for t in args.target.split(",") if t.strip()]
    if len(names) not in (1, devices):
        raise StagesplitError(f"--target: give one target or {devices} (one per device), got {len(names)}")
    names = names * devices if len(names) == 1 else names
    capacities = []
    for name in names:
        target = load_target(name)
        if profile.target.tiles == 1:
            capacities.append(target.device_bytes)          # a one-tile profile: the device is one pool
        elif target.tiles == profile.target.tiles:
            capacities.append(target.bytes_per_tile)
        else:
            raise StagesplitError(f"--target {name}: {target.tiles} tiles per device, but the profile was captured on "
                                  f"{profile.target.tiles} tiles; choose a target with the same tile count")
    return tuple(capacities), names


def _prepare_solve(args: argparse.Namespace, devices: int):
    """Solver settings (file, then flags), the analysis under their shared policy, the solve
    options, and every layer range priced once (with a progress line)."""
    from .advise import price
    from .config import load_solver_settings
    settings = load_solver_settings(args.config).with_overrides(
        objective=args.objective, schedule=args.schedule, micro_batches=args.micro_batches, headroom=args.headroom,
        time_limit=args.time_limit, workers=args.workers, communication=args.communication,
        stages="exact" if args.exact else None, shared=args.shared)
    analysis = _analysis(args, settings.shared)
    options, target_names = _solve_options(args, settings, analysis, devices)
    progress = _progress(args)
    progress.start(f"pricing {analysis.model.num_layers * (analysis.model.num_layers + 1) // 2:,} layer ranges")
    table = price(analysis.model, options, max_devices=devices, progress=progress.update)
    progress.done()
    return analysis, options, target_names, table, progress


def _solve_options(args: argparse.Namespace, settings, analysis, devices: int):
    from .problem import SolveOptions
    names = analysis.layers.names
    index = {name: i for i, name in enumerate(names)}

    def layer(name: str, flag: str) -> int:
        if name not in index:
            raise StagesplitError(f"{flag}: no layer named '{name}' (layers: {', '.join(names)})")
        return index[name]

    pins = []
    for item in args.pin_layer:
        name, sep, stage = item.rpartition("=")
        if not sep or not stage.isdigit():
            raise StagesplitError(f"--pin-layer: expected LAYER=STAGE, got '{item}'")
        pins.append((layer(name, "--pin-layer"), int(stage)))
    capacities, target_names = _targets(args, analysis.profile, devices)
    link = args.link_bandwidth or analysis.profile.target.link_bytes_per_s
    if args.target and not args.link_bandwidth:
        from .config import load_target
        link = load_target(target_names[0]).link_bytes_per_s or link
    options = SolveOptions(
        devices=devices, objective=settings.objective, exact=settings.stages == "exact", schedule=settings.schedule,
        micro_batches=settings.micro_batches, headroom=settings.headroom, capacities=capacities,
        min_layers=args.min_layers, max_layers=args.max_layers,
        pinned_splits=tuple(sorted({layer(x, "--pin-split") for x in args.pin_split})),
        pinned_layers=tuple(pins), communication=settings.communication, link_bytes_per_s=link,
        time_limit=settings.time_limit, workers=settings.workers)
    options.check(len(names))
    return options, target_names


def _progress(args: argparse.Namespace):
    from .progress import Progress
    return Progress(enabled=True if getattr(args, "progress", False) else None)


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


def cmd_solve(args: argparse.Namespace) -> int:
    import json
    from .advise import advise
    from .report import comparison_table, plan_summary, stages_table
    from .table import render
    analysis, options, target_names, table, progress = _prepare_solve(args, args.devices)
    advice = advise(analysis.model, options, table=table, profile_path=args.profile, compare=args.compare,
                    target_names=target_names, log=lambda m: progress.start(m) if progress.enabled else None)
    for message in advice.warnings:
        _warn(message)
    plan = advice.plan
    if args.out:
        from .plan import write_plan
        write_plan(plan, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        if plan.stages:
            from .plot import plot_plan
            totals = [analysis.model.stage_memory(s.first_layer, s.last_layer).total(s.in_flight) for s in plan.stages]
            plot_plan(plan, totals, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
        else:
            _warn(f"no plot written to {args.plot}: no split fits")
    if args.format == "json":
        doc = plan.to_document()
        if advice.baselines:
            doc["compare"] = [b.to_document() for b in advice.baselines]
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        p = analysis.profile
        cap = options.capacities[0] if options.capacities else p.target.bytes_per_tile
        header = (f"{p.info.name or args.profile}{' (synthetic)' if p.info.synthetic else ''}: "
                  f"{analysis.model.num_layers} layers on {'exactly' if options.exact else 'at most'} {options.devices} x "
                  f"{', '.join(sorted(set(target_names)))} ({p.target.tiles:,} tiles x {cap:,} bytes"
                  f"{f', {options.headroom:.0%} kept free' if options.headroom else ''})\n"
                  f"objective: {options.objective}; schedule: {options.schedule}"
                  f"{f' with {options.micro_batches} micro-batches' if options.schedule != 'none' else ''}")
        parts = [header, plan_summary(plan, options.micro_batches)]
        text = "\n".join(parts) + "\n"
        if plan.stages:
            text += "\n" + render([stages_table(plan)])
        if advice.baselines:
            text += "\n" + render([comparison_table([plan] + advice.baselines)])
        sys.stdout.write(text)
    return 0 if plan.feasible else 1


def _device_counts(text: str) -> list[int]:
    try:
        if ".." in text:
            lo, hi = text.split("..", 1)
            counts = list(range(int(lo), int(hi) + 1))
        else:
            counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise StagesplitError(f"--devices: expected a range like 1..16 or a list like 2,4,8, got '{text}'")
    return counts


def cmd_sweep(args: argparse.Namespace) -> int:
    import json
    from .advise import sweep
    from .report import sweep_table
    from .table import render
    counts = _device_counts(args.devices)
    analysis, options, target_names, table, progress = _prepare_solve(args, max(counts))
    done = []

    def on_row(row):
        done.append(row)
        progress.start(f"solved {len(done)}/{len(counts)} device counts")

    rows = sweep(analysis.model, options, counts, table=table, profile_path=args.profile, target_names=target_names,
                 on_row=on_row)
    progress.done()
    if args.plot:
        from .plot import plot_sweep
        plot_sweep(rows, args.plot, title=f"{analysis.profile.info.name}: devices sweep")
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.format == "json":
        text = json.dumps([{"devices": r.devices, "fits": r.fits, "plan": r.plan.to_document()} for r in rows],
                          indent=1) + "\n"
    else:
        text = render([sweep_table(rows)], args.format)
    fits = [r.devices for r in rows if r.fits]
    if args.format == "text":
        text += (f"fewest devices that fit: {min(fits)}\n" if fits else "no device count in the range fits\n")
    _emit(text, args.out)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from .diagnose import diagnose, diagnosis_tables
    from .table import render
    if args.plan and args.layers:
        raise StagesplitError("give --plan or --layers, not both")
    analysis = _analysis(args)
    model = analysis.model
    names = model.layers.names
    stages = None
    if args.plan:
        from .plan import read_plan
        plan = read_plan(args.plan)
        if plan.layer_names != names:
            raise StagesplitError(f"{args.plan}: the plan's layers ({', '.join(plan.layer_names[:6])}...) are not this "
                                  f"profile's ({', '.join(names[:6])}...): use the same profile and layer options")
        stages = [(s.first_layer, s.last_layer, s.in_flight, s.capacity_bytes or None) for s in plan.stages]
        if not stages:
            raise StagesplitError(f"{args.plan}: the plan has no stages (no split fitted)")
    elif args.layers:
        first, sep, last = args.layers.partition(":")
        index = {name: i for i, name in enumerate(names)}
        if not sep or first not in index or last not in index or index[first] > index[last]:
            raise StagesplitError(f"--layers: expected FIRST:LAST with layer names in order (layers: {', '.join(names)}), "
                                  f"got '{args.layers}'")
        stages = [(index[first], index[last], 1, None)]
    result = diagnose(model, stages, top=args.top, window=args.window)
    if args.plot:
        from .plot import plot_liveness
        s = max(result.stages, key=lambda x: x.total / x.capacity)
        by_step, in_stage = model.live_bytes_by_step(s.first, s.last, s.tile)
        code = sum(s.memory[k] for k in ("vertex_code", "vertex_state", "exchange_code", "control_code"))
        plot_liveness(by_step, in_stage, s.memory["always_live"] + s.memory["stashed_copies"], code, s.capacity,
                      s.step, args.plot, f"tile {s.tile}, layers {s.layers[0]}..{s.layers[-1]}: memory over "
                      f"program steps (peak {s.total:,} bytes at step {s.step})")
        print(f"wrote {args.plot}", file=sys.stderr)
    _emit(render(diagnosis_tables(result), args.format), args.out)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .io import save_profile
    profile = _load(args)
    for message in profile.info.warnings:
        _warn(message)
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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common.add_argument("--progress", action="store_true",
                        help="show progress on stderr even when it is not a terminal")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    p = command("breakdown", help="memory and compute by operation, layer, category and tile")
    _add_profile(p)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--sections", metavar="LIST",
                   help="comma-separated sections: grouping,operations,layers,totals,tiles,affinity,communication")
    p.add_argument("--top-tiles", type=_count, default=10, metavar="N", help="how many of the most loaded tiles to list")
    p.set_defaults(run=cmd_breakdown)

    p = command("solve", help="optimal split points for N devices (CP-SAT), with a plan file and plots")
    _add_profile(p)
    _add_solver_options(p)
    _add_layer_options(p)
    p.add_argument("--compare", action="store_true", help="also show PopLiner's greedy and a uniform split")
    p.add_argument("--format", choices=("text", "json"), default="text", help="summary format on stdout")
    p.add_argument("--out", metavar="PLAN", help="write the plan (.json, or .yaml/.yml) atomically")
    p.add_argument("--plot", metavar="FILE", help="write per-stage memory and compute plots (.png or .svg)")
    p.set_defaults(run=cmd_solve)

    p = command("sweep", help="how few devices can I use? solve for a range of device counts")
    _add_profile(p)
    _add_solver_options(p, sweep=True)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--plot", metavar="FILE", help="plot bottleneck compute and memory against devices (.png/.svg)")
    p.set_defaults(run=cmd_sweep)

    p = command("diagnose", help="bottleneck tile and step, live variables, ground truth, grouping health")
    _add_profile(p)
    _add_layer_options(p)
    _add_output(p)
    p.add_argument("--plan", metavar="PLAN", help="diagnose each stage of this plan (from solve --out)")
    p.add_argument("--layers", metavar="FIRST:LAST", help="diagnose one stage holding these layers (names)")
    p.add_argument("--top", type=_count, default=10, metavar="N", help="how many live variables to list")
    p.add_argument("--window", type=_count, default=5, metavar="W", help="steps to show either side of the peak")
    p.add_argument("--plot", metavar="FILE", help="liveness plot of the fullest stage's bottleneck tile (.png/.svg)")
    p.set_defaults(run=cmd_diagnose)

    p = command("convert", help="convert a profile (e.g. profile.pop + debug.cbor) to JSON or compact form")
    _add_profile(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output: .stagesplit or .npz for the compact form, anything else for JSON")
    p.set_defaults(run=cmd_convert)

    p = command("synth", help="generate a synthetic profile (labelled synthetic)")
    p.add_argument("family", choices=("bert-base", "bert-large", "gpt", "cnn"))
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument("--target", default="ipu-mk2", help="device target (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="number of encoder/decoder layers (bert-base, gpt)")
    p.add_argument("--piece-bytes", type=int, help="split tensors into lowered variables of about this size")
    p.add_argument("--programs-per-op", type=int, help="forward programs (liveness steps) per operation")
    p.set_defaults(run=cmd_synth)

    p = command("targets", help="list the shipped device targets")
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
