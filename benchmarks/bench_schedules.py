"""Pipeline schedules and recompute at real model scale (issues #23 and #24).

Part 1 (schedules): a Llama-2-7B-shaped model (examples/real_models.py ``llama`` at ``full``: 32
blocks, hidden 4096, sequence 4096, batch 1, bfloat16 autocast with float32 weights and Adam)
captured once, split over 8 x a100-80gb with 16 and with 32 micro-batches by ``--schedule auto``:
every schedule torch ships, with 1 to 4 chunks per device where it takes them. Printed: each
schedule's step time, bubble, fullest device, status (optimal; slower: proven to have no split
faster than the plan's) and solve time, and each table's wall time (target: both under 60 s).
``--each`` also solves every schedule alone, each to its own proven optimum.

Part 2 (recompute): a Llama-2-70B-shaped model (80 blocks, hidden 8192, 64 heads, 8 key-value
heads, sequence 4096, batch 1, same precision): the fewest 80 GB GPUs (``--objective devices``,
micro-batches = devices) with 1F1B and with ZBV, without recompute and with ``--recompute auto``,
and the step time there.

Run: ``python benchmarks/bench_schedules.py`` (about 2 minutes on 2 cores; ``--quick``: part 1
only; ``--each``: part 1's schedules also solved alone, several minutes; ``--tiny``: the same on
Llama shapes 8 and 4 blocks deep and 64 wide, part 1 on 2 devices with 4 and 8 micro-batches, in
seconds). Captures are cached in the temp folder.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: ``--each``: the schedules solved alone
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("interleaved-1f1b", 4),
             ("looped-bfs", 2), ("zb-h1", 1), ("zb-h1", 2), ("zbv", 2), ("dualpipev", 2)]


def _cached_capture(name: str, build) -> Path:
    import stagesplit.capturing as capturing  # the cache is stale when any part of the capture changes
    sources = sorted(Path(capturing.__file__).parent.glob("*.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"stagesplit-bench-{name}-{digest}.stagesplit"
    if not path.exists():
        from stagesplit.io import save_profile
        start = time.perf_counter()
        profile = build()
        save_profile(profile, path)
        print(f"captured {name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def llama_7b(tiny: bool = False) -> Path:
    def build():
        from examples.real_models import build as build_model
        from stagesplit.capturing.pytorch import capture_model
        model, inputs = build_model("llama", "full")
        return capture_model(model, inputs, optimizer="adam", amp=True, dtype="float32", name="llama-2-7b-shape")
    if tiny:                            # 8 blocks: room for 4 chunks on each of 2 devices
        return _cached_capture("llama7b-tiny", lambda: _tiny_llama(8, 4, "llama-8-blocks"))
    return _cached_capture("llama7b", build)


def _tiny_llama(blocks: int, kv_heads: int, name: str):
    """``--tiny``: a Llama ``blocks`` deep, 64 wide, sequence 32, captured as the full ones are."""
    import torch
    import transformers as tf

    from stagesplit.capturing.pytorch import capture_model
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=blocks,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64)
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    ids = torch.zeros(1, 32, dtype=torch.long, device="meta")
    return capture_model(model, {"input_ids": ids, "labels": ids}, optimizer="adam", amp=True, dtype="float32",
                         name=name)


def llama_70b(tiny: bool = False) -> Path:
    def build():
        import torch
        import transformers as tf

        from stagesplit.capturing.pytorch import capture_model
        cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                             num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096)
        with torch.device("meta"):
            model = tf.LlamaForCausalLM(cfg)
        ids = torch.zeros(1, 4096, dtype=torch.long, device="meta")
        return capture_model(model, {"input_ids": ids, "labels": ids}, optimizer="adam", amp=True, dtype="float32",
                             name="llama-2-70b-shape")
    if tiny:
        return _cached_capture("llama70b-tiny", lambda: _tiny_llama(4, 2, "llama-4-blocks"))
    return _cached_capture("llama70b", build)


def _solve(path: Path, **request):
    from stagesplit import api
    from stagesplit.solver.request import SolveRequest
    start = time.perf_counter()
    plan = api.solve(path, request=SolveRequest(**request))
    return plan, time.perf_counter() - start


def _row(plan, seconds: float, label: str) -> str:
    if not plan.stages:
        return f"{label}  {'-':>9}  {'-':>6}  {'-':>9}  {plan.status:<10}  {seconds:7.1f}"
    s = plan.schedule
    peak = max(r.peak_bytes for r in s.ranks) / 2**30
    recomputed = sum(st.recomputed_layers for st in plan.stages)
    gap = plan.phases[0].gap if plan.phases and plan.status != "optimal" else None
    return (f"{label}  {s.step_time * 1e3:9.0f}  {s.bubble:6.1%}  {peak:9.2f}  {plan.status:<10}  {seconds:7.1f}"
            + (f"  {recomputed} layers recomputed" if recomputed else "")
            + (f"  (gap {gap:.1%})" if gap is not None else ""))


def schedules(micro_batches: tuple[int, ...], each: bool, tiny: bool = False) -> None:
    """``--schedule auto`` at each micro-batch count: its table of every schedule, timed whole."""
    path = llama_7b(tiny)
    devices = 2 if tiny else 8
    shape = "Llama, 8 blocks, hidden 64, sequence 32 (--tiny)" if tiny else \
        "Llama-2-7B shape (32 blocks, sequence 4096)"
    print(f"{shape}, {devices} x a100-80gb, --schedule auto")
    header = (f"{'schedule':<17} {'v':>2} {'M':>3}  {'step (ms)':>9}  {'bubble':>6}  {'peak GiB':>9}  "
              f"{'status':<10}  {'solve s':>7}")
    total = 0.0
    for m in micro_batches:
        plan, seconds = _solve(path, devices=devices, schedule="auto", micro_batches=m, time_limit=60.0)
        total += seconds
        capacity = plan.schedule.ranks[0].capacity_bytes
        print(f"\nM = {m}: {plan.schedule.kind}, {plan.schedule.chunks_per_rank} chunk(s) per device, "
              f"{plan.schedule.step_time * 1e3:,.0f} ms, {plan.status}; the table in {seconds:.1f} s")
        print(f"  ({plan.notes[-1]})")
        print(header)
        print("-" * len(header))
        for c in sorted(plan.candidates, key=lambda c: (c.step_time is None, c.step_time or 0.0)):
            mark = "*" if (c.schedule, c.chunks_per_rank) == (plan.schedule.kind, plan.schedule.chunks_per_rank) \
                else " "
            step = f"{c.step_time * 1e3:9.0f}" if c.step_time is not None else f"{'-':>9}"
            bubble = f"{c.bubble:6.1%}" if c.bubble is not None else f"{'-':>6}"
            peak = f"{c.worst_memory * capacity / 2**30:9.2f}" if c.worst_memory is not None else f"{'-':>9}"
            print(f"{mark}{c.schedule:<16} {c.chunks_per_rank:>2} {m:>3}  {step}  {bubble}  {peak}  {c.status:<10}  "
                  f"{c.seconds:7.1f}", flush=True)
    print(f"\nboth tables: {total:.1f} s (target: under 60 s)")
    if not each:
        return
    print("\nEvery schedule alone, each to its own proven optimum (--time-limit 60 each)")
    print(header)
    print("-" * len(header))
    for m in micro_batches:
        for kind, v in SCHEDULES:
            plan, seconds = _solve(path, devices=devices, exact=True, schedule=kind, chunks_per_rank=v, micro_batches=m,
                                   time_limit=60.0)
            print(_row(plan, seconds, f"{kind:<17} {v:>2} {m:>3}"), flush=True)


def recompute(tiny: bool = False) -> None:
    path = llama_70b(tiny)
    shape = "Llama, 4 blocks, hidden 64, sequence 32 (--tiny)" if tiny else \
        "Llama-2-70B shape (80 blocks, sequence 4096)"
    print(f"\n{shape}: fewest 80 GB GPUs, micro-batches = devices")
    header = f"{'schedule / recompute':<24}  {'GPUs':>4}  {'step (ms)':>9}  {'bubble':>6}  {'peak GiB':>9}  {'solve s':>7}"
    print(header)
    print("-" * len(header))
    for kind in ("1f1b", "zbv"):
        for mode in ("none", "auto"):
            plan, seconds = _solve(path, devices=128, schedule=kind, objective="devices", recompute=mode,
                                   time_limit=60.0)
            label = f"{kind + ' / ' + mode:<24}"
            if not plan.stages:
                print(f"{label}  {'none':>4}  {'-':>9}  {'-':>6}  {'-':>9}  {seconds:7.1f}  ({plan.message[:70]})",
                      flush=True)
                continue
            s = plan.schedule
            peak = max(r.peak_bytes for r in s.ranks) / 2**30
            print(f"{label}  {len(s.ranks):>4}  {s.step_time * 1e3:9.0f}  {s.bubble:6.1%}  {peak:9.2f}  "
                  f"{seconds:7.1f}  ({sum(st.recomputed_layers for st in plan.stages)} layers recomputed)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="part 1 only")
    parser.add_argument("--each", action="store_true", help="part 1's schedules also solved alone")
    parser.add_argument("--tiny", action="store_true", help="small shapes: the same code in seconds (not the "
                        "benchmark's figures)")
    args = parser.parse_args()
    schedules((4, 8) if args.tiny else (16, 32), args.each, args.tiny)
    if not args.quick:
        recompute(args.tiny)


if __name__ == "__main__":
    main()
