"""Check the caching-allocator replay (stagesplit/model/allocator.py) against torch's own allocator on
a GPU: the same allocations and frees, made through ``torch.cuda.caching_allocator_alloc`` and
``caching_allocator_delete`` on one stream, must reserve exactly the bytes the replay says
(``torch.cuda.max_memory_reserved``) and hand out exactly its allocated bytes
(``torch.cuda.max_memory_allocated``).

The sequences: random interleavings of sizes that exercise every rule (small and large pools, the
20 MiB segments, splitting thresholds, oversize blocks), with torch's defaults, ``max_split_size_mb``,
``roundup_power2_divisions`` and ``expandable_segments``; and each device's sequence of a plan of the
shipped GPT capture under 1F1B and ZBV (profiles/gpt-captured.stagesplit, 2 devices). Each runs in a
fresh process, with its ``PYTORCH_CUDA_ALLOC_CONF`` set before CUDA starts.

Run from the repository root on a machine with CUDA:  python benchmarks/validate_allocator.py
Or in two halves: ``--predict FILE`` here (no GPU needed), ``--measure FILE`` there (PyTorch only).
Target: every sequence exact. ``--tiny``: the predictions of a few short sequences, and the measurement
where there is a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
SIZES = [1, 512, 4000, 300 * 1024, MiB, MiB + 1, 3 * MiB, 9 * MiB + 7, 10 * MiB, 12 * MiB, 19 * MiB,
         25 * MiB + 3, 40 * MiB, 64 * MiB]
CONFS = ["", "max_split_size_mb:32", "roundup_power2_divisions:4", "expandable_segments:True"]


def _random_sequence(seed: int, count: int) -> tuple[list[int], list[int]]:
    import numpy as np
    rng = np.random.default_rng(seed)
    sizes = [int(SIZES[i]) for i in rng.integers(0, len(SIZES), count)]
    events, live, made = [], [], 0
    while made < count or live:
        if made < count and (not live or rng.random() < 0.55):
            events.append(made)
            live.append(made)
            made += 1
        else:
            events.append(~live.pop(int(rng.integers(0, len(live)))))
    return sizes, events


def predict(tiny: bool = False) -> list[dict]:
    """Every sequence with the replay's peaks (CPU only)."""
    import numpy as np

    import stagesplit
    from stagesplit.model.allocator import parse_alloc_conf, replay
    from stagesplit.solver.schedule_allocator import cublas_workspaces, rank_events
    from stagesplit.solver.schedule_generation import build_schedule
    cases = []
    for conf in CONFS:
        for seed in range(2 if tiny else 10):
            sizes, events = _random_sequence(seed, 30 if tiny else 400)
            cases.append(dict(name=f"random {seed}", conf=conf, sizes=sizes, events=events))
    if not tiny:
        for kind in ("1f1b", "zbv"):
            plan = stagesplit.solve(ROOT / "profiles" / "gpt-captured.stagesplit", 2, schedule=kind, allocator="off")
            s = plan.schedule
            bounds = [st.first_layer for st in plan.stages] + [plan.stages[-1].last_layer + 1]
            schedule = build_schedule(s.kind, 2, s.micro_batches, s.chunks_per_rank)
            for rank, (sizes, events) in enumerate(rank_events(plan.analysis, bounds, schedule,
                                                               cublas_workspaces("h200"))):
                for conf in ("", "expandable_segments:True"):
                    cases.append(dict(name=f"gpt {kind} rank {rank}", conf=conf, sizes=sizes.tolist(),
                                      events=events.tolist()))
    for case in cases:
        r = replay(np.array(case["sizes"], np.int64), np.array(case["events"], np.int64),
                   parse_alloc_conf(case["conf"]))
        case.update(reserved=r.reserved_peak, allocated=r.allocated_peak)
    return cases


def run_one(path: str, index: int) -> None:
    """One sequence through torch's allocator, in this fresh process: prints the two peaks."""
    import torch
    case = json.loads(Path(path).read_text())[index]
    device = torch.device("cuda")
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats(device)
    held: dict[int, int] = {}
    for e in case["events"]:
        if e >= 0:
            if case["sizes"][e]:                  # 0 bytes: no memory (the replay's rule too)
                held[e] = torch.cuda.caching_allocator_alloc(case["sizes"][e], device)
        elif ~e in held:
            torch.cuda.caching_allocator_delete(held.pop(~e))
    print(torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device))


def measure(path: str) -> int:
    import torch
    if not torch.cuda.is_available():
        print("validate_allocator: no CUDA device here: run this on a machine with an NVIDIA GPU and a CUDA build "
              "of PyTorch", file=sys.stderr)
        return 2
    cases = json.loads(Path(path).read_text())
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: {len(cases)} sequences")
    wrong = 0
    for i, case in enumerate(cases):
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": case["conf"]}
        done = subprocess.run([sys.executable, __file__, "--one", path, str(i)], env=env, capture_output=True,
                              text=True, timeout=600)
        if done.returncode:
            print(f"{case['name']} [{case['conf'] or 'defaults'}]: failed: {done.stderr.strip()[-300:]}")
            wrong += 1
            continue
        reserved, allocated = (int(x) for x in done.stdout.split())
        ok = (reserved, allocated) == (case["reserved"], case["allocated"])
        wrong += not ok
        print(f"{case['name']:<18} [{case['conf'] or 'defaults'}]: reserved {reserved:,} (replay {case['reserved']:,}), "
              f"allocated {allocated:,} (replay {case['allocated']:,}){'' if ok else '  DIFFERENT'}", flush=True)
    print(f"{len(cases) - wrong} of {len(cases)} exact")
    return 1 if wrong else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        run_one(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["--predict"]:
        cases = predict("--tiny" in argv)
        Path(argv[1]).write_text(json.dumps(cases))
        print(f"{len(cases)} sequences written to {argv[1]}")
        return 0
    if argv[:1] == ["--measure"]:
        return measure(argv[1])
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "sequences.json")
        Path(path).write_text(json.dumps(predict("--tiny" in argv)))
        return measure(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
