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
from .guards import float_in, int_in
from .safeinput import MAX_DEVICES, MAX_MICRO_BATCHES, MAX_TIME_LIMIT, MAX_WORKERS, one_line

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


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
               "gib": 2**30, "tib": 2**40}


def _byte_count(text: str) -> int:
    """A byte count >= 0: a whole number, or a number with a unit (KB, MB, GB, KiB, MiB, GiB...)."""
    import re
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text[:40])
    unit = m.group(2).lower() if m else None
    if not m or unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, optionally with a unit (e.g. 2GiB), "
                                         f"got '{text[:40]}'")
    value = float(m.group(1)) * _BYTE_UNITS[unit]
    if value > 2**62:
        raise argparse.ArgumentTypeError(f"expected at most {2**62:,} bytes, got '{text[:40]}'")
    return int(value)


def _warn(message: str) -> None:
    from .safeinput import one_line
    print(f"stagesplit: warning: {one_line(str(message))}", file=sys.stderr)


def _emit(text: str, out: str | None) -> None:
    if out:
        from .fileio import atomic_write_text
        atomic_write_text(out, text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


# -- shared option groups ---------------------------------------------------------------------------

def _add_profile(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("profile", nargs="?" if optional else None,
                   help="profile: stagesplit JSON, compact .stagesplit, or PopVision profile.pop")
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
        analysis.model = analysis.model.with_compute(load_layer_compute(args.layer_compute), args.layer_compute)
    for message in analysis.profile.info.warnings + analysis.layers.warnings:
        _warn(message)
    return analysis


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
    g.add_argument("--schedule", choices=("none", "1f1b", "gpipe"),
                   help="pipeline schedule whose in-flight micro-batches add stashed activations (default: none)")
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
                   help="CP-SAT seconds per objective phase (default: 60)")
    g.add_argument("--workers", type=int_in(1, MAX_WORKERS), metavar="W",
                   help="CP-SAT workers (default 1: deterministic)")
    g.add_argument("--config", metavar="FILE", help="solver settings YAML (default: configs/solver.yaml)")


def _add_efficiency(g) -> None:
    g.add_argument("--efficiency", type=float_in(0, 1, low_open=True), metavar="F",
                   help="achieved over peak FLOP/s on the target (0 < F <= 1, default 1): FLOP time is divided by F")


def _apply_roofline(args: argparse.Namespace, model) -> None:
    """Compute time on the chosen target (the first --target; the profile's device by default):
    per operation the slower of FLOPs at the target's rate x --efficiency and bytes accessed at
    its memory bandwidth (stagesplit/roofline.py)."""
    from .config import load_target
    from .roofline import apply_roofline
    names = [t.strip() for t in (getattr(args, "target", None) or "").split(",") if t.strip()]
    apply_roofline(model, load_target(names[0]) if names else None, getattr(args, "efficiency", None) or 1.0)


def _request(args: argparse.Namespace, devices: int):
    """The solve request: the settings file (--config, else the shipped one), flags winning."""
    from .config import load_layer_compute, load_solver_settings
    from .options import request_from_settings
    pins = []
    for item in args.pin_layer:
        name, sep, stage = item.rpartition("=")
        if not sep or not stage.isdigit():
            raise StagesplitError(f"--pin-layer: expected LAYER=STAGE, got '{item}'")
        pins.append((name, int(stage)))
    compute = load_layer_compute(args.layer_compute) if getattr(args, "layer_compute", None) else {}
    settings = load_solver_settings(args.config)
    return request_from_settings(
        settings, devices, objective=args.objective, schedule=args.schedule, micro_batches=args.micro_batches,
        headroom=args.headroom, time_limit=args.time_limit, workers=args.workers, communication=args.communication,
        exact=True if args.exact else None, shared=args.shared,
        targets=tuple(t.strip() for t in (args.target or "").split(",") if t.strip()),
        reserve=getattr(args, "reserve", 0) or 0, min_layers=args.min_layers, max_layers=args.max_layers,
        pin_splits=tuple(args.pin_split), pin_layers=tuple(pins), link_bandwidth=args.link_bandwidth,
        efficiency=getattr(args, "efficiency", None), layer_compute=tuple(compute.items()),
        layer_compute_source=getattr(args, "layer_compute", None), layering=_layer_options(args),
        compare=getattr(args, "compare", None), unlayered_first=getattr(args, "unlayered_first", None))


def _prepare_solve(args: argparse.Namespace, devices: int, request=None):
    """The request, the analysis under its shared policy, the request resolved against it, and
    every layer range priced once (with a progress line)."""
    from .api import analyze, price, resolve
    request = request or _request(args, devices)
    analysis = analyze(_load(args), layering=request.layering, shared=request.shared.value)
    for message in analysis.profile.info.warnings + analysis.layers.warnings:
        _warn(message)
    resolved = resolve(request, analysis)
    progress = _progress(args)
    L = analysis.model.num_layers
    progress.start(f"pricing {L * (L + 1) // 2:,} layer ranges")
    table = price(resolved, max_devices=devices, progress=progress.update)
    progress.done()
    return request, analysis, resolved, table, progress


def _progress(args: argparse.Namespace):
    from .progress import Progress
    return Progress(enabled=True if getattr(args, "progress", False) else None)


# -- commands -------------------------------------------------------------------------------------------

def cmd_breakdown(args: argparse.Namespace) -> int:
    from .breakdowns import SECTIONS
    from .table import render
    sections = tuple(args.sections.split(",")) if args.sections else SECTIONS
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise StagesplitError(f"--sections: unknown section '{unknown[0]}': expected some of {', '.join(SECTIONS)}")
    from .api import breakdown
    analysis = _analysis(args)
    gpu = _gpu_view(args, analysis.profile)
    if gpu and not args.sections:
        sections = tuple(s for s in sections if s != "tiles")     # one tile: nothing to rank
    target = next((t.strip() for t in (args.target or "").split(",") if t.strip()), None)
    result = breakdown(analysis, target=target, efficiency=args.efficiency or 1.0, shared=analysis.model.shared)
    tables = result.tables(sections, top_tiles=args.top_tiles)
    if gpu:
        from .table import gpu_view
        tables = [gpu_view(t) for t in tables]
    _emit(render(tables, args.format), args.out)
    return 0


def _gpu_view(args: argparse.Namespace, profile) -> bool:
    """GPU-facing output (GiB, no IPU-only columns): the target (--target's first, else the
    profile's device) is a GPU and --ipu-columns was not given."""
    if getattr(args, "ipu_columns", False):
        return False
    names = [t.strip() for t in (getattr(args, "target", None) or "").split(",") if t.strip()]
    if names:
        from .config import load_target
        return load_target(names[0]).kind == "gpu"
    return profile.target.kind == "gpu" and profile.target.tiles == 1


def cmd_solve(args: argparse.Namespace) -> int:
    import json
    from .api import solve_request
    from .report import comparison_table, plan_summary, stages_table
    from .table import render
    reproduction = None
    if args.from_plan:
        request, args.profile = _from_plan(args)
        args.devices = request.devices
    elif args.devices is None:
        raise StagesplitError("--devices: expected the number of devices (or --from-plan PLAN)")
    else:
        request = None
    if args.profile is None:
        raise StagesplitError("expected a profile (or --from-plan PLAN, whose recorded profile is used)")
    request, analysis, resolved, table, progress = _prepare_solve(args, args.devices, request)
    solved = solve_request(analysis, request, table=table,
                           log=lambda m: progress.start(m) if progress.enabled else None)
    if args.from_plan:
        reproduction = _compare_with_plan(args.from_plan, solved.plan)
    for message in solved.warnings[len(analysis.profile.info.warnings) + len(analysis.layers.warnings):]:
        _warn(message)
    plan = solved.plan
    options, target_names = resolved.options, resolved.target_names
    advice = solved
    if args.out and plan.stages:
        from .plan import write_plan
        write_plan(plan, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    elif args.out:                                    # no plan: an existing file is left as it was
        _warn(f"no plan written to {args.out}: no split fits")
    if args.plot:
        if plan.stages:
            from .plot import plot_plan
            totals = [resolved.model.stage_memory(s.first_layer, s.last_layer).total(s.in_flight) for s in plan.stages]
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
        gpu = _gpu_view(args, p)
        size = f"{cap / 2**30:,.2f} GiB each" if gpu else f"{p.target.tiles:,} tiles x {cap:,} bytes"
        reserve = options.reserve / 2**30 if gpu else options.reserve
        header = (f"{one_line(str(p.info.name or args.profile))}{' (synthetic)' if p.info.synthetic else ''}: "
                  f"{analysis.model.num_layers} layers on {'exactly' if options.exact else 'at most'} {options.devices} x "
                  f"{', '.join(sorted(set(target_names)))} ({size}"
                  f"{f', {options.headroom:.0%} kept free' if options.headroom else ''}"
                  f"{(f', {reserve:,.2f} GiB reserved' if gpu else f', {reserve:,} bytes reserved') if options.reserve else ''})\n"
                  f"objective: {options.objective}; schedule: {options.schedule}"
                  f"{f' with {options.micro_batches} micro-batches' if options.schedule != 'none' else ''}")
        parts = [header, plan_summary(plan, options.micro_batches, gpu=gpu)]
        text = "\n".join(parts) + "\n"
        if plan.stages:
            from .table import gpu_view
            table = stages_table(plan)
            text += "\n" + render([gpu_view(table) if gpu else table])
        if advice.baselines:
            text += "\n" + render([comparison_table([plan] + advice.baselines)])
        if reproduction is not None:
            text += "\n" + reproduction + "\n"
        sys.stdout.write(text)
    if reproduction is not None and not reproduction.startswith("reproduced"):
        return 1
    return 0 if plan.feasible else 1


def _from_plan(args: argparse.Namespace):
    """The request a plan recorded, and its profile (the one given, else the recorded path)."""
    from .options import SolveRequest
    from .plan import read_plan
    recorded = read_plan(args.from_plan)
    record = recorded.inputs.get("request")
    if not isinstance(record, dict):
        raise StagesplitError(f"{args.from_plan}: inputs.request: expected the recorded request of a plan written by "
                              "this stagesplit version; solve again to record one")
    profile = args.profile or recorded.profile.get("path")
    if not profile:
        raise StagesplitError(f"{args.from_plan}: profile.path: the plan records no profile path; give the profile")
    return SolveRequest.from_record(record, str(args.from_plan)), profile


def _compare_with_plan(path: str, plan) -> str:
    """One line per finding: whether the split (and the profile it was made from) is the same."""
    from .plan import read_plan
    recorded = read_plan(path)
    lines = []
    want, got = recorded.profile.get("sha256"), plan.profile.get("sha256")
    if want and got and want != got:
        lines.append(f"note: the profile's SHA-256 ({got[:12]}...) differs from the one recorded ({want[:12]}...)")
    old = [(s.first_layer, s.last_layer, s.device) for s in recorded.stages]
    new = [(s.first_layer, s.last_layer, s.device) for s in plan.stages]
    if old == new and recorded.layer_names == plan.layer_names:
        lines.insert(0, f"reproduced: the split is identical to {path}'s {recorded.split_text}")
    else:
        lines.insert(0, f"differs from {path}: recorded {recorded.split_text}, now {plan.split_text}")
    for a, b in zip(recorded.phases, plan.phases):
        if a.value != b.value or a.status != b.status:
            lines.append(f"  {a.quantity}: recorded {a.value} ({a.status}), now {b.value} ({b.status})")
    return "\n".join(lines)


def _device_counts(text: str) -> list[int]:
    from .guards import device_counts
    return device_counts(text, MAX_DEVICES)          # bounded before any list is built


def cmd_sweep(args: argparse.Namespace) -> int:
    import json
    from .advise import sweep
    from .report import sweep_table
    from .table import render
    counts = _device_counts(args.devices)
    request, analysis, resolved, table, progress = _prepare_solve(args, max(counts))
    options, target_names = resolved.options, resolved.target_names
    done = []

    def on_row(row):
        done.append(row)
        progress.start(f"solved {len(done)}/{len(counts)} device counts")

    rows = sweep(resolved.model, options, counts, table=table, profile_path=args.profile, target_names=target_names,
                 on_row=on_row)
    from .api import record_request
    for row in rows:
        record_request(row.plan, request.with_devices(row.devices), resolved.targets or [analysis.profile.target])
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
    from .api import diagnose
    from .diagnosis import diagnosis_tables
    from .table import render
    model = _analysis(args).model
    result = diagnose(model, plan=args.plan, layers=args.layers, top=args.top, window=args.window)
    if args.plot:
        from .plot import plot_liveness
        s = max(result.stages, key=lambda x: x.total / x.capacity)
        from .diagnosis import live_bytes_by_step
        by_step, in_stage = live_bytes_by_step(model, s.first, s.last, s.tile)
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


def cmd_import(args: argparse.Namespace) -> int:
    """ONNX model -> full-form profile (stagesplit/io/onnximport.py)."""
    from .config import load_target
    from .io import save_profile
    from .io.onnximport import import_onnx, parse_dims
    from .layers import LayerOptions, group_layers
    result = import_onnx(args.model, load_target(args.target), batch=args.batch, dims=parse_dims(args.dim),
                         training=args.training, dtype=args.dtype, name=args.name)
    profile = result.profile
    options = _layer_options(args)
    layers = group_layers(profile, options)
    if options != LayerOptions():       # explicit grouping: stored with the operations
        profile.operations.layer = [layers.names[l] if l >= 0 else None for l in layers.op_layer]
    for message in result.warnings:
        _warn(message)
    save_profile(profile, args.output)
    forward = sum(n.flops for n in result.nodes)
    print(f"wrote {args.output}: {len(result.nodes):,} nodes, {len(layers.names):,} layers, parameters "
          f"{result.param_bytes:,} bytes ({len(result.shared)} shared), forward {forward / 1e9:.4g} GFLOPs, "
          f"training: {args.training}", file=sys.stderr)
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


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_plan
    from .plan import read_plan
    text = export_plan(read_plan(args.plan), args.to, training=not args.inference, model=args.model)
    _emit(text, args.output)
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    from .torchcapture import capture
    from .io import save_profile
    profile = capture(args.model, optimizer=args.optimizer, dtype=args.dtype, amp=args.amp, target=args.target,
                      allocator_round=args.allocator_round, name=args.name, layer_regex=args.layer_regex,
                      torch_logs=args.debug)
    for message in profile.info.warnings:
        _warn(message)
    save_profile(profile, args.output)
    v = profile.variables
    print(f"wrote {args.output}: {profile.info.name}, {len(profile.operations):,} operations (program steps), "
          f"{len(v):,} tensor storages; parameters, gradients and optimizer state {v.bytes[v.always_live].sum() / 2**30:.3f} "
          f"GiB; {profile.operations.compute.sum():.3g} FLOPs", file=sys.stderr)
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
    p.add_argument("--ipu-columns", action="store_true",
                   help="on a GPU target, still show bytes, the tiles section and the code columns")
    p.add_argument("--target", metavar="T", help="device target name or YAML file whose rates give the time columns "
                   "(default: the profile's device)")
    _add_efficiency(p)
    p.set_defaults(run=cmd_breakdown)

    p = command("solve", help="optimal split points for N devices (CP-SAT), with a plan file and plots")
    _add_profile(p, optional=True)
    _add_solver_options(p)
    p.add_argument("--from-plan", metavar="PLAN",
                   help="run the request recorded in PLAN again (on its recorded profile unless one is given) and "
                        "report whether the split is identical (exit 1 if not)")
    _add_layer_options(p)
    p.add_argument("--compare", action="store_true", help="also show PopLiner's greedy and a uniform split")
    p.add_argument("--unlayered-first", action="store_true",
                   help="with --compare, the greedy puts operations with no layer on the first stage only, "
                        "as PopLiner does (default: they count as --shared says, like every other method)")
    p.add_argument("--ipu-columns", action="store_true",
                   help="on a GPU target, still show bytes and the per-tile and code columns")
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

    p = command("import", help="import an ONNX model as a profile (needs stagesplit[onnx])")
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
    p.set_defaults(run=cmd_import)

    p = command("synth", help="generate a synthetic profile (labelled synthetic)")
    p.add_argument("family", choices=("bert-base", "bert-large", "gpt", "cnn"))
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument("--target", default="ipu-mk2", help="device target (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="number of encoder/decoder layers (bert-base, gpt)")
    p.add_argument("--piece-bytes", type=int, help="split tensors into lowered variables of about this size")
    p.add_argument("--programs-per-op", type=int, help="forward programs (liveness steps) per operation")
    p.set_defaults(run=cmd_synth)

    from .export import FORMATS
    p = command("export", help="write a plan's split in a training framework's own form (snippet or config)",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="formats:\n" + "\n".join(f"  {f.name:<17} {f.description}" for f in FORMATS.values()))
    p.add_argument("plan", metavar="PLAN", help="plan file from solve --out (.json or .yaml)")
    p.add_argument("--to", required=True, choices=tuple(FORMATS), metavar="FORMAT",
                   help="one of: " + ", ".join(FORMATS))
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    p.add_argument("--inference", action="store_true", help="no gradient accumulation in the pipeline options")
    p.add_argument("--model", default="model", metavar="NAME", help="the model's Python name in snippets "
                   "(default: %(default)s)")
    p.set_defaults(run=cmd_export)

    p = command("capture", help="record a PyTorch training step's memory and FLOPs on CPU (fake tensors) as a profile",
                description="Run one training step (forward, loss, backward, optimizer step) of a PyTorch model "
                "under torch's FakeTensorMode on the CPU: no real memory is allocated and no GPU is needed. Every "
                "aten operation is one program step; every tensor storage a variable with its bytes and live "
                "interval. Parameters, buffers, gradients and optimizer state are always live. Writes the full "
                "form (one tile holding the target's memory) with FLOPs as compute. Needs pip install "
                "'stagesplit[torch]'.")
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
    p.set_defaults(run=cmd_capture)

    p = command("targets", help="list the shipped device targets")
    _add_output(p)
    p.set_defaults(run=cmd_targets)
    return parser


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path checked before any input is read or any file written (see guards)."""
    from .guards import check_outputs
    plot = getattr(args, "plot", None)
    if plot:
        from .plot import FORMATS as PLOT_FORMATS
    outputs = [("--out", getattr(args, "out", None), None), ("--plot", plot, PLOT_FORMATS if plot else None),
               ("--output", getattr(args, "output", None), None)]
    inputs = [getattr(args, name, None) for name in ("profile", "debug_cbor", "config", "layer_compute", "plan")]
    target = getattr(args, "target", None)
    if isinstance(target, str):
        inputs += [t.strip() for t in target.split(",") if t.strip().endswith((".yaml", ".yml"))]
    check_outputs(outputs, inputs)


def _safe_stdout() -> None:
    """Names that UTF-8 cannot encode (lone surrogates from JSON escapes) print as escapes
    instead of crashing the table printer."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass


#: the Python API's parameter names (errors.OptionError.parameter) as command-line flags
FLAGS = {"devices": "--devices", "targets": "--target", "target": "--target", "objective": "--objective",
         "schedule": "--schedule", "micro_batches": "--micro-batches", "headroom": "--headroom",
         "reserve": "--reserve", "min_layers": "--min-layers", "max_layers": "--max-layers",
         "pin_splits": "--pin-split", "pin_layers": "--pin-layer", "communication": "--communication",
         "link_bandwidth": "--link-bandwidth", "efficiency": "--efficiency", "shared": "--shared",
         "layer_compute": "--layer-compute", "time_limit": "--time-limit", "workers": "--workers",
         "plan": "--plan", "layers": "--layers", "top": "--top", "window": "--window"}


def _with_flag(exc: StagesplitError) -> str:
    from .errors import OptionError
    if isinstance(exc, OptionError):
        return f"{FLAGS.get(exc.parameter, exc.parameter)}: {exc.detail}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    from .safeinput import one_line
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    _safe_stdout()
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "command", None):
            build_parser().print_help(sys.stderr)
            return EXIT_USAGE
        run: Callable[[argparse.Namespace], int] = args.run
        _check_outputs(args)
        return run(args)
    except StagesplitError as exc:
        if debug:
            traceback.print_exc()
        print(f"stagesplit: error: {one_line(_with_flag(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stagesplit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:                    # an input too large for this machine: still bad input, one line
        if debug:
            traceback.print_exc()
        print("stagesplit: error: out of memory: the input is too large for this machine", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        print(f"stagesplit: internal error: {type(exc).__name__}: {one_line(str(exc))[:500]} (run with --debug "
              "for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
