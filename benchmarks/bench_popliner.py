"""Side by side with PopLiner (issue 10): stagesplit and Graphcore's greedy splitter on one profile.

Both tools read PopVision profiles through libpva (``pva``); here both read the same
BERT-Large-scale profile.pop (26 layers, 1,472 tiles, 5,497 steps, 1,264,504 lowered variables,
with a debug.cbor) through the libpva test double in tests/fake_pva, each in a fresh interpreter
so that its peak RSS is its own:

1. reading alone: ``pva.openReport`` and one lean pass over every object both tools read (what
   both pay to the reader; the double, like libpva, makes its objects on access, and hands out
   its millions of variables from C arrays as a C++ library does);
2. stagesplit end to end: read (``load_profile``, which reads a report this large on two cores:
   programs, tiles and ground truth in a forked child), group layers and build the cost model,
   price every layer range, solve (``advise`` with its default objective) for N IPUs;
3. PopLiner end to end with its own code, imported from a checkout of graphcore/popliner: what
   its ``--solve --num-ipus N`` does (``OperationList``, ``GreedySolver.solve`` with its default
   memory per tile and layer regex, ``get_splits_totals``), minus the logo and coloured logging.

The table shows wall times, CPU time (all processes of each tool; PopLiner forks a pool of
workers too), peak RSS, the ratio PopLiner / stagesplit end to end and without the shared
reading time, and both tools' splits and worst stage memory (each by its own model), so
that one can see they solved the same problem.

Run from the repository root:
    python benchmarks/bench_popliner.py --popliner /path/to/popliner [--ipus 8] [--repeat 1] [--tiny]
Without --popliner it says so in one line and prints the stagesplit figures alone. ``--tiny``: the
same on a BERT with 4 encoder layers (split onto 2 IPUs unless --ipus says otherwise), in seconds.
PopLiner needs numpy and tqdm (its coloredlogs is only used by its command line).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, bert_large_profile_path, print_table

FAKE_PVA = ROOT / "tests" / "fake_pva"
SKIPPED = "PopLiner side-by-side skipped: pass --popliner DIR (a checkout of graphcore/popliner)"
FORMAT = "1"            # bump when the generated profile.pop/debug.cbor change


# ----------------------------------------------------------------------------------------------
# The profile: generated once, cached in the temp folder


def popvision_profile(tiny: bool = False) -> tuple[Path, Path]:
    """profile.pop and debug.cbor of the BERT-Large-scale benchmark profile (``tiny``: the
    4-layer one), in the form the libpva test double reads (regenerated when the profile, the
    double or this format change)."""
    compact = bert_large_profile_path(tiny)
    digest = hashlib.sha256((compact.name + (FAKE_PVA / "pva.py").read_text() + FORMAT).encode()).hexdigest()[:12]
    name = "bert-4-layers" if tiny else "bert-large"
    folder = Path(tempfile.gettempdir()) / f"stagesplit-bench-popvision-{name}-{digest}"
    pop, debug = folder / "profile.pop", folder / "debug.cbor"
    if not (pop.exists() and debug.exists()):
        start = time.perf_counter()
        _child("generate", str(compact), str(folder))       # a child: this process stays small
        print(f"generated {folder.name}/profile.pop and debug.cbor in {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
    return pop, debug


def generate(compact: str, folder: str) -> dict:
    import pva

    from stagesplit.io import load_profile
    profile = load_profile(compact)
    ops = profile.operations
    contexts, seen = [], set()
    for i in range(len(ops)):                         # one onnx-layer context per debug id, as PopART writes
        did = int(ops.debug_id[i])
        if did < 0 or did in seen:
            continue
        seen.add(did)
        name = ops.name[i]
        contexts.append({"id": did, "name": name, "layer": "onnx", "category": "op", "opName": name,
                         "opType": name.rsplit("/", 1)[-1], "input": list(ops.inputs[i])})
    out = Path(folder)
    pva.write_debug_cbor(out / "debug.cbor.part", contexts)
    pva.write_report_file(out / "profile.pop.part", compact)
    os.replace(out / "debug.cbor.part", out / "debug.cbor")
    os.replace(out / "profile.pop.part", out / "profile.pop")
    return {"contexts": len(contexts)}


# ----------------------------------------------------------------------------------------------
# Measurements, each in a fresh interpreter


def _child(kind: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--measure", kind, *args], capture_output=True, text=True,
                          cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"the {kind} measurement failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _peak_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (stagesplit's forked reader, PopLiner's
    pool workers), user + system."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def read_alone(pop: str, debug: str) -> dict:
    """What both tools pay to the reader: ``pva.openReport``, then one lean pass over every
    object both read (the double, like libpva, makes them on access): each brief variable's
    id, bytes, tile and class (and each class's steps once), each program's per-tile code and
    vertex counts, each tile's memory and vertices, each operation's programs and variables."""
    from operator import attrgetter

    import numpy as np
    import pva
    start = time.perf_counter()
    report = pva.openReport(pop, debug)
    opened = time.perf_counter() - start
    c = report.compilation
    brief = c.loweredVariables.allBriefVars
    rows = np.fromiter(map(attrgetter("id", "bytes", "tileId", "equivalenceClass.id"), brief),
                       dtype=[("id", np.int64), ("bytes", np.int64), ("tile", np.int64), ("cls", np.int64)],
                       count=len(brief))
    for i in np.unique(rows["cls"], return_index=True)[1].tolist():
        [(s.start, s.end) for s in brief[i].equivalenceClass.steps]
    steps = [s.program._id for s in c.livenessProgramSteps]
    for program in c.programs:
        np.asarray(program.controlCodeByTile), np.asarray(program.codeBytesByTile)
        if program.type.name == "OnTileExecute":
            for vertex in program.computeset.vertices:
                np.asarray(vertex.countByTile)
    for tile in c.tiles:
        memory = tile.memory
        memory.alwaysLiveBytes, [(v.type.name, v.codeBytes) for v in memory.vertices]
    get_id = attrgetter("_id")
    operations = pva.OperationAnalysis(report).operations
    for op in operations:
        [get_id(p) for p in op.programs()], np.fromiter(map(get_id, op.vars), np.int64)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "open_seconds": opened, "peak_mb": _peak_mb(), "tiles": c.target.tilesPerIpu,
            "bytes_per_tile": c.target.bytesPerTile, "steps": len(steps), "variables": len(brief),
            "programs": len(c.programs), "operations": len(operations)}


def run_stagesplit(pop: str, debug: str, ipus: str) -> dict:
    from stagesplit.api import analyze, resolve
    from stagesplit.io import load_profile
    from stagesplit.plan.advise import advise
    from stagesplit.plan.search import price
    from stagesplit.solver.request import SolveRequest
    phases = {}
    cpu = _cpu_seconds()
    start = time.perf_counter()
    profile = load_profile(pop, debug)
    phases["read"] = time.perf_counter() - start
    t = time.perf_counter()
    analysis = analyze(profile)                       # group layers + cost model
    phases["layers"] = time.perf_counter() - t
    t = time.perf_counter()
    request = SolveRequest(devices=int(ipus))         # every option at its default (objective: compute)
    resolved = resolve(request, analysis)
    table = price(resolved.model, resolved.inputs.options, max_devices=request.devices)
    phases["price"] = time.perf_counter() - t
    t = time.perf_counter()
    plan = advise(resolved.model, resolved.inputs, table=table).plan
    phases["solve"] = time.perf_counter() - t
    total = time.perf_counter() - start
    names = analysis.layers.names
    return {"seconds": total, "cpu_seconds": _cpu_seconds() - cpu, "phases": phases, "peak_mb": _peak_mb(),
            "workers_peak_mb": _peak_mb(resource.RUSAGE_CHILDREN), "status": plan.status,
            "objective": request.objective.value, "layers": len(names),
            "stages": [[names[s.first_layer], names[s.last_layer]] for s in plan.stages],
            "worst_bytes": [int(s.worst_tile_bytes) for s in plan.stages]}


def run_popliner(pop: str, debug: str, ipus: str, popliner_dir: str) -> dict:
    sys.path.insert(0, popliner_dir)
    import logging
    logging.getLogger("root").setLevel(logging.WARNING)      # its command line logs at INFO
    import popliner.parse_args
    import pva
    from popliner.greedy_solver import GreedySolver
    from popliner.operation_list import OperationList
    args = popliner.parse_args.default_args()                 # its defaults: regex, layer order, memory per tile
    args.num_ipus = int(ipus)
    phases = {}
    cpu = _cpu_seconds()
    start = time.perf_counter()
    report = pva.openReport(pop, debug)
    phases["open"] = time.perf_counter() - start
    t = time.perf_counter()
    operations = OperationList(report, args)
    phases["operations"] = time.perf_counter() - t
    t = time.perf_counter()
    solver = GreedySolver(operations)
    proportion = solver.solve(args.num_ipus, args.mem_per_tile)
    splits = solver.get_splits_totals()
    phases["solve"] = time.perf_counter() - t
    total = time.perf_counter() - start
    layers = [layer for layer in operations.layers() if layer is not None]
    return {"seconds": total, "cpu_seconds": _cpu_seconds() - cpu, "phases": phases, "peak_mb": _peak_mb(),
            "workers_peak_mb": _peak_mb(resource.RUSAGE_CHILDREN),
            "proportion": proportion, "mem_per_tile": args.mem_per_tile, "layer_regex": args.layer_name_regex,
            "layers": len(layers),
            "stages": [[s["layer_from"] if s["layer_from"] is not None else layers[0], s["layer_to"]] for s in splits],
            "worst_bytes": [int(s["mem"]["max_tile_mem"]) for s in splits]}


def measure(kind: str, args: list[str]) -> None:
    sys.path.insert(0, str(FAKE_PVA))                         # the libpva test double, for every kind
    fn = {"generate": generate, "read": read_alone, "stagesplit": run_stagesplit, "popliner": run_popliner}[kind]
    print(json.dumps(fn(*args)))


# ----------------------------------------------------------------------------------------------
# The table


def _split(stages: list[list[str]]) -> str:
    return " | ".join(a if a == b else f"{a}-{b}" for a, b in stages) or "none"


def _worst(worst: list[int]) -> str:
    return f"{max(worst):,} B" if worst else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--popliner", metavar="DIR", help="a checkout of graphcore/popliner (its source folder)")
    ap.add_argument("--ipus", type=int, default=None, help="IPUs both tools split the model onto (default 8; "
                    "2 with --tiny)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each this many times, alternating, and keep the fastest (default 1)")
    ap.add_argument("--tiny", action="store_true", help="a BERT with 4 encoder layers: the same code in seconds "
                    "(not the benchmark's figures)")
    args = ap.parse_args(argv)
    if args.ipus is None:
        args.ipus = 2 if args.tiny else 8
    popliner_dir = None
    if args.popliner:
        popliner_dir = Path(args.popliner).resolve()
        if not (popliner_dir / "popliner" / "greedy_solver.py").is_file():
            ap.error(f"--popliner {args.popliner}: expected a checkout of graphcore/popliner "
                     "(a folder holding popliner/greedy_solver.py)")

    pop, debug = popvision_profile(args.tiny)
    runs: dict[str, list[dict]] = {"read": [], "stagesplit": [], "popliner": []}
    for _ in range(max(args.repeat, 1)):
        runs["read"].append(_child("read", str(pop), str(debug)))
        runs["stagesplit"].append(_child("stagesplit", str(pop), str(debug), str(args.ipus)))
        if popliner_dir:
            runs["popliner"].append(_child("popliner", str(pop), str(debug), str(args.ipus), str(popliner_dir)))
    read, ours, theirs = (min(runs[k], key=lambda r: r["seconds"]) if runs[k] else None
                          for k in ("read", "stagesplit", "popliner"))

    scale = "4-layer BERT (--tiny)" if args.tiny else "BERT-Large-scale"
    print(f"{scale} profile.pop through the libpva test double: {ours['layers']} layers, {read['tiles']:,} "
          f"tiles x {read['bytes_per_tile']:,} B, {read['steps']:,} steps, {read['variables']:,} lowered variables, "
          f"{read['programs']:,} programs, {read['operations']:,} operations; split onto {args.ipus} IPUs"
          + (f"; fastest of {args.repeat} runs each" if args.repeat > 1 else ""))
    if theirs is None:
        print(SKIPPED)
    print()
    p = ours["phases"]
    rows = [
        ("reading alone: openReport + one pass over what both read", f"{read['seconds']:.2f} s", ""),
        ("  of which pva.openReport", f"{read['open_seconds']:.2f} s", ""),
        ("  peak RSS", f"{read['peak_mb']:,.0f} MB", ""),
        ("stagesplit end to end", f"{ours['seconds']:.2f} s", ""),
        ("  CPU time, both processes", f"{ours['cpu_seconds']:.2f} s", ""),
        ("  read_popvision (incl. openReport, debug.cbor; two processes)", f"{p['read']:.2f} s", ""),
        ("  group layers + cost model", f"{p['layers']:.2f} s", ""),
        ("  price all layer ranges", f"{p['price']:.2f} s", ""),
        (f"  advise (objective {ours['objective']})", f"{p['solve']:.2f} s", ""),
        ("  peak RSS (main process)", f"{ours['peak_mb']:,.0f} MB", ""),
        ("  peak RSS (forked reader)", f"{ours['workers_peak_mb']:,.0f} MB", ""),
    ]
    if theirs is not None:
        q = theirs["phases"]
        e2e = theirs["seconds"] / ours["seconds"]
        own_ours, own_theirs = ours["seconds"] - read["seconds"], theirs["seconds"] - read["seconds"]
        rows += [
            ("PopLiner end to end", f"{theirs['seconds']:.2f} s", ""),
            ("  CPU time, all processes", f"{theirs['cpu_seconds']:.2f} s", ""),
            ("  pva.openReport", f"{q['open']:.2f} s", ""),
            ("  OperationList (read + layer names)", f"{q['operations']:.2f} s", ""),
            ("  GreedySolver.solve + totals", f"{q['solve']:.2f} s", ""),
            ("  peak RSS (main process)", f"{theirs['peak_mb']:,.0f} MB", ""),
            ("  peak RSS (largest forked pool worker)", f"{theirs['workers_peak_mb']:,.0f} MB", ""),
            ("ratio PopLiner / stagesplit, end to end", f"{e2e:.1f}x", ">= 10x"),
            ("ratio without the shared read", f"{own_theirs / own_ours:.1f}x" if own_ours > 0 else "n/a", ">= 10x"),
            ("ratio of CPU time", f"{theirs['cpu_seconds'] / ours['cpu_seconds']:.1f}x", ""),
        ]
    found = f"stagesplit {ours['layers']}" + (f", PopLiner {theirs['layers']}" if theirs is not None else "")
    rows += [("layers found (each tool's default layer regex)", found, ""),
             (f"stagesplit split ({ours['status']}, {len(ours['stages'])} stages)", _split(ours["stages"]), ""),
             ("  worst stage memory (worst tile, its model)", _worst(ours["worst_bytes"]), "")]
    if theirs is not None:
        fitted = (f"fitted at {100 * theirs['proportion']:.0f}% of {theirs['mem_per_tile']:,} B"
                  if theirs["proportion"] else "no fit: best effort")
        rows += [(f"PopLiner split ({fitted}, {len(theirs['stages'])} stages)", _split(theirs["stages"]), ""),
                 ("  worst stage memory (worst tile, its model)", _worst(theirs["worst_bytes"]), "")]
    print_table(f"stagesplit and PopLiner on one {scale} profile.pop, {args.ipus} IPUs", rows)
    if theirs is not None:
        print("PopLiner's first stage also holds the operations outside any layer; its pool workers are forked "
              "from the main process (copy-on-write), so their RSS is not added to it. stagesplit reads the programs, "
              "tiles and ground truth in one forked child while the main process reads variables and operations; "
              "the ratio without the shared read is less telling for it, since it does that reading on two cores.")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    sys.exit(main())
