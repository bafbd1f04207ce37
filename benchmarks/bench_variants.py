"""Profile variants benchmark (issue 24, IPU part): solve time on BERT-base-sized variants.

The shipped synthetic BERT-base (12 encoder layers and the head, 1472 tiles) re-costed at several
memory proportions (examples/make_variants.py). For 3 and 5 variants, device counts 2..6 and the
three objectives, the table shows: the seconds to price every range of every variant, the
search's wall seconds on the variants and on the slowest single variant alone (the same request),
the status, each stage's proportion, and the gain of the variants plan over the best single
variant's plan in the objective's own terms (each variant alone solved optimally for it): step
time, the fullest stage's bytes, or the devices used.

A second table scales the layer count: random per-layer training profiles of 200 layers on 64 GPUs
and 500 on 128 (80 GB), 1, 3 and 5 variants (workspace x p / 0.6, compute x sqrt(0.6 / p)),
without a schedule and with 1F1B and 128 micro-batches.

Run from the repository root:  python benchmarks/bench_variants.py [--tiny]
(``--tiny``: 3 variants on 2 and 3 devices, and 12 layers on 4 GPUs, in seconds.)
"""

from __future__ import annotations

import sys
import time

from _common import ROOT, tiny_mode

sys.path.insert(0, str(ROOT / "examples"))


def variant_models(proportions):
    from make_variants import variant

    from stagesplit import api
    from stagesplit.io import load_profile
    models = []
    for p in proportions:
        profile = variant(load_profile(ROOT / "profiles" / "bert-base.stagesplit"), p)
        models.append(api.analyze(profile).model)
    return models


def step(plan) -> float | None:
    if not plan.stages:
        return None
    return (plan.inputs.micro_batches + len(plan.stages) - 1) * max(s.stage_time for s in plan.stages)


def versus(objective: str, plan, singles) -> str:
    """The best single variant's objective value over the variants plan's: step time (compute),
    the fullest stage's bytes (memory) or the devices used (devices); > 1: the variants win."""
    def value(p):
        if objective == "memory":
            return max(s.worst_tile_bytes for s in p.stages)
        return len(p.stages) if objective == "devices" else step(p)
    if not plan.stages:
        return "-"
    fitting = [value(s) for s in singles if s.stages]
    if not fitting:
        return "only variants fit"
    unit = {"compute": "step", "memory": "memory", "devices": "devices"}[objective]
    return f"{min(fitting) / value(plan):.3f}x {unit}"


def scaled_models(layers: int, proportions, seed: int = 7):
    """Per-layer training variants of one random model on an 80 GB GPU."""
    import numpy as np

    from stagesplit.io.layerform import LayerSpec, build_layer_profile
    from stagesplit.io.targets import load_target
    from stagesplit.model.analysis import Analysis
    rng = np.random.default_rng(seed)
    w, a, o = rng.integers(200, 1400, layers), rng.integers(20, 200, layers), rng.integers(4, 16, layers)
    c, ws = rng.integers(50, 400, layers), rng.integers(100, 2000, layers)
    out = []
    for p in proportions:
        specs = [LayerSpec(f"block{i}", weights=int(w[i]) * 2**20, activations=int(a[i]) * 2**20,
                           output=int(o[i]) * 2**20, workspace=int(ws[i] * p / 0.6) * 2**20,
                           compute=float(c[i]) * 1e12 * (0.6 / p) ** 0.5) for i in range(layers)]
        out.append(Analysis.of(build_layer_profile(specs, load_target("a100-80gb"), training=True)).model)
    return out


def table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]], note: str) -> None:
    width = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print(title)
    print("=" * len(title))
    print("  ".join(h.ljust(w) for h, w in zip(header, width)))
    print("  ".join("-" * w for w in width))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, width)))
    print(f"{note}\n")


def main() -> int:
    from indexed_inputs import indexed_inputs
    from stagesplit.plan.advise import advise
    from stagesplit.plan.search import price
    from stagesplit.plan.variants import advise_variants
    from stagesplit.solver.problem import SolveOptions
    tiny = tiny_mode()
    rows = []
    for proportions in ((0.2, 0.4, 0.6),) if tiny else ((0.2, 0.4, 0.6), (0.1, 0.2, 0.4, 0.6, 0.8)):
        models = variant_models(proportions)
        names = [f"amp{p:g}" for p in proportions]
        for objective in ("compute", "memory", "devices"):
            for devices in (2, 3) if tiny else (2, 3, 4, 6):
                options = SolveOptions(devices=devices, objective=objective, time_limit=60)
                start = time.perf_counter()
                tables = [price(m, options, max_devices=devices) for m in models]
                priced = time.perf_counter() - start
                start = time.perf_counter()
                plan = advise_variants(models, names, proportions, indexed_inputs(models[0], options), tables=tables).plan
                solved = time.perf_counter() - start
                singles, single_seconds = [], []
                for m, t in zip(models, tables):
                    start = time.perf_counter()
                    singles.append(advise(m, indexed_inputs(m, options), table=t).plan)
                    single_seconds.append(time.perf_counter() - start)
                gain = versus(objective, plan, singles)
                rows.append((str(len(proportions)), str(devices), objective, f"{priced:.2f}", f"{solved:.3f}",
                             f"{max(single_seconds):.3f}", plan.status,
                             ",".join(f"{s.memory_proportion:g}" for s in plan.stages) or "-", gain))
    table("Profile variants of the synthetic BERT-base (12 layers, 1472 tiles): solve time",
          ("variants", "devices", "objective", "price s", "solve s", "one profile s", "status", "proportions",
           "vs best single"), rows,
          "price s: every range of every variant priced; solve s: the exact DP (and CP-SAT where it does not prove), "
          "as solve runs it; one profile s: the slowest single variant's search; vs best single: the best "
          "single-variant plan's step time, fullest stage or devices over the variants plan's (> 1: variants win)")
    rows = []
    for layers, devices in ((12, 4),) if tiny else ((200, 64), (500, 128)):
        for schedule, micro in (("none", 1), ("1f1b", 128)):
            counts = ((0.6,), (0.2, 0.4, 0.6)) if tiny else ((0.6,), (0.2, 0.4, 0.6), (0.1, 0.2, 0.4, 0.6, 0.8))
            for proportions in counts:
                models = scaled_models(layers, proportions)
                options = SolveOptions(devices=devices, schedule=schedule, micro_batches=micro, time_limit=60)
                start = time.perf_counter()
                tables = [price(m, options) for m in models]
                priced = time.perf_counter() - start
                start = time.perf_counter()
                plan = advise_variants(models, [f"amp{p:g}" for p in proportions], proportions,
                                       indexed_inputs(models[0], options),
                                       tables=tables).plan
                solved = time.perf_counter() - start
                rows.append((str(layers), str(devices), schedule, str(len(proportions)), f"{priced:.2f}",
                             f"{solved:.3f}", plan.status))
    table("Per-layer variants at scale (80 GB GPUs): solve time against the number of variants",
          ("layers", "devices", "schedule", "variants", "price s", "solve s", "status"), rows,
          "1 variant is the plain problem (a variants solve of one profile)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
