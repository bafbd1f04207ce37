"""Scale benchmark (issue 10): 96- and 128-layer profiles on 1,472 tiles, from reading the file
to a proven split, and a sweep over 1..64 devices. Each measurement runs in a fresh interpreter,
so its peak RSS is its own.

Targets on a 2-core machine:
  * 96 layers, ~1M variables: load + price every range + solve under 15 s and 2 GB;
    total / floor at most 10x, where the floor is one pass over the input (every array of the
    file read into memory);
  * 128 layers, ~3M variables: within 4 GB;
  * ``sweep --devices 1..64`` on the 96-layer profile: under 30 s (pricing shared by all counts).

Run from the repository root:  python benchmarks/bench_scale.py [--quick | --tiny]
(--quick: the 96-layer rows only; --tiny: the same code on 6 layers on 6 IPUs and a sweep over
1..6 devices, in seconds.)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, peak_rss_mb, print_table, run_measurement, tiny_mode


def profile_path(layers: int, piece_bytes: int) -> Path:
    """A synthetic BERT-style profile with ``layers`` layers (embeddings, encoder layers,
    head), cached in the temp folder and regenerated when the generator changes."""
    import hashlib

    import stagesplit.io.builder
    import stagesplit.io.synth as synth
    source = "".join(Path(m.__file__).read_text() for m in (synth, stagesplit.io.builder))
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"stagesplit-bench-scale-{layers}-{piece_bytes}-{digest}.stagesplit"
    if not path.exists():
        # in a child process: Linux keeps a process's peak RSS across fork and exec, so a parent
        # grown by the generator would show in every measurement it starts afterwards
        start = time.perf_counter()
        run_measurement(__file__, "generate", str(layers), str(piece_bytes), str(path))
        print(f"generated {path.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def generate(layers: str, piece_bytes: str, path: str) -> None:
    from dataclasses import replace

    import stagesplit.io.synth as synth
    from stagesplit.io import save_profile
    from stagesplit.io.targets import load_target
    model = synth.bert(layers=int(layers) - 2, hidden=1024, heads=16, numbered_embeddings=True, tiles=1472)
    model.options = replace(model.options, piece_bytes=int(piece_bytes), programs_per_op=6)
    save_profile(synth._Generator(model, load_target("ipu-mk2")).run(), path)
    print(json.dumps({"path": path}))


def measure_solve(path: str, devices: str) -> None:
    """Floor (every array read), then load, layers + model, pricing and the solve."""
    import zipfile

    import numpy as np
    t0 = time.perf_counter()
    with zipfile.ZipFile(path) as z:                   # the floor: one pass over the input
        total_bytes = 0
        for name in z.namelist():
            with z.open(name) as f:
                total_bytes += np.lib.format.read_array(f, allow_pickle=False).nbytes
    floor = time.perf_counter() - t0
    from stagesplit.api import analyze, resolve
    from stagesplit.io import load_profile
    from stagesplit.plan.advise import advise
    from stagesplit.plan.search import price
    from stagesplit.solver.request import SolveRequest
    t1 = time.perf_counter()
    profile = load_profile(path)
    t2 = time.perf_counter()
    analysis = analyze(profile)
    request = SolveRequest(devices=int(devices))
    resolved = resolve(request, analysis)
    t3 = time.perf_counter()
    table = price(resolved.model, resolved.inputs.options)
    t4 = time.perf_counter()
    advice = advise(resolved.model, resolved.inputs, table=table)
    t5 = time.perf_counter()
    plan = advice.plan
    print(json.dumps({"layers": analysis.model.num_layers, "variables": len(profile.variables),
                      "steps": profile.num_steps, "program_entries": sum(len(c) for c in profile.programs.categories()
                                                                          .values()) + len(profile.programs.vertex_code),
                      "columns": analysis.model.num_columns, "floor": floor, "array_mb": total_bytes / 2**20,
                      "load": t2 - t1, "model": t3 - t2, "price": t4 - t3, "solve": t5 - t4, "rss": peak_rss_mb(),
                      "status": plan.status, "stages": len(plan.stages),
                      "gap": max((p.gap or 0) for p in plan.phases) if plan.phases else None}))


def measure_sweep(path: str, counts: str) -> None:
    from stagesplit.api import sweep
    t0 = time.perf_counter()
    rows = sweep(path, counts)
    elapsed = time.perf_counter() - t0
    fits = [r.devices for r in rows if r.fits]
    proven = sum(1 for r in rows if r.plan.status == "optimal")
    print(json.dumps({"seconds": elapsed, "rss": peak_rss_mb(), "rows": len(rows), "fewest": min(fits) if fits else None,
                      "proven": proven}))


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--measure":
        {"solve": measure_solve, "sweep": measure_sweep, "generate": generate}[sys.argv[2]](*sys.argv[3:])
        return
    quick, tiny = "--quick" in sys.argv, tiny_mode()
    cases = [(6, 65536, "6", "")] if tiny else [(96, 22000, "48", "< 2,000 MB")]
    if not quick and not tiny:
        cases.append((128, 9000, "64", "< 4,000 MB"))
    for layers, piece, devices, rss_target in cases:
        path = profile_path(layers, piece)
        m = run_measurement(__file__, "solve", str(path), devices)
        total = m["load"] + m["model"] + m["price"] + m["solve"]
        print_table(f"Scale: {m['layers']} layers, {m['variables']:,} variables, 1,472 tiles, {devices} IPUs", [
            ("program steps / timeline columns", f"{m['steps']:,} / {m['columns']:,}", ""),
            ("per-program code entries", f"{m['program_entries']:,}", ""),
            ("floor: read every array of the file", f"{m['floor']:.2f} s ({m['array_mb']:,.0f} MB)", ""),
            ("load profile (+ SHA-256 of the bytes read)", f"{m['load']:.2f} s", ""),
            ("layers + cost model", f"{m['model']:.2f} s", ""),
            ("price the layer ranges", f"{m['price']:.2f} s", ""),
            ("solve (exact DP; CP-SAT for what it leaves)", f"{m['solve']:.2f} s ({m['status']}, {m['stages']} stages)", ""),
            ("total", f"{total:.2f} s", "< 15 s" if layers <= 96 else ""),
            ("total / floor", f"{total / m['floor']:.1f}x", "<= 10x"),
            ("peak RSS", f"{m['rss']:,.0f} MB", rss_target),
        ])
    layers, piece, counts = (6, 65536, 6) if tiny else (96, 22000, 64)
    path = profile_path(layers, piece)
    s = run_measurement(__file__, "sweep", str(path), f"1..{counts}")
    print_table(f"Sweep: {layers} layers, --devices 1..{counts} (pricing shared by every count)", [
        ("device counts solved", f"{s['rows']}", ""),
        ("proven optimal", f"{s['proven']} of {s['rows']}", ""),
        ("fewest devices that fit", f"{s['fewest']}", ""),
        (f"wall time (load, price once, {counts} solves)", f"{s['seconds']:.1f} s", "< 30 s"),
        ("peak RSS", f"{s['rss']:,.0f} MB", ""),
    ])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
