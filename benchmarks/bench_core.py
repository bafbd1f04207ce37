"""Core benchmark (issue 2): load a BERT-Large-scale profile and price every contiguous layer
range. Target on a 2-core machine: all of it under 20 s and 3 GB.

Run from the repository root:  python benchmarks/bench_core.py [--tiny]
(``--tiny``: the same on a 4-layer BERT from the same generator, in seconds)
"""

from __future__ import annotations

import json
import sys
import time

from _common import bert_large_profile_path, peak_rss_mb, print_table, run_measurement, tiny_mode


def measure(path: str) -> None:
    from stagesplit.io import load_profile
    from stagesplit.layers import group_layers
    from stagesplit.model.costmodel import StageCostModel
    t0 = time.perf_counter()
    profile = load_profile(path)
    t1 = time.perf_counter()
    layers = group_layers(profile)
    model = StageCostModel(profile, layers)
    t2 = time.perf_counter()
    table = model.price_ranges((1,))
    t3 = time.perf_counter()
    rss = peak_rss_mb()
    L = model.num_layers
    # from scratch, for comparison: a sample of ranges, extrapolated to all of them
    sample = [(a, b) for a in range(0, L, 5) for b in range(a, L, 7)][:12]
    t4 = time.perf_counter()
    for a, b in sample:
        assert model.stage_memory(a, b).worst_bytes() == table.worst_bytes[0, a, b]
    scratch = (time.perf_counter() - t4) / len(sample) * L * (L + 1) / 2
    print(json.dumps({"layers": L, "tiles": profile.target.tiles, "steps": profile.num_steps,
                      "variables": len(profile.variables), "operations": len(profile.operations),
                      "programs": len(profile.programs), "columns": model.num_columns,
                      "load": t1 - t0, "model": t2 - t1, "price": t3 - t2, "rss": rss, "scratch": scratch}))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        measure(sys.argv[2])
        return
    tiny = tiny_mode()
    path = bert_large_profile_path(tiny)
    m = run_measurement(__file__, str(path))
    total = m["load"] + m["model"] + m["price"]
    ranges = m["layers"] * (m["layers"] + 1) // 2
    print_table("Core benchmark: " + ("4-layer BERT profile (synthetic; --tiny)" if tiny else
                                      "BERT-Large-scale profile (synthetic)"), [
        ("layers / tiles / program steps", f"{m['layers']} / {m['tiles']:,} / {m['steps']:,}", ""),
        ("variables / operations / programs", f"{m['variables']:,} / {m['operations']:,} / {m['programs']:,}", ""),
        ("timeline columns after compression", f"{m['columns']:,}", ""),
        ("load (compact .stagesplit)", f"{m['load']:.2f} s", ""),
        ("group layers + build cost model", f"{m['model']:.2f} s", ""),
        (f"price all {ranges} layer ranges", f"{m['price']:.2f} s", ""),
        ("total", f"{total:.2f} s", "< 20 s"),
        ("peak RSS", f"{m['rss']:,.0f} MB", "< 3,000 MB"),
        ("same ranges from scratch (extrapolated)", f"{m['scratch']:.1f} s", "for comparison"),
    ])


if __name__ == "__main__":
    main()
