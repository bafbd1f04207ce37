"""The commands: each turns its parsed arguments into the API's arguments (a ``SolveRequest``
for the solver's commands), calls one API function and renders what comes back as text,
tables, JSON or files. Progress and warnings arrive through ``TerminalEvents``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import api
from ..errors import StagesplitError, one_line
from ..reporting.layout import context_parallel_line, expert_parallel_line, tensor_parallel_line
from .naming import flags_in

__all__ = ["COMMANDS", "TerminalEvents", "end_progress"]


#: the command's events, so that ``end_progress`` can clear a live line when a command fails
_ACTIVE: list[TerminalEvents] = []


class TerminalEvents(api.Events):
    """Warnings printed to stderr at once; progress as one live line per phase on stderr when
    it is a terminal (plain lines with ``--progress`` when it is not): reporting/progress.py."""

    def __init__(self, progress: bool = False) -> None:
        from ..reporting.progress import Progress
        super().__init__()
        self.progress = Progress(enabled=True if progress else None)
        _ACTIVE.append(self)

    def warn(self, message: str) -> None:
        super().warn(message)
        self.progress.write(f"stagesplit: warning: {one_line(flags_in(str(message)))}")

    def start(self, label: str, unit: str = "") -> None:
        self.progress.start(label, unit)

    def update(self, done: int, total: int) -> None:
        self.progress.update(done, total)

    def done(self, detail: str = "") -> None:
        self.progress.done(detail)


def end_progress() -> None:
    """End every live progress line (a command that failed mid-phase leaves none behind)."""
    while _ACTIVE:
        _ACTIVE.pop().progress.finish()


def _width(args: argparse.Namespace, to_file: bool | None = None) -> int | None:
    """The columns text tables must fit: the terminal's (or $COLUMNS) when stdout is a terminal,
    unless --wide, a machine format or the tables go to a file (``to_file``; default: --out
    given); None (piped output): no limit."""
    to_file = bool(getattr(args, "out", None)) if to_file is None else to_file
    if getattr(args, "wide", False) or to_file or getattr(args, "format", "text") != "text":
        return None
    if sys.stdout.isatty():
        import shutil
        return max(40, shutil.get_terminal_size().columns - 1)
    return None


def _events(args: argparse.Namespace) -> TerminalEvents:
    return TerminalEvents(getattr(args, "progress", False))


def _emit(text: str, out: str | None) -> None:
    if out:
        api.write_text(out, text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _targets(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(t.strip() for t in (getattr(args, "target", None) or "").split(",") if t.strip())


def _layering(args: argparse.Namespace):
    return api.layer_options(layer_regex=args.layer_regex, first_layer_regex=args.first_layer_regex,
                             last_layer_regex=args.last_layer_regex, call_regex=args.call_regex,
                             order=args.layer_order)


def _layer_compute(args: argparse.Namespace) -> dict[str, api.LayerFigure] | None:
    if not getattr(args, "layer_compute", None):
        return None
    return api.load_layer_compute(args.layer_compute)


def _request(args: argparse.Namespace, devices: int):
    """The solve request: the settings file (--config, else the shipped one), flags winning. Each
    declared solve option (solver/options.py) is read from its flag; a switch not given leaves the
    file's value (None), and the few whose words need reading (targets, pins, the compute file)
    are read here."""
    values = {}
    for o in api.SOLVE_OPTIONS:
        dest = o.flag.replace("-", "_") if o.flag else None
        if dest is None or o.name == "devices" or not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        values[o.name] = (True if value else None) if o.parse == "switch" else value
    pins = []
    for item in args.pin_layer:
        name, sep, stage = item.rpartition("=")
        if not sep or not stage.isdigit():
            raise StagesplitError(f"--pin-layer: expected LAYER=STAGE, got '{one_line(item)}'")
        pins.append((name, int(stage)))
    compute = _layer_compute(args) or {}
    values.update(targets=_targets(args), pin_splits=tuple(args.pin_split), pin_layers=tuple(pins),
                  layer_compute=tuple(compute.items()), layer_compute_source=getattr(args, "layer_compute", None))
    return api.solve_request(args.config, devices, layering=_layering(args), **values)


def _gpu_view(args: argparse.Namespace, target_kind: str, tiles: int) -> bool:
    """GPU-facing output (GiB, no IPU-only columns): the target (--target's first, else the
    profile's device) is a GPU and --ipu-columns was not given."""
    if getattr(args, "ipu_columns", False):
        return False
    names = _targets(args)
    if names:
        return api.target(names[0]).kind == "gpu"
    return target_kind == "gpu" and tiles == 1


# -- commands -------------------------------------------------------------------------------------------

def cmd_breakdown(args: argparse.Namespace) -> int:
    from ..reporting.breakdown import DEFAULT_SECTIONS, SECTIONS
    from ..reporting.table import gpu_view, render
    given = args.sections and args.sections != "all"
    sections = tuple(args.sections.split(",")) if given else SECTIONS if args.sections == "all" else DEFAULT_SECTIONS
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise StagesplitError(f"--sections: unknown section '{one_line(unknown[0])}': expected 'all' or some of "
                              f"{', '.join(SECTIONS)}")
    targets = _targets(args)
    result = api.breakdown(args.profile, debug=args.debug_cbor, target=targets[0] if targets else None,
                           efficiency=args.efficiency or 1.0, layering=_layering(args), shared=args.shared or "every",
                           layer_compute=_layer_compute(args), events=_events(args), dp=args.dp,
                           zero=args.zero, reshard_after_forward=args.reshard_after_forward)
    target = result.model.profile.target
    gpu = _gpu_view(args, target.kind, target.tiles)
    if gpu and not given:
        sections = tuple(s for s in sections if s != "tiles")     # one tile: nothing to rank
    tables = result.tables(sections, top_tiles=args.top_tiles)
    if gpu:
        tables = [gpu_view(t) for t in tables]
    _emit(render(tables, args.format, width=_width(args), naming=flags_in), args.out)
    return 0


def cmd_solve(args: argparse.Namespace) -> int:
    from ..reporting.summary import solve_text
    if args.layout == "auto":
        return _solve_layout(args)
    _no_layout_options(args, "solve --layout auto --gpus G")
    if args.gpus is not None:
        raise StagesplitError("--gpus: the cluster of the layout search (solve --layout auto --gpus G); "
                              "--devices N gives the pipeline's devices")
    events = _events(args)
    reproduction = None
    profile, debug = _solve_profile(args)
    if args.from_plan:
        if debug is not None:
            raise StagesplitError("--from-plan: give the profile alone (the plan records its inputs)")
        reproduction = api.reproduce(args.from_plan, profile, events=events, out=args.out)
        plan = reproduction.plan
    elif args.devices is None:
        raise StagesplitError("--devices: expected the number of devices (or --from-plan PLAN)")
    elif profile is None:
        raise StagesplitError("expected a profile (or --from-plan PLAN, whose recorded profile is used)")
    else:
        plan = api.solve(profile, request=_request(args, args.devices), debug=debug, events=events)
    if args.out and plan.stages:
        api.write_plan(plan, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    elif args.out:                                    # no plan: an existing file is left as it was
        events.warn(f"no plan written to {args.out}: no split fits")
    if args.plot:
        if plan.stages:
            from ..reporting.plot import plot_plan
            totals = [plan.stage_model(s).stage_memory(s.first_layer, s.last_layer).total(s.in_flight)
                      for s in plan.stages]
            plot_plan(plan, totals, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
        else:
            events.warn(f"no plot written to {args.plot}: no split fits")
    if args.format == "json":
        doc = api.plan_document(plan)
        if plan.baselines:
            doc["compare"] = [api.plan_document(b) for b in plan.baselines]
        sys.stdout.write(flags_in(json.dumps(doc, indent=1)) + "\n")
    else:
        p = plan.profile
        gpu = _gpu_view(args, plan.inputs.targets[0].kind if plan.inputs.targets else "ipu", p.tiles)
        text = solve_text(plan, profile if isinstance(profile, str) else None, gpu,
                          width=_width(args, to_file=False), naming=flags_in)  # --out is the plan file, not this text
        if reproduction is not None:
            text += "\n" + reproduction.text(args.from_plan) + "\n"
        sys.stdout.write(flags_in(text))
    if reproduction is not None and not reproduction.identical:
        return 1
    return 0 if plan.feasible else 1


def _solve_profile(args: argparse.Namespace):
    """solve's profile words: (one profile, its debug.cbor or None), (PROFILE=PROPORTION words,
    None) or (a variants file, None)."""
    words = list(args.profile or [])
    pairs = [api.is_variant_word(w) for w in words]
    if not words:
        return None, None
    if any(pairs):
        if not all(pairs):
            plain = words[pairs.index(False)]
            raise StagesplitError(f"'{one_line(plain)}': expected PROFILE=PROPORTION like the other profile words "
                                  "(profile variants each name their memory proportion)")
        return api.profile_variants(words), None
    if len(words) > 2:
        raise StagesplitError(f"expected one profile (and, for a profile.pop, its debug.cbor), or PROFILE=PROPORTION "
                              f"words for profile variants; got {len(words)} profile words")
    if api.is_variants_file(words[0]):
        if len(words) == 2:
            raise StagesplitError(f"{one_line(words[1])}: a variants file names each variant's debug.cbor itself")
        return api.profile_variants(words[0]), None      # its profiles were checked against --out in main
    return words[0], (words[1] if len(words) == 2 else None)


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..reporting.summary import sweep_table
    from ..reporting.table import render
    if args.gpus is not None:
        return _sweep_layouts(args)
    if args.devices is None:
        raise StagesplitError("--devices: expected device counts like 1..16 (or --gpus 8..64 with --global-batch "
                              "for layouts)")
    _no_layout_options(args, "sweep --gpus RANGE")
    counts = api.device_counts(args.devices)          # bounded before any list is built
    rows = api.sweep(args.profile, counts, request=_request(args, max(counts)), debug=args.debug_cbor,
                     events=_events(args))
    if args.plot:
        from ..reporting.plot import plot_sweep
        name = rows[0].plan.profile.name if len(rows) else ""
        plot_sweep(rows, args.plot, title=f"{name}: devices sweep")
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.format == "json":
        text = flags_in(json.dumps([{"devices": r.devices, "fits": r.fits, "plan": api.plan_document(r.plan)}
                                    for r in rows], indent=1)) + "\n"
    else:
        p = rows[0].plan.profile if len(rows) else None
        gpu = p is not None and _gpu_view(args, "gpu" if p.one_tile else "ipu", p.tiles)
        text = render([sweep_table(rows, gpu=gpu)], args.format, width=_width(args), naming=flags_in)
    if args.format == "text":
        text += rows.summary() + "\n"
    _emit(text, args.out)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from ..reporting.diagnosis import diagnosis_tables, live_bytes_by_step
    from ..reporting.table import render
    result = api.diagnose(args.profile, debug=args.debug_cbor, plan=args.plan, layers=args.layers, top=args.top,
                          window=args.window, layering=_layering(args), shared=args.shared or "every",
                          layer_compute=_layer_compute(args), events=_events(args))
    if args.plot:
        from ..reporting.plot import plot_liveness
        s = max(result.stages, key=lambda x: x.total / x.capacity)
        by_step, in_stage = live_bytes_by_step(result.model, s.first, s.last, s.tile)
        m = s.memory
        code = m.vertex_code + m.vertex_state + m.exchange_code + m.control_code
        one = result.model.profile.target.tiles == 1
        where = "device memory" if one else f"tile {s.tile}"
        peak = f"peak {s.total / 2**30:,.2f} GiB" if one else f"peak {s.total:,} bytes"
        plot_liveness(by_step, in_stage, m.always_live, code, s.capacity, s.step, args.plot,
                      f"{where}, layers {s.layers[0]}..{s.layers[-1]}: memory over the steps ({peak} at step "
                      f"{s.step})", gpu=one, stashed=m.stashed_copies)
        print(f"wrote {args.plot}", file=sys.stderr)
    target = result.model.profile.target
    gpu = _gpu_view(args, target.kind, target.tiles)
    _emit(render(diagnosis_tables(result, gpu=gpu), args.format, width=_width(args), naming=flags_in), args.out)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    profile = api.convert(args.profile, args.output, debug=args.debug_cbor, events=_events(args))
    print(f"wrote {args.output}: {len(profile.variables):,} variables, {len(profile.operations):,} operations, "
          f"{len(profile.programs):,} programs, {profile.num_steps:,} steps", file=sys.stderr)
    return 0


def _dims(items: list[str]) -> dict[str, int]:
    """--dim NAME=VALUE items (their syntax; the values' range is the API's: 1..2**40)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        value = value.strip()
        if not sep or not key.strip() or not value.isascii() or not value.isdigit() or len(value) > 20 or \
                not 1 <= int(value) <= 2**40:
            raise StagesplitError(f"--dim: expected NAME=VALUE with VALUE a whole number in 1..{2**40:,}, "
                                  f"got '{one_line(item)[:80]}'")
        out[key.strip()] = int(value)
    return out


def cmd_import(args: argparse.Namespace) -> int:
    """ONNX model -> full-form profile (stagesplit/io/onnximport.py)."""
    result = api.import_onnx(args.model, args.output, target=args.target, batch=args.batch, dims=_dims(args.dim),
                             training=args.training, dtype=args.dtype, name=args.name, layering=_layering(args),
                             events=_events(args))
    forward = sum(n.flops for n in result.nodes)
    print(f"wrote {args.output}: {len(result.nodes):,} nodes, {len(result.layers):,} layers, parameters "
          f"{result.param_bytes:,} bytes ({len(result.shared)} shared), forward {forward / 1e9:.4g} GFLOPs, "
          f"training: {args.training}", file=sys.stderr)
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    profile = api.synthesize(args.family, args.output, target=args.target, seed=args.seed, layers=args.layers,
                             piece_bytes=args.piece_bytes, programs_per_op=args.programs_per_op, events=_events(args))
    print(f"wrote {args.output}: {profile.info.name} (synthetic), {len(profile.variables):,} variables, "
          f"{len(profile.operations):,} operations, {profile.num_steps:,} steps", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    text = api.export(args.plan, args.to, training=not args.inference, model=args.model)
    _emit(text, args.output)
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    found = api.capture(args.model, args.output, events=_events(args), optimizer=args.optimizer, dtype=args.dtype,
                        amp=args.amp, target=args.target, allocator_round=args.allocator_round, name=args.name,
                        layer_regex=args.layer_regex, torch_logs=args.debug, tp=args.tp,
                        sequence_parallel=args.sp, tp_plan=args.tp_plan, kernels=args.kernels, cp=args.cp,
                        ep=args.ep, master_weights=args.master_weights, loss_parallel=args.loss_parallel)
    profiles: tuple[Any, ...] = tuple(getattr(found, "profiles", (found,)))    # a ParallelVariants' each
    if len(profiles) > 1:
        degrees = ", ".join(map(str, getattr(found, "degrees", ())))
        print(f"wrote {args.output}: {profiles[0].info.name}, one rank at each of {len(profiles)} tensor-parallel "
              f"degrees ({degrees})", file=sys.stderr)
    for profile in profiles:
        v = profile.variables
        layout = profile.info.parallel_layout
        what = f"TP {layout.tensor_parallel if layout is not None else 1}" if len(profiles) > 1 else \
            f"wrote {args.output}: {profile.info.name}"
        print(f"{what}, {len(profile.operations):,} operations (program steps), "
              f"{len(v):,} tensor storages; parameters, gradients and optimizer state "
              f"{v.bytes[v.always_live].sum() / 2**30:.3f} GiB; {profile.operations.compute.sum():.3g} FLOPs",
              file=sys.stderr)
        if layout is not None and (layout.tensor_parallel > 1 or len(profiles) > 1):
            print(tensor_parallel_line(layout), file=sys.stderr)
        if layout is not None and layout.context_parallel > 1:
            print(context_parallel_line(layout), file=sys.stderr)
        if layout is not None and layout.expert_parallel > 1:
            print(expert_parallel_line(layout), file=sys.stderr)
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    from ..reporting.table import Column, Table, render
    t = Table("Device targets", [Column("name"), Column("kind"), Column("tiles", "int", 2),
                                 Column("bytes per tile", "int", 1), Column("device memory", "gib"),
                                 Column("description")])
    for name, target in api.targets().items():
        t.add(name, target.kind, target.tiles, target.bytes_per_tile, target.device_bytes, target.description)
    t.note = "GiB: 2**30 bytes, as in every command (solve's capacities, breakdown, diagnose, plots)"
    _emit(render([t], args.format, width=_width(args), naming=flags_in), args.out)
    return 0


def _layout_arguments(args: argparse.Namespace, target: str | None) -> dict:
    """The layout search's arguments from the options ``_add_layout_options`` declares (the same
    for layouts, solve --layout auto and sweep --gpus), all but the GPUs."""
    from ..errors import OptionError
    tp_profiles: dict[int, str] = {}
    for word in args.tp_profile:
        degree, sep, path = word.partition("=")
        if not sep or not degree.isdigit():
            raise OptionError("tp_profiles", f"expected T=FILE (a tensor-parallel degree and a profile), got '{word}'")
        tp_profiles[int(degree)] = path
    cp_profiles: dict[int, str] = {}
    for word in args.cp_profile:
        degree, sep, path = word.partition("=")
        if not sep or not degree.isdigit():
            raise OptionError("cp_profiles", f"expected C=FILE (a context-parallel degree and a profile), got '{word}'")
        cp_profiles[int(degree)] = path
    ep_profiles: dict[int, str] = {}
    for word in args.ep_profile:
        degree, sep, path = word.partition("=")
        if not sep or not degree.isdigit():
            raise OptionError("ep_profiles", f"expected E=FILE (an expert-parallel degree and a profile), got '{word}'")
        ep_profiles[int(degree)] = path
    tp_layer_compute: dict[int, str] = {}
    for word in args.tp_layer_compute:
        degree, sep, path = word.partition("=")
        if not sep or not degree.isdigit():
            raise OptionError("tp_layer_compute", f"expected T=FILE (a tensor-parallel degree and a layer-compute "
                              f"file), got '{one_line(word)}'")
        tp_layer_compute[int(degree)] = path
    return dict(layer_compute=args.layer_compute or None, tp_layer_compute=tp_layer_compute, cp=args.cp, cp_profiles=cp_profiles, ep=args.ep, ep_profiles=ep_profiles,
                global_batch=args.global_batch, target=target, gpus_per_node=args.gpus_per_node,
                tp_profiles=tp_profiles, micro_batch_size=args.micro_batch_size, sequence_length=args.seq_len,
                captured_batch=args.captured_batch,
                tp=args.tp, pp=args.pp, dp=args.dp, zero=args.zero,
                reshard_after_forward=args.reshard_after_forward != "off", schedule=args.schedule or None,
                chunks_per_rank=getattr(args, "chunks_per_rank", None),
                time_limit=args.time_limit if args.time_limit is not None else 60.0, events=_events(args),
                runtime_reserve=_runtime_reserve(getattr(args, "runtime_reserve", None)))


def _runtime_reserve(word: object) -> str | int:
    """``--runtime-reserve`` as the API takes it: auto, off, or bytes (not given: auto)."""
    return word if isinstance(word, (str, int)) else "auto"


def _layout_mode(args: argparse.Namespace, what: str) -> str:
    """The one target of solve --layout auto and sweep --gpus, once every option the layout search
    does not read is found left at its default (a value given to one it would ignore is refused,
    naming it): the search sets the devices, micro-batches and link of each combination itself."""
    if args.global_batch is None:
        raise StagesplitError(f"--global-batch: {what} needs the samples per step (--global-batch B)")
    read = {"targets", "dp", "zero", "reshard_after_forward", "schedule", "time_limit", "devices", "runtime_reserve",
            "layer_compute"}
    for o in api.SOLVE_OPTIONS:
        dest = o.flag.replace("-", "_") if o.flag else None
        if dest is None or o.name in read or not hasattr(args, dest):
            continue
        if getattr(args, dest) not in (None, o.cli_default, []):
            raise StagesplitError(f"--{o.flag}: not used by {what}: the layout search sets each combination's "
                                  "devices, micro-batches and links itself")
    for dest, flag in (("config", "--config"), ("plot", "--plot"), ("from_plan", "--from-plan"),
                       ("debug_cbor", "DEBUG")):
        if getattr(args, dest, None):
            raise StagesplitError(f"{flag}: not used by {what}")
    if any(getattr(args, name) != default for name, default in api.LAYER_DEFAULTS.items()) or \
            args.layer_order != "steps":
        raise StagesplitError(f"{what} groups the profile's layers as recorded: give no layer-grouping options")
    targets = _targets(args)
    if len(targets) != 1:
        raise StagesplitError(f"--target: {what} needs one GPU target with a node (stagesplit targets)")
    return targets[0]


#: the layout search's own options (cli/parser.py's ``_add_layout_options``) and their values when not given
_LAYOUT_ONLY: tuple[tuple[str, str, object], ...] = (
    ("gpus_per_node", "--gpus-per-node", None), ("global_batch", "--global-batch", None),
    ("micro_batch_size", "--micro-batch-size", None), ("captured_batch", "--captured-batch", None),
    ("seq_len", "--seq-len", None), ("tp_profile", "--tp-profile", []),
    ("tp", "--tp", None), ("pp", "--pp", None), ("cp_profile", "--cp-profile", []), ("cp", "--cp", None),
    ("ep_profile", "--ep-profile", []), ("ep", "--ep", None), ("tp_layer_compute", "--tp-layer-compute", []))


def _no_layout_options(args: argparse.Namespace, what: str) -> None:
    """A layout search option given to solve or sweep without the search is refused, not ignored."""
    for dest, flag, default in _LAYOUT_ONLY:
        if getattr(args, dest) != default:
            raise StagesplitError(f"{flag}: an option of the layout search ({what})")
    if "," in (args.schedule or ""):
        raise StagesplitError(f"--schedule: several schedules are the layout search's ({what}); without it give one "
                              "(auto tries each)")


def cmd_layouts(args: argparse.Namespace) -> int:
    import json

    from ..reporting.layouts import comparison_json, comparison_text, layouts_json, layouts_text
    if args.compare:
        cmp = api.layout_comparison(args.profile, gpus=args.gpus, **_layout_arguments(args, args.target))
        text = (json.dumps(comparison_json(cmp), indent=2) + "\n" if args.format == "json" else
                layouts_text(cmp.chosen) + "\n" + comparison_text(cmp))
        _emit(flags_in(text), args.out)
        return 0 if cmp.chosen.best is not None else 1
    lp = api.layouts(args.profile, gpus=args.gpus, **_layout_arguments(args, args.target))
    text = json.dumps(layouts_json(lp), indent=2) + "\n" if args.format == "json" else layouts_text(lp)
    _emit(flags_in(text), args.out)
    return 0 if lp.best is not None else 1           # as solve: 1 when nothing fits, having said why


def _solve_layout(args: argparse.Namespace) -> int:
    """solve --layout auto: the layout search (the same ``api.layouts`` as the layouts command),
    the best layout's plan written and shown as solve shows a plan, then the search's table."""
    from ..reporting.layouts import layouts_json, layouts_text
    from ..reporting.summary import solve_text
    if args.gpus is None:
        raise StagesplitError("--layout auto: expected the cluster's GPUs (--gpus G) and the samples per step "
                              "(--global-batch B)")
    if args.devices is not None:
        raise StagesplitError("--devices: the layout search chooses the pipeline stages (--pp fixes them)")
    profile, debug = _solve_profile(args)
    if profile is None or not isinstance(profile, str) or debug is not None:
        raise StagesplitError("--layout auto: expected one profile file (a rank's at tensor-parallel degree 1, "
                              "--tp-profile T=FILE for the others; or one holding a rank at each degree, as "
                              "capture --tp 1,2,4,8 writes)")
    target = _layout_mode(args, "--layout auto")
    arguments = _layout_arguments(args, target)
    lp = api.layouts(profile, gpus=args.gpus, **arguments)
    plan = lp.plan
    if args.out and plan is not None:
        api.write_plan(plan, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    elif args.out:                                    # no plan: an existing file is left as it was
        arguments["events"].warn(f"no plan written to {args.out}: no layout fits")
    if args.format == "json":
        doc = {"plan": api.plan_document(plan) if plan is not None else None, "layouts": layouts_json(lp)}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        gpu = not args.ipu_columns                       # the layout search's targets are GPUs
        text = solve_text(plan, profile, gpu, width=_width(args, to_file=False), naming=flags_in) + "\n" \
            if plan is not None else ""
        sys.stdout.write(flags_in(text + layouts_text(lp)))
    return 0 if lp.best is not None else 1


def _sweep_layouts(args: argparse.Namespace) -> int:
    """sweep --gpus RANGE: the layout search for each GPU count (``api.layout_sweep``), a row per
    count with its best layout, step and tokens/s per GPU, and the fewest GPUs that fit."""
    from ..reporting.layouts import gpu_sweep_json, gpu_sweep_table
    from ..reporting.table import render
    if args.devices is not None:
        raise StagesplitError("--devices: give --devices (pipeline stages) or --gpus (layouts), not both")
    target = _layout_mode(args, "sweep --gpus")
    counts = api.gpu_counts(args.gpus)                   # bounded before any list is built
    result = api.layout_sweep(args.profile, gpus=counts, **_layout_arguments(args, target))
    if args.format == "json":
        text = json.dumps(gpu_sweep_json(result), indent=1) + "\n"
    else:
        text = render([gpu_sweep_table(result)], args.format, width=_width(args), naming=flags_in)
    if args.format == "text":
        text += result.summary() + "\n"
    _emit(text, args.out)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    written = api.report(args.plan, args.output, args.profile, events=_events(args))
    print(f"wrote {written}", file=sys.stderr)
    return 0


COMMANDS = {"report": cmd_report, "breakdown": cmd_breakdown, "solve": cmd_solve, "sweep": cmd_sweep, "diagnose": cmd_diagnose,
            "convert": cmd_convert, "import": cmd_import, "synth": cmd_synth, "export": cmd_export,
            "capture": cmd_capture, "targets": cmd_targets, "layouts": cmd_layouts}
