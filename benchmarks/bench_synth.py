"""``stagesplit synth`` at scale (issue 26): a BERT-base-style profile of 192 encoder layers on
1,472 tiles written to a compact file, streamed (per-program costs through temporary files into
the compact writer, as the CLI does) against built in memory first (``synthesize`` then
``write_compact``). Each measurement runs in a fresh interpreter, so its peak RSS is its own;
the two files must be byte-identical.

Target on a 2-core machine: 192 layers in under 1 minute and under 1.5 GB peak RSS.

Run from the repository root:  python benchmarks/bench_synth.py [--quick | --tiny]
(--quick: 48 layers only; --tiny: 2 layers, in seconds.)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, peak_rss_mb, print_table, run_measurement, tiny_mode


def measure(mode: str, layers: str, path: str) -> None:
    from stagesplit.io.compact import write_compact
    from stagesplit.io.synth import synthesize, write_synthetic
    from stagesplit.io.targets import load_target
    target = load_target("ipu-mk2")
    wall, cpu = time.perf_counter(), time.process_time()
    if mode == "streamed":
        profile = write_synthetic(path, "bert-base", target, layers=int(layers))
    else:
        profile = synthesize("bert-base", target, layers=int(layers))
        write_compact(profile, path)
    print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "rss": peak_rss_mb(),
                      "variables": len(profile.variables), "steps": profile.num_steps,
                      "bytes": os.path.getsize(path)}))


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--measure":
        measure(*sys.argv[2:])
        return
    sizes = [2] if tiny_mode() else [48] if "--quick" in sys.argv else [96, 192]
    with tempfile.TemporaryDirectory() as tmp:
        for layers in sizes:
            rows = []
            files = {}
            for mode in ("in memory", "streamed"):
                files[mode] = Path(tmp) / f"{mode.replace(' ', '-')}-{layers}.stagesplit"
                m = run_measurement(__file__, mode.split()[0] if mode == "streamed" else "memory", str(layers),
                                    str(files[mode]))
                target = ("< 60 s", "< 1,500 MB") if mode == "streamed" and layers == 192 else ("", "")
                rows += [(f"{mode}: wall time", f"{m['wall']:.1f} s", target[0]),
                         (f"{mode}: CPU time", f"{m['cpu']:.1f} s", ""),
                         (f"{mode}: peak RSS", f"{m['rss']:,.0f} MB", target[1])]
            same = files["in memory"].read_bytes() == files["streamed"].read_bytes()
            rows.append(("the two files byte-identical", "yes" if same else "NO", "yes"))
            print_table(f"synth bert-base --layers {layers}: {m['variables']:,} variables, {m['steps']:,} steps, "
                        f"{m['bytes'] / 2**20:,.0f} MB file", rows)
            files["in memory"].unlink()
            files["streamed"].unlink()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
