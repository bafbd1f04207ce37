"""The caching allocator's replay (issue #33): what it adds to a solve, and what it finds.

On the Llama-2-7B shape (32 blocks, hidden 4096, sequence 4096) on 8 x a100-80gb and the Llama-2-70B
shape (80 blocks, hidden 8192) on 32 x h100-80gb (bench_schedules.py's captures, bfloat16 autocast,
float32 Adam), under 1F1B and ZBV with 2 micro-batches per device: the solve's time without the replay,
the replay's time (every rank's sequence built and replayed: ``solver/schedule_allocator.py``, a rank over
its capacity replayed again within it) and its share of the solve (target: under 10%), the events per rank,
and per rank the reserved over allocated bytes of the replay, and the reserved estimate over the plan's
priced peak.

Run: ``python benchmarks/bench_allocator.py`` (captures cached in the temp folder; the 70B capture takes a
minute the first time); ``--quick``: the 7B shape only; ``--tiny``: Llama shapes 8 and 4 blocks deep, 64
wide, on 2 devices, in seconds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import tiny_mode  # noqa: E402
from bench_schedules import llama_7b, llama_70b  # noqa: E402


def _case(path: Path, name: str, devices: int, target: str, schedule: str) -> str:
    from stagesplit import api
    from stagesplit.solver.request import SolveRequest
    from stagesplit.solver.schedule_allocator import cublas_workspaces, rank_replays
    from stagesplit.solver.schedule_generation import build_schedule
    micro_batches = 2 * devices
    request = SolveRequest(devices=devices, schedule=schedule, micro_batches=micro_batches, targets=(target,),
                           allocator="off", time_limit=60.0)
    start = time.perf_counter()
    plan = api.solve(path, request=request)
    solve_s = time.perf_counter() - start
    if not plan.stages or plan.schedule is None:
        return f"{name:<10} {schedule:<5} {devices:>3} {micro_batches:>4}  {plan.status}: no split to replay"
    s = plan.schedule
    r_cap = s.ranks[0].capacity_bytes
    bounds = [st.first_layer for st in plan.stages] + [plan.stages[-1].last_layer + 1]
    options = ("none", "selective", "full")
    choice = [options.index(o) for st in plan.stages for o in (st.recompute or ("none",) * len(st.layers))]
    start = time.perf_counter()
    reps = rank_replays(plan.analysis, bounds, build_schedule(s.kind, devices, micro_batches, s.chunks_per_rank),
                        [r.peak_bytes for r in s.ranks], request.allocator_options(), cublas_workspaces(target),
                        choice, [r.capacity_bytes for r in s.ranks])
    replay_s = time.perf_counter() - start
    ratios = [r.replay.ratio for r in reps]
    over = [r.reserved_bytes / r.priced_peak for r in reps]
    events = max(r.events for r in reps)
    most = max(reps, key=lambda r: r.reserved_bytes)
    recomputed = sum(1 for c in choice if c)
    return (f"{name:<10} {schedule:<5} {devices:>3} {micro_batches:>4}  {solve_s:8.2f} {replay_s:8.3f} "
            f"{replay_s / solve_s:6.1%} {events:>9,}  {min(ratios):.3f}-{max(ratios):.3f}  "
            f"{min(over):.3f}-{max(over):.3f}  {most.reserved_bytes / 2**30:8.2f} {most.priced_peak / 2**30:8.2f}  "
            f"{sum(1 for r in reps if r.reserved_bytes > r_cap)}/{len(reps)} "
            f"({sum(1 for r in reps if r.fits_after_retries)} retry)  {recomputed}")


def main(argv: list[str]) -> None:
    tiny = tiny_mode(argv)
    quick = "--quick" in argv
    if tiny:
        cases = [(llama_7b(True), "llama-8", 2, "a100-80gb"), (llama_70b(True), "llama-4", 2, "h100-80gb")]
        print("Caching-allocator replay: Llama shapes 8 and 4 blocks deep, hidden 64 (--tiny)")
    else:
        cases = [(llama_7b(), "7B", 8, "a100-80gb")]
        if not quick:
            cases.append((llama_70b(), "70B", 32, "h100-80gb"))
        print("Caching-allocator replay: Llama-2-7B shape on 8 x a100-80gb"
              + ("" if quick else ", Llama-2-70B shape on 32 x h100-80gb"))
    header = (f"{'model':<10} {'kind':<5} {'P':>3} {'M':>4}  {'solve s':>8} {'replay s':>8} {'share':>6} "
              f"{'events':>9}  {'reserved/alloc':>11}  {'reserved/priced':>11}  {'max GiB':>8} {'priced':>8}  {'over':>15}  "
              f"{'recomputed':>10}")
    print(header)
    print("-" * len(header))
    for path, name, devices, target in cases:
        for schedule in ("1f1b", "zbv"):
            print(_case(path, name, devices, target, schedule), flush=True)
    print("\nshare: the replay's time over the solve's (target: under 10%); reserved/alloc: per rank, the "
          "replay's reserved over allocated peak (min-max); reserved/priced: the plan's reserved estimate over "
          "its priced peak with the workspaces (min-max); max GiB: the largest reserved estimate, beside that "
          "rank's priced peak; over: ranks whose reserved estimate passes their capacity (retry: of those, how many "
          "stay within it once the allocator frees cached blocks and retries); recomputed: layers the plan recomputes")


if __name__ == "__main__":
    main(sys.argv[1:])
