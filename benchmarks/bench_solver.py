"""Solver benchmark: stagesplit against a plain dynamic program, and the time limit.

**The comparison (issue 26).** For per-layer profiles of 200 layers on 64 devices, 500 on 128 and
1000 on 256 (training, random figures, 80 GB GPUs), each with the default options, 1F1B with 128
micro-batches, mixed capacities (every third device 40 GB), communication, and the devices
objective: ``stagesplit solve`` (the command as a user runs it, ``python -m stagesplit solve``, from
reading the file to writing the plan) and a plain numpy dynamic program written here, independently
of the package (``plain_dp``), each in its own process (with Python's bytecode cache, as an installed
package has it). The table shows
each one's CPU seconds and peak RSS, the ratio, and whether the two found the same optimum (both
objective phases, in the solver's integer units). ``--runs N``: each side N times, in N fresh
processes, the median CPU seconds shown (CPU time is noisy on a shared machine: take N >= 5).
Targets: every ratio <= 2x, and the per-layer solve with the default options and with 1F1B within
1.2x (issue 31; the ``target`` column); 1000 x 256 under 4 s and 200 MB.

**The time limit (issue 18).** ``solve --time-limit 2`` on an 800-layer profile with 128 devices
must end within 3 s (wall) with the best split found and an honest status: the issue's
``--objective memory`` case, and mixed capacities with 1F1B, where the exact DP does not fit in
the limit and CP-SAT searches alone.

``--extended`` adds the earlier tables (BERT-Large scale on IPUs, CP-SAT with and without hints,
issue 10's options alone and together).

Run from the repository root:
  python benchmarks/bench_solver.py [--sizes 200x64,500x128] [--runs 5] [--extended] [--tiny]
(``--tiny``: every table on a few dozen layers and devices, in seconds; its figures are not the benchmark's.)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, TINY_FLAG, bert_large_profile_path, peak_rss_mb, print_table, run_measurement, tiny_mode

#: ``--tiny`` (passed on to every measurement's child): the same code on small sizes
TINY = tiny_mode()
#: the additive model's layers and the all-options case's devices (issue 10's 200 x 64)
ADDITIVE = (16, 6) if TINY else (200, 64)


def additive_model(layers: int = ADDITIVE[0], seed: int = 7):
    """``layers`` (200) layers of random size and compute in the per-layer form (inference: a stage needs the
    sum of its layers' weights plus its largest activation), on an 80 GB GPU."""
    from stagesplit.io.layerform import LayerSpec, build_layer_profile
    from stagesplit.io.targets import load_target
    from stagesplit.model.analysis import Analysis
    rng = np.random.default_rng(seed)
    specs = [LayerSpec(f"block{i}", weights=int(rng.integers(200, 1400)) * 2**20,
                       activations=int(rng.integers(20, 200)) * 2**20, output=int(rng.integers(4, 16)) * 2**20,
                       compute=float(rng.integers(50, 400)) * 1e12) for i in range(layers)]
    profile = build_layer_profile(specs, load_target("a100-80gb"), training=False)
    return Analysis.of(profile).model


def all_options(objective: str, time_limit: float = 60):
    from stagesplit.solver.problem import SolveOptions
    cap = 80 * 2**30
    caps = tuple(int(cap * (0.5 if i % 3 == 0 else 1.0)) for i in range(ADDITIVE[1]))
    return SolveOptions(devices=ADDITIVE[1], objective=objective, schedule="1f1b", micro_batches=128, capacities=caps,
                        communication=True, link_bytes_per_s=600e9, time_limit=time_limit)


def measure_all_options(objective: str) -> None:
    from indexed_inputs import indexed_inputs
    from stagesplit.plan.advise import advise
    from stagesplit.plan.search import price
    from stagesplit.solver.cpsat import solve_split_cpsat
    from stagesplit.solver.problem import build_problem
    t0 = time.perf_counter()
    model = additive_model()
    options = all_options(objective)
    table = price(model, options)
    t1 = time.perf_counter()
    advice = advise(model, indexed_inputs(model, options), table=table)
    t2 = time.perf_counter()
    alone = solve_split_cpsat(build_problem(model, all_options(objective, 30.0), table=table))
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
    from indexed_inputs import indexed_inputs
    from stagesplit.plan.advise import advise
    from stagesplit.plan.search import price
    t0 = time.perf_counter()
    model = additive_model(int(layers))
    options = option_request(which, int(devices))
    table = price(model, options)
    t1 = time.perf_counter()
    advice = advise(model, indexed_inputs(model, options), table=table)
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
    from stagesplit.model.analysis import Analysis
    from stagesplit.plan.search import price
    from stagesplit.solver.cpsat import solve_split_cpsat
    from stagesplit.solver.dp import greedy, uniform
    from stagesplit.solver.problem import SolveOptions, build_problem
    t0 = time.perf_counter()
    if case.startswith("bert-large"):
        model = Analysis.load(path).model
        devices = int(case.split("@")[1]) if "@" in case else 16
    else:
        model = additive_model()
        devices = ADDITIVE[1]
    t1 = time.perf_counter()
    options = SolveOptions(devices=devices, time_limit=120)
    table = price(model, options)
    problem = build_problem(model, options, table=table)
    t2 = time.perf_counter()
    base = greedy(problem)
    result = solve_split_cpsat(problem, hint=base.split)
    t3 = time.perf_counter()
    flat = uniform(problem)
    cold = solve_split_cpsat(problem)              # no hint: what CP-SAT needs on its own
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


def extended() -> None:
    """The earlier tables (issues 3 and 10): BERT-Large scale, CP-SAT with and without a hint, options alone."""
    rows = []
    tiny = (TINY_FLAG,) if TINY else ()
    sizes = ((16, 6, ""), (24, 8, "")) if TINY else ((200, 64, "< 10 s"), (500, 128, "< 60 s"))
    for layers, devices, target in sizes:
        for which in OPTION_CASES if (layers, devices) == sizes[0][:2] else ("all",):
            m = run_measurement(__file__, f"option@{which}@{layers}@{devices}", "-", *tiny)
            rows.append((f"{layers} x {devices}: {which}", f"{m['price']:.2f} s + {m['advise']:.2f} s, "
                         f"{m['status']} (gap {100 * (m['gap'] or 0):.2f}%, {m['proof']}), {m['used']} used, "
                         f"{m['rss']:,.0f} MB", target))
    print_table("Solver: each option alone and all together (issue 10): price + advise, status, peak RSS", rows)
    if "--options-only" in sys.argv:
        return
    path = str(bert_large_profile_path(TINY))
    cases = (("bert-large@3", ""), ("bert-large@2", ""), ("additive-16", "")) if TINY else \
        (("bert-large", "< 10 s"), ("bert-large@8", ""), ("additive-200", "< 60 s"))
    for case, target in cases:
        m = run_measurement(__file__, case, path, *tiny)
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
        m = run_measurement(__file__, f"all-options@{objective}", path, *tiny)
        print_table(f"Solver benchmark: {ADDITIVE[0]} layers on {ADDITIVE[1]} mixed devices, 1F1B x 128, "
                    f"communication, --objective {objective}", [
            ("price all ranges", f"{m['price']:.2f} s", ""),
            ("advise: exact DP hint + bound, CP-SAT", f"{m['advise']:.2f} s", "seconds"),
            ("status (what proved each phase)", f"{m['status']} ({m['proof']})", "optimal"),
            ("devices used", f"{m['used']}", ""),
            ("CP-SAT alone, 30 s limit", f"{m['alone']:.2f} s", ""),
            ("CP-SAT alone: status", m["alone_status"] + (" (no split found)" if m["alone_status"] == "unknown" else
                                                           f" (gap {100 * (m['alone_gap'] or 0):.1f}%)"), ""),
            ("peak RSS", f"{m['rss']:,.0f} MB", ""),
        ])


# -- the plain DP (independent of the package) ----------------------------------------------------

GIB = 2**30
CAPACITY = 80 * GIB                      # a100-80gb; a100-40gb is exactly half
TIME_TOTAL = 10**9                       # integer time units: the documented solver model (see plain_times)
LINK = 25e9                              # --link-bandwidth of the communication case, bytes/s
FLOPS = 312e12                           # the A100 targets' FLOP/s
OPTIONS = ("default", "1f1b", "mixed", "communication", "devices")
#: the CPU ratio to the plain DP each option case is held to (issue 31: a per-layer solve within 1.2x
#: with the default options and 1F1B; issue 26: every case within 2x)
RATIO_TARGETS = {"default": 1.2, "1f1b": 1.2}
SIZES = ((200, 64), (500, 128), (1000, 256))


def plain_profile(layers: int, seed: int = 26) -> dict:
    """A per-layer training profile document of ``layers`` random layers (written with plain dicts)."""
    rng = np.random.default_rng(seed)
    rows = [{"name": f"block{i}", "weights": int(rng.integers(200, 1400)) * 2**20,
             "activations": int(rng.integers(20, 200)) * 2**20, "output": int(rng.integers(4, 16)) * 2**20,
             "other": 0, "workspace": int(rng.integers(0, 64)) * 2**20,
             "compute": float(rng.integers(50, 400)) * 1e9} for i in range(layers)]
    return {"format": "stagesplit-profile", "version": 1, "kind": "layers", "name": f"bench-{layers}",
            "target": "a100-80gb", "training": True, "compute_unit": "flops", "layers": rows}


def cli_options(option: str, devices: int) -> list[str]:
    """The ``stagesplit solve`` flags of one option case."""
    return {"default": [], "1f1b": ["--schedule", "1f1b", "--micro-batches", "128"],
            "mixed": ["--target", ",".join("a100-40gb" if i % 3 == 0 else "a100-80gb" for i in range(devices))],
            "communication": ["--communication", "--link-bandwidth", f"{LINK:g}"],
            "devices": ["--objective", "devices"]}[option]


def plain_times(doc: dict, communication: bool) -> tuple[np.ndarray, np.ndarray]:
    """(up, down) with stage time of layers a..e-1 = up[e] - down[a], in integer units: compute and
    cut transfer times (a cut moves the output forward and its gradient back) scaled so that
    compute plus twice every cut's transfer totals at most 1e9 units, each rounded."""
    flops = np.array([row["compute"] for row in doc["layers"]], float)
    out = np.array([row["output"] for row in doc["layers"]], float)
    cut = np.zeros(len(flops) + 1)
    if communication:
        cut[1:-1] = 2 * out[:-1] / LINK * FLOPS          # seconds of transfer, in FLOPs at the target's rate
    integral = np.allclose(flops, np.round(flops), rtol=0, atol=1e-6) and \
        np.allclose(cut, np.round(cut), rtol=0, atol=1e-6)
    if integral:
        flops, cut = np.round(flops), np.round(cut)
    total = flops.sum() + 2 * cut.sum()
    scale = 1.0 if (integral and total <= TIME_TOTAL) or total == 0 else TIME_TOTAL / total
    prefix = np.concatenate([[0], np.cumsum(np.round(flops * scale).astype(np.int64))])
    units = np.round(cut * scale).astype(np.int64)
    return prefix + units, prefix - units


def plain_dp(doc: dict, devices: int, option: str) -> dict:
    """The optimum of one case, lexicographically (bottleneck time, then worst memory; devices
    objective: fewest stages, then time), by a dynamic program over contiguous splits.

    Memory of a stage a..b (training, one micro-batch): its weights and other bytes, plus the peak
    over its layers' steps of the activations its layers have stashed so far, the running layer's
    workspace, and the running layer's output and input; each extra micro-batch in flight adds the
    stage's activations once more (the last layer's are used at once, not stashed). 1F1B: a stage
    with c stages from it to the end (itself included) holds min(M, c) micro-batches."""
    INF = np.iinfo(np.int64).max // 4
    rows = doc["layers"]
    L = len(rows)
    col = {k: np.array([row[k] for row in rows], np.int64) for k in ("weights", "other", "activations", "output",
                                                                     "workspace")}
    act, out = col["activations"], col["output"]
    acts = np.concatenate([[0], np.cumsum(act)])
    fixed = np.concatenate([[0], np.cumsum(col["weights"] + col["other"])])
    stashed = np.concatenate([[0], np.cumsum(np.where(np.arange(L) < L - 1, act, 0))])
    out_before = np.concatenate([[0], out[:-1]])
    step_peak = acts[1:] + col["workspace"] + out + out_before           # minus acts[a] for a stage from a
    caps = np.array([CAPACITY // 2 if option == "mixed" and i % 3 == 0 else CAPACITY for i in range(devices)])
    micro = 128 if option == "1f1b" else 1
    up, down = plain_times(doc, option == "communication")

    # the band of stage lengths that can fit anywhere: column j is the stage a..a+j
    first = np.arange(L)
    once_cols, stash_cols, time_cols = [], [], []
    peak = np.full(L, -INF)
    for j in range(L):
        last = np.minimum(first + j, L - 1)
        real = first + j < L
        peak = np.maximum(peak, step_peak[last])
        once = np.where(real, fixed[last + 1] - fixed[first] + peak - acts[first], INF)
        if j and not (once <= caps.max()).any():
            break
        once_cols.append(once)
        stash_cols.append(stashed[last + 1] - stashed[first])
        time_cols.append(np.where(real, up[last + 1] - down[first], INF))
    once, stash, stage_time = (np.stack(c, axis=1) for c in (once_cols, stash_cols, time_cols))
    W = once.shape[1]
    ends = np.minimum(first[:, None] + 1 + np.arange(W)[None, :], L)       # e = a + 1 + j

    def memory(k: int) -> np.ndarray:
        return np.where(once < INF, once + (k - 1) * stash, INF)

    def in_flight(c: int) -> int:
        return min(micro, c) if option == "1f1b" else 1

    def by_count(value, bound, count=None):
        """g[c][a]: best max of ``value`` over splits of layers a.. into exactly c stages (identical
        devices); returns (optimum, stage count, g, choices)."""
        g = [np.append(np.full(L, INF), 0)]
        picks = [None]
        for c in range(1, (count or devices) + 1):
            mem = memory(in_flight(c))
            ok = (mem <= CAPACITY) & bound(mem)
            cand = np.where(ok, np.maximum(value(mem), g[-1][ends]), INF)
            j = cand.argmin(axis=1)
            g.append(np.append(cand[first, j], INF))
            picks.append(j)
        counts = range(1, len(g)) if count is None else [count]
        best = min(counts, key=lambda c: (g[c][0], c))
        return int(g[best][0]), best, g, picks

    def by_position(value, bound):
        """f[i][a]: best max of ``value`` over layers a.. on positions i..N-1 (a position may stay empty)."""
        f = np.append(np.full(L, INF), 0)
        choice = []
        for i in range(devices - 1, -1, -1):
            mem = memory(1)
            ok = (mem <= caps[i]) & bound(mem, i)
            cand = np.where(ok, np.maximum(value(mem, i), f[ends]), INF)
            j = cand.argmin(axis=1)
            best = np.append(cand[first, j], INF)
            choice.append(j)
            f = np.minimum(f, best)
        return int(f[0])

    if option == "mixed":
        ppm = lambda mem, i: np.where(mem < INF, -((-mem * 1_000_000) // int(caps[i])), INF)  # noqa: E731
        t = by_position(lambda mem, i: stage_time, lambda mem, i: True)
        m = by_position(ppm, lambda mem, i: stage_time <= t)
        return {"values": [t, m]}
    if option == "devices":
        _, fewest, _, _ = by_count(lambda mem: np.zeros_like(mem), lambda mem: True)
        t, _, _, _ = by_count(lambda mem: stage_time, lambda mem: True, count=fewest)
        return {"values": [fewest, t]}
    t, _, _, _ = by_count(lambda mem: stage_time, lambda mem: True)
    m, _, _, _ = by_count(lambda mem: mem, lambda mem: stage_time <= t)
    return {"values": [t, m]}


# -- measuring each side in its own process --------------------------------------------------------

def child(path: str, devices: int, option: str) -> None:
    """Run the plain DP in this (fresh) process and print its answer as JSON."""
    doc = json.loads(Path(path).read_text())
    print(json.dumps(plain_dp(doc, devices, option)))


def solve_command(path: str, devices: int, option: str) -> tuple[list[str], str]:
    """``stagesplit solve`` as a user runs it (its own process: nothing imported before it) and the
    plan file it writes. The plain DP has the devices' whole capacities: nothing kept back for a CUDA
    context or NCCL (``--runtime-reserve off``)."""
    plan_path = path + f".{option}.{devices}.plan.json"
    return [sys.executable, "-m", "stagesplit", "solve", path, "--devices", str(devices), "--out", plan_path,
            "--runtime-reserve", "off", *cli_options(option, devices)], plan_path


def solve_answer(plan_path: str) -> dict:
    """What the plan file says: the objective's values (the solver's integer units), status and proof."""
    plan = json.loads(Path(plan_path).read_text())
    return {"values": [ph["solver_value"] for ph in plan["objective"]], "status": plan["status"],
            "proof": "/".join(ph.get("proof") or "-" for ph in plan["objective"]),
            "dp_seconds": plan["run"].get("dp_seconds"), "cpsat_seconds": plan["run"].get("cpsat_seconds")}


def child_env() -> dict[str, str]:
    """The children's environment: bytecode caching on, as in an installed package (this
    machine's PYTHONDONTWRITEBYTECODE would make every run compile stagesplit again, 0.2 s)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


def timed(kind: str, path: str, devices: str, option: str) -> tuple[dict, float, float, float]:
    """One side in a fresh interpreter (``kind``: "plain" or "stagesplit"): (its answer, CPU
    seconds, peak RSS in MB, wall seconds)."""
    if kind == "plain":
        argv, plan_path = [sys.executable, __file__, "--child", path, devices, option], None
    else:
        argv, plan_path = solve_command(path, int(devices), option)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
                            env=child_env())
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out, err = proc.stdout.read(), proc.stderr.read()
    if status != 0:
        raise SystemExit(f"{argv}: {err}")
    answer = json.loads(out.strip().splitlines()[-1]) if plan_path is None else solve_answer(plan_path)
    return answer, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, wall


def compare(sizes, runs: int = 1) -> None:
    """The table of stagesplit against the plain DP: each side ``runs`` times per case, each in a
    fresh process, the median CPU seconds and the largest peak RSS."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        warm = str(Path(folder) / "warm.json")              # the first run writes the bytecode caches
        Path(warm).write_text(json.dumps(plain_profile(8)))
        timed("plain", warm, "2", "default"), timed("stagesplit", warm, "2", "default")
        for layers, devices in sizes:
            path = str(Path(folder) / f"layers{layers}.json")
            Path(path).write_text(json.dumps(plain_profile(layers)))
            for option in OPTIONS:
                plains = [timed("plain", path, str(devices), option) for _ in range(runs)]
                mine = [timed("stagesplit", path, str(devices), option) for _ in range(runs)]
                plain, ours = plains[0][0], mine[0][0]
                plain_cpu, cpu = statistics.median(r[1] for r in plains), statistics.median(r[1] for r in mine)
                plain_rss, rss = max(r[2] for r in plains), max(r[2] for r in mine)
                answers = {json.dumps(r[0]["values"]) for r in plains + mine}
                same = "yes" if len(answers) == 1 else f"NO {ours['values']} vs {plain['values']}"
                target = RATIO_TARGETS.get(option, 2.0)
                rows.append((f"{layers} x {devices}", option, f"{plain_cpu:.2f} s, {plain_rss:.0f} MB",
                             f"{cpu:.2f} s, {rss:.0f} MB", f"{cpu / plain_cpu:.2f}x", f"<= {target:g}x",
                             f"{rss / plain_rss:.2f}x", f"{ours['status']} ({ours['proof']})", same))
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    header = ("layers x devices", "option", "plain DP (CPU, RSS)", "stagesplit (CPU, RSS)", "CPU ratio", "target",
              "RSS ratio", "status (proof)", "same optimum")
    print_rows(f"stagesplit solve against a plain numpy DP (fresh process each, median CPU of {runs} "
               f"run{'s' if runs != 1 else ''})", header, rows)


def time_limit_cases() -> None:
    rows = []
    layers, devices = (40, 8) if TINY else (800, 128)
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / f"layers{layers}.json")
        Path(path).write_text(json.dumps(plain_profile(layers, seed=18)))
        cases = (("--objective memory", ["--objective", "memory"]),
                 ("mixed + 1F1B M=128", cli_options("mixed", devices) + cli_options("1f1b", devices)))
        for name, flags in cases:
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "stagesplit", "solve", path, "--devices", str(devices),
                                   "--time-limit", "2", *flags], capture_output=True, text=True, cwd=str(ROOT),
                                  env=child_env())
            wall = time.perf_counter() - start
            status = next((line for line in proc.stdout.splitlines() if line.startswith("status:")), proc.stderr)
            notes = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
            rows.append((name, f"{wall:.2f} s", status, " / ".join(notes)))
    print_rows(f"solve --time-limit 2, {layers} layers x {devices} devices (target: < 3 s wall, best split found, "
               "honest status)", ("case", "wall", "status line", "notes"), rows)


def print_rows(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    width = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(title)
    print("=" * len(title))
    for row in [header, tuple("-" * w for w in width), *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, width)).rstrip())
    print()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    sizes = ((12, 4),) if TINY else SIZES
    if "--sizes" in sys.argv:
        sizes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[sys.argv.index("--sizes") + 1].split(",")]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 1
    compare(sizes, max(runs, 1))
    time_limit_cases()
    if "--extended" in sys.argv:
        extended()


if __name__ == "__main__":
    main()
