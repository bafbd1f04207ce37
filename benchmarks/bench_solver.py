"""Solver benchmark (issue 3): pricing and CP-SAT time, and how the optimal split's bottleneck
compares with PopLiner's greedy and a uniform split.

* the BERT-Large-scale profile (26 layers, 1472 tiles) on 16 IPUs: target optimal in 10 s
  (and on 8 IPUs, where the baselines differ more)
* a 200-layer additive per-layer profile on 64 devices: target optimal in 60 s
* the same with every option at once (issue 10): 1F1B with 128 micro-batches, the devices
  objective (and compute, memory), mixed capacities (every third device half the memory) and
  communication: ``advise`` (exact DP as hint and bound, then CP-SAT) against CP-SAT alone
  (30 s limit): target proven optimal in seconds
* each of those options alone on 200 layers x 64 devices, and all together: target proven
  optimal in under 10 s; all together on 500 layers x 128 devices: under 60 s

Run from the repository root:  python benchmarks/bench_solver.py [--options-only]
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from _common import bert_large_profile_path, peak_rss_mb, print_table, run_measurement


def additive_model(layers: int = 200, seed: int = 7):
    """``layers`` (200) layers of random size and compute in the per-layer form (inference: a stage needs the
    sum of its layers' weights plus its largest activation), on an 80 GB GPU."""
    from stagesplit.model.analysis import Analysis
    from stagesplit.io.targets import load_target
    from stagesplit.io.layerform import LayerSpec, build_layer_profile
    rng = np.random.default_rng(seed)
    specs = [LayerSpec(f"block{i}", weights=int(rng.integers(200, 1400)) * 2**20,
                       activations=int(rng.integers(20, 200)) * 2**20, output=int(rng.integers(4, 16)) * 2**20,
                       compute=float(rng.integers(50, 400)) * 1e12) for i in range(layers)]
    profile = build_layer_profile(specs, load_target("a100-80gb"), training=False)
    return Analysis.of(profile).model


def all_options(objective: str, time_limit: float = 60):
    from stagesplit.solver.problem import SolveOptions
    cap = 80 * 2**30
    caps = tuple(int(cap * (0.5 if i % 3 == 0 else 1.0)) for i in range(64))
    return SolveOptions(devices=64, objective=objective, schedule="1f1b", micro_batches=128, capacities=caps,
                        communication=True, link_bytes_per_s=600e9, time_limit=time_limit)


def measure_all_options(objective: str) -> None:
    from stagesplit.plan.advise import advise, price
    from stagesplit.solver.problem import build_problem
    from stagesplit.solver.cpsat import solve_cpsat
    t0 = time.perf_counter()
    model = additive_model()
    options = all_options(objective)
    table = price(model, options)
    t1 = time.perf_counter()
    advice = advise(model, options, table=table)
    t2 = time.perf_counter()
    alone = solve_cpsat(build_problem(model, all_options(objective, 30.0), table=table))
    t3 = time.perf_counter()
    plan = advice.plan
    print(json.dumps({"price": t1 - t0, "advise": t2 - t1, "status": plan.status,
                      "proof": "/".join(p.proof for p in plan.phases), "used": len(plan.stages),
                      "alone": t3 - t2, "alone_status": alone.status,
                      "alone_gap": max((p.gap or 0.0 for p in alone.phases), default=None), "rss": peak_rss_mb()}))


OPTION_CASES = ("1f1b", "devices", "mixed", "communication", "all")


def option_request(which: str, devices: int):
    """Issue 10's solver cases: one option at a time, or all of them together."""
    from stagesplit.solver.problem import SolveOptions
    cap = 80 * 2**30
    kw: dict = {"devices": devices, "time_limit": 120.0}
    if which in ("1f1b", "all"):
        kw.update(schedule="1f1b", micro_batches=128)
    if which in ("devices", "all"):
        kw.update(objective="devices")
    if which in ("mixed", "all"):
        kw.update(capacities=tuple(int(cap * (0.5 if i % 3 == 0 else 1.0)) for i in range(devices)))
    if which in ("communication", "all"):
        kw.update(communication=True, link_bytes_per_s=600e9)
    return SolveOptions(**kw)


def measure_option(which: str, layers: str, devices: str) -> None:
    from stagesplit.plan.advise import advise, price
    t0 = time.perf_counter()
    model = additive_model(int(layers))
    options = option_request(which, int(devices))
    table = price(model, options)
    t1 = time.perf_counter()
    advice = advise(model, options, table=table)
    t2 = time.perf_counter()
    plan = advice.plan
    print(json.dumps({"price": t1 - t0, "advise": t2 - t1, "status": plan.status,
                      "gap": max((p.gap or 0.0 for p in plan.phases), default=None),
                      "proof": "/".join(p.proof for p in plan.phases), "used": len(plan.stages), "rss": peak_rss_mb()}))


def measure(case: str, path: str) -> None:
    if case.startswith("option@"):
        measure_option(*case.split("@")[1:])
        return
    if case.startswith("all-options@"):
        measure_all_options(case.split("@")[1])
        return
    from stagesplit.plan.advise import price
    from stagesplit.model.analysis import Analysis
    from stagesplit.solver.dp import greedy, uniform
    from stagesplit.solver.problem import SolveOptions, build_problem
    from stagesplit.solver.cpsat import solve_cpsat
    t0 = time.perf_counter()
    if case.startswith("bert-large"):
        model = Analysis.load(path).model
        devices = int(case.split("@")[1]) if "@" in case else 16
    else:
        model = additive_model()
        devices = 64
    t1 = time.perf_counter()
    options = SolveOptions(devices=devices, time_limit=120)
    table = price(model, options)
    problem = build_problem(model, options, table=table)
    t2 = time.perf_counter()
    base = greedy(problem)
    result = solve_cpsat(problem, hint=base.split)
    t3 = time.perf_counter()
    flat = uniform(problem)
    cold = solve_cpsat(problem)              # no hint: what CP-SAT needs on its own
    t4 = time.perf_counter()

    def bottleneck(solution):
        return float(solution.evaluation.time) if solution.evaluation and solution.evaluation.feasible else None

    opt = float(result.evaluation.time)
    print(json.dumps({
        "layers": model.num_layers, "devices": devices, "load": t1 - t0, "price": t2 - t1, "solve": t3 - t2,
        "solve_cold": t4 - t3, "status": result.status, "status_cold": cold.status, "used": result.evaluation.devices,
        "gap": max(p.gap or 0.0 for p in result.phases),
        "greedy": bottleneck(base) / opt if bottleneck(base) else None, "greedy_method": base.method,
        "greedy_used": base.evaluation.devices if base.feasible else None,
        "uniform": bottleneck(flat) / opt if bottleneck(flat) else None,
        "uniform_fits": flat.feasible, "rss": peak_rss_mb()}))


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[3])
        return
    rows = []
    for layers, devices, target in ((200, 64, "< 10 s"), (500, 128, "< 60 s")):
        for which in OPTION_CASES if layers == 200 else ("all",):
            m = run_measurement(__file__, f"option@{which}@{layers}@{devices}", "-")
            rows.append((f"{layers} x {devices}: {which}", f"{m['price']:.2f} s + {m['advise']:.2f} s, "
                         f"{m['status']} (gap {100 * (m['gap'] or 0):.2f}%, {m['proof']}), {m['used']} used, "
                         f"{m['rss']:,.0f} MB", target))
    print_table("Solver: each option alone and all together (issue 10): price + advise, status, peak RSS", rows)
    if "--options-only" in sys.argv:
        return
    path = str(bert_large_profile_path())
    for case, target in (("bert-large", "< 10 s"), ("bert-large@8", ""), ("additive-200", "< 60 s")):
        m = run_measurement(__file__, case, path)
        ratio = lambda x: f"{x:.3f}x" if x else "does not fit"   # noqa: E731
        print_table(f"Solver benchmark: {case}, {m['layers']} layers on {m['devices']} devices", [
            ("load + build model", f"{m['load']:.2f} s", ""),
            ("price all ranges", f"{m['price']:.2f} s", ""),
            ("CP-SAT, greedy hint (both phases)", f"{m['solve']:.2f} s", target),
            ("CP-SAT, no hint (both phases)", f"{m['solve_cold']:.2f} s", target),
            ("status (gap)", f"{m['status']} ({100 * m['gap']:.2f}%)", "optimal"),
            ("devices used by the optimal split", f"{m['used']}", ""),
            ("greedy bottleneck / optimal", ratio(m["greedy"]), f"{m['greedy_method']}, "
             f"{m['greedy_used']} devices"),
            ("uniform bottleneck / optimal", ratio(m["uniform"]) + ("" if m["uniform_fits"] else " (does not fit)"),
             ""),
            ("peak RSS", f"{m['rss']:,.0f} MB", ""),
        ])
    for objective in ("devices", "compute", "memory"):
        m = run_measurement(__file__, f"all-options@{objective}", path)
        print_table(f"Solver benchmark: 200 layers on 64 mixed devices, 1F1B x 128, communication, "
                    f"--objective {objective}", [
            ("price all ranges", f"{m['price']:.2f} s", ""),
            ("advise: exact DP hint + bound, CP-SAT", f"{m['advise']:.2f} s", "seconds"),
            ("status (what proved each phase)", f"{m['status']} ({m['proof']})", "optimal"),
            ("devices used", f"{m['used']}", ""),
            ("CP-SAT alone, 30 s limit", f"{m['alone']:.2f} s", ""),
            ("CP-SAT alone: status", m["alone_status"] + (" (no split found)" if m["alone_status"] == "unknown" else
                                                           f" (gap {100 * (m['alone_gap'] or 0):.1f}%)"), ""),
            ("peak RSS", f"{m['rss']:,.0f} MB", ""),
        ])


if __name__ == "__main__":
    main()
