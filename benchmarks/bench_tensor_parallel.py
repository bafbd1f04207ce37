"""Tensor-parallel capture benchmark (issue #35): the Llama-3-70B shape (80 layers, hidden 8192, FFN
28,672, grouped-query attention with 64 query and 8 key/value heads, vocabulary 128,256, sequence 8192,
micro-batch 1, bfloat16 parameters, gradients and Adam state: transformers' LlamaForCausalLM from a
config, on the meta device) captured as one rank at TP 1, 2, 4 and 8 (sequence parallelism from TP 2 on,
its declared plan applied by torch's parallelize_module under a fake process group), all four in one
call as ``capture --tp 1,2,4,8 --sp`` makes it (``capture_degrees``: one model, one variant per degree)
and written as one compact file, in a fresh interpreter: wall and CPU time per degree and in all (the
CPU seconds say what the machine's other jobs do not), the file's writing and size, and the peak RSS.
Then the per-rank table of PP 8 x TP 8 x DP 8 with ZeRO 1 (the TP 8 rank's profile, 1F1B, 16
micro-batches, h100-80gb): each pipeline rank's peak. Targets on 2 cores: the four captures under 60 s
and 2 GB.

Run from the repository root:  python benchmarks/bench_tensor_parallel.py [--tiny]
(``--tiny``: 8 layers, hidden 128, 8 heads, sequence 64, in seconds; not the benchmark's figures.)
"""

from __future__ import annotations

import json
import sys
import time

from _common import TINY_FLAG, peak_rss_mb, run_measurement, tiny_mode

TINY = tiny_mode()
SHAPE = (dict(layers=8, hidden=128, ffn=256, heads=8, kv_heads=8, vocab=256, seq=64) if TINY else
         dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256, seq=8192))
DEGREES = (1, 2, 4, 8)


def llama(layers, hidden, ffn, heads, kv_heads, vocab, seq):
    """The shape as transformers' Llama (its declared tensor-parallel plan included), on the meta device."""
    import torch
    import transformers
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=vocab,
                                      max_position_embeddings=seq, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        ids = torch.zeros(1, seq, dtype=torch.long)
    return model, {"input_ids": ids, "labels": ids}


def measure() -> None:
    import tempfile
    from pathlib import Path

    from stagesplit import api
    from stagesplit.capturing import pytorch
    from stagesplit.io import save_profile
    from stagesplit.model.datasharding import role_bytes
    times: list[tuple[float, float]] = []
    capture_one = pytorch.capture_model

    def timed(*args, **kwargs):                      # each degree's capture, as capture_degrees makes it
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return capture_one(*args, **kwargs)
        finally:
            times.append((time.perf_counter() - t0, time.process_time() - c0))
    pytorch.capture_model = timed
    start, cpu = time.perf_counter(), time.process_time()
    model, inputs = llama(**SHAPE)
    variants = pytorch.capture_degrees(model, inputs, degrees=DEGREES, sequence_parallel=True, dtype="bfloat16",
                                       optimizer="adam", target="h100-80gb", name="llama-3-70b")
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    rss = peak_rss_mb()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "llama-3-70b.stagesplit"
        t0 = time.perf_counter()
        save_profile(variants, path)
        written, size = time.perf_counter() - t0, path.stat().st_size
    rows = []
    for degree, profile, (seconds, cpu_s) in zip(variants.degrees, variants.profiles, times):
        roles = role_bytes(profile)
        layout = profile.info.parallel_layout
        rows.append({"tp": degree, "seconds": seconds, "cpu": cpu_s, "operations": len(profile.operations),
                     "held": roles["param"] + roles["grad"] + roles["state"],
                     "collectives": len(layout.collectives) if layout is not None else 0})
    plan = api.solve(variants.of(8), 8, dp=8, zero=1, schedule="1f1b", micro_batches=16, time_limit=60)
    ranks = [int(r.peak_bytes) for r in plan.schedule.ranks] if plan.schedule is not None else []
    print(json.dumps({"rows": rows, "total": total, "total_cpu": total_cpu, "rss": rss, "written": written,
                      "size": size, "ranks": ranks, "fits": bool(plan.feasible), "split": plan.split_text}))


def main() -> int:
    if "--measure" in sys.argv:
        measure()
        return 0
    result = run_measurement(__file__, *([TINY_FLAG] if TINY else []))
    print("Tensor-parallel capture: one rank per degree (" + ("tiny shape" if TINY else "Llama-3-70B shape") + ")")
    print(f"{'TP':>3}  {'seconds':>8}  {'CPU s':>6}  {'operations':>10}  {'parameters+gradients+Adam per rank (GiB)':>40}  "
          f"{'collectives':>11}")
    for r in result["rows"]:
        print(f"{r['tp']:>3}  {r['seconds']:>8.1f}  {r['cpu']:>6.1f}  {r['operations']:>10,}  "
              f"{r['held'] / 2**30:>40.2f}  {r['collectives']:>11,}")
    print(f"all four: {result['total']:.1f} s ({result['total_cpu']:.1f} CPU s; target < 60 s), peak RSS "
          f"{result['rss']:,.0f} MB (target < 2,048 MB); written as one compact file in {result['written']:.1f} s, "
          f"{result['size'] / 2**20:,.1f} MiB")
    print()
    print("PP 8 x TP 8 x DP 8, ZeRO 1, 1F1B, 16 micro-batches, h100-80gb: each pipeline rank's peak (GiB)")
    print("split: " + result["split"])
    print("  ".join(f"rank {i}: {b / 2**30:.2f}" for i, b in enumerate(result["ranks"])))
    print("every rank fits" if result["fits"] else "not every rank fits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
