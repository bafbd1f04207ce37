"""The layout search at cluster scale (issue #32): a Llama-3-70B-shaped model (80 blocks, hidden
8192, 64 heads, 8 key-value heads, vocabulary 128,256, sequence 8192, one sequence per capture,
bfloat16 parameters with float32 gradients and master weights as Megatron's --bf16 keeps them, Adam,
attention as the H100's flash kernel; its ranks at tensor-parallel degrees 1, 2, 4 and 8) laid out on 64 and on 512 h100-80gb (8 per node) for global batches of 512 and 1,024 sequences,
and the Llama-3.1-405B shape (126 blocks, hidden 16,384, 128 query and 8 key-value heads, FFN
53,248, the same vocabulary and sequence; its ranks at degrees 1 and 8) on 1,024 and 16,384 for
global batches of 512 and 2,048, each captured once under fake tensors, under the search's default
schedules (1F1B and interleaved 1F1B): every combination of a captured tensor-parallel degree,
pipeline stages, data-parallel ranks, ZeRO stage, micro-batch size (the capture scaled to each size),
schedule and chunks; the 405B's largest searches again under 1F1B alone, and Meta's layout fixed. Printed per search: the best layout, its
step, tokens/s per GPU and MFU, its fullest rank, what was proven, how many combinations were
solved, cut off by a lower bound, refuted by the engine's cutoff or did not fit, the wall and CPU
time and the peak memory (target: under 60 s and 1 GB on 2 cores each; each search runs in a fresh
interpreter, so its peak is its own).

The 70B is the shipped layout sample, ``profiles/llama3-70b.stagesplit`` (docs/layouts.md), its four
degrees in one file. Run: ``python benchmarks/bench_layouts.py`` (the 405B's captures take minutes the
first time and are cached in the temp folder; ``--tiny``: Llamas 4 and 6 blocks deep and 64 wide,
sequence 32, on 8 to 32 GPUs, in seconds).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import own_peak_rss_mb, run_measurement, tiny_mode  # noqa: E402
from bench_schedules import _cached_capture  # noqa: E402

#: how these models train at scale (Megatron's --bf16 with its distributed optimizer, torchtitan's FSDP2
#: mixed precision): bfloat16 parameters, float32 gradients and master weights, Adam; attention as the
#: H100's flash kernel keeps it
PRECISION = dict(optimizer="adam", dtype="bfloat16", master_weights=True, target="h100-80gb", kernels="cuda")


def llama3_70b_tp(tiny: bool, tp: int) -> Path:
    """The tiny stand-in's rank at tensor-parallel degree ``tp`` (with sequence parallelism, under
    torch's fake process group): 4 blocks 64 wide with 8 heads, sequence 32. (The 70B's own ranks
    are in its sample's one file.)"""
    assert tiny
    return _cached_capture(f"layouts-tiny-4h8-tp{tp}-lp", _llama_405b_like(4, 64, 128, 8, 32, 256, tp,
                                                                      f"llama-4-blocks-tp{tp}"))


def llama3_70b(tiny: bool) -> Path:
    """The shipped sample (its ranks at degrees 1, 2, 4 and 8 in one file); ``tiny``: the stand-in's rank
    at degree 1 (8 heads and 8 key-value heads, as its tensor-parallel ranks: ``llama3_70b_tp``)."""
    if tiny:
        return _cached_capture("layouts-tiny-4h8", _llama_405b_like(4, 64, 128, 8, 32, 256, 1, "llama-4-blocks"))
    return ROOT / "profiles" / "llama3-70b.stagesplit"


def _llama_405b_like(blocks, hidden, ffn, heads, seq, vocab, tp, name):
    """A builder of the 405B shape's capture (or its tiny stand-in) at tensor-parallel degree ``tp``
    (with sequence parallelism above 1, under torch's fake process group)."""
    def run():
        import torch
        import transformers as tf

        from stagesplit.capturing.pytorch import capture_model
        cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=blocks,
                             num_attention_heads=heads, num_key_value_heads=8, max_position_embeddings=seq)
        with torch.device("meta"):
            model = tf.LlamaForCausalLM(cfg)
        ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
        # the loss on logits split over the vocabulary above 1, as torchtitan and Megatron run it (the
        # shipped 70B sample's --loss-parallel)
        extra = dict(tp=tp, sequence_parallel=True, loss_parallel=True) if tp > 1 else {}
        return capture_model(model, {"input_ids": ids, "labels": ids}, **PRECISION, name=name, **extra)
    return run


def llama31_405b(tiny: bool, tp: int = 1) -> Path:
    """The Llama-3.1-405B shape (126 blocks, hidden 16,384, 128 query and 8 key-value heads, FFN
    53,248, vocabulary 128,256, sequence 8192), one rank at tensor-parallel degree ``tp`` (8:
    torchtitan's and NeMo's degree for it), captured under fake tensors as the 70B is; ``tiny``: 6
    blocks 64 wide with 8 heads, sequence 32."""
    suffix = f"-tp{tp}" if tp > 1 else ""
    if tiny:
        return _cached_capture(f"layouts-tiny-6h8{suffix}{'-lp' if tp > 1 else ''}", _llama_405b_like(6, 64, 128, 8, 32, 256, tp,
                                                                            f"llama-6-blocks{suffix}"))
    return _cached_capture(f"llama31-405b-seq8192{suffix}{'-lp' if tp > 1 else ''}", _llama_405b_like(126, 16384, 53248, 128, 8192, 128256, tp,
                                                                            f"llama-3.1-405b-shape{suffix}"))


def _fullest(lp) -> str:
    """The fullest rank of the best layout: its peak over the device."""
    b = lp.best
    if b is None or not b.rank_peaks:
        return "-"
    r = max(range(len(b.rank_peaks)), key=lambda k: b.rank_peaks[k])
    return f"rank {r}: {b.rank_peaks[r] / 2**30:.1f}/{b.capacity / 2**30:.0f} GiB"


def _proven(lp) -> str:
    """What the search proved: every row settled, or how many the time limit left open."""
    if lp.proven:
        return "proven"
    unknown = sum(1 for r in lp.rows if r.status == "unknown")
    open_ = sum(1 for r in lp.rows if r.status != "unknown" and not r.proven)
    return f"open: {unknown} unsearched, {open_} unproven"


def main() -> int:
    tiny = tiny_mode()
    seq = 32 if tiny else 8192
    # (model, profile, the other degrees' profiles, GPU counts, global batches)
    cases = [("Llama-3-70B", llama3_70b(tiny), {2: llama3_70b_tp(tiny, 2)} if tiny else {},
              (8, 16) if tiny else (64, 512), (64,) if tiny else (512, 1024)),
             ("Llama-3.1-405B", llama31_405b(tiny), {8: llama31_405b(tiny, 8)}, (16, 32) if tiny else (1024, 16384),
              (64,) if tiny else (512, 2048))]
    # the 405B's largest searches again under 1F1B alone, and Meta's published layout for it at 16,384 GPUs (the Llama 3 paper, table 4: TP 8, PP 16, DP 128, 16 sequences per data-parallel
    # rank; interleaved, whose virtual stages the paper does not give: 4 here, 8 blocks per device in 2s)
    alone = dict(schedule="1f1b")
    meta = dict(tp=8, pp=16, dp=128, zero=1, micro_batch_size=1, schedule="interleaved-1f1b", chunks_per_rank=4)
    extra = {("Llama-3.1-405B", 1024 if not tiny else 16, 2048 if not tiny else 64): (alone,),
             ("Llama-3.1-405B", 16384 if not tiny else 32, 2048 if not tiny else 64): (alone, meta)}
    print(f"{'model':<29} {'GPUs':>6} {'batch':>5}  {'best layout':<56}  {'step':>9}  {'tok/s/GPU':>9}  {'MFU':>6}  "
          f"{'fullest rank':<24}  {'proof':<28}  {'rows':<44}  {'wall':>6}  {'CPU':>6}  {'RSS MB':>7}")
    for model, path, tp_profiles, clusters, batches in cases:
        for gpus in clusters:
            for batch in batches:
                for options in ({},) + extra.get((model, gpus, batch), ()):
                    if options.get("pp") and tiny:          # (the tiny 405B: 6 blocks on 32 GPUs)
                        options = dict(options, pp=2, dp=2, chunks_per_rank=2)
                    spec = dict(model=model, path=str(path), tp_profiles={t: str(f) for t, f in tp_profiles.items()},
                                gpus=gpus, batch=batch, seq=seq, tiny=tiny, options=options)
                    # each search in a fresh interpreter: its peak memory is its own, not the searches' before it
                    print(run_measurement(__file__, json.dumps(spec))["line"], flush=True)
    return 0


def _search(spec: dict) -> str:
    """One search's line of the table (``options``: 1F1B alone, or fixed degrees, beyond the default search)."""
    from stagesplit import api
    from stagesplit.plan.layouts import seconds
    options = spec["options"]
    start, cpu = time.perf_counter(), time.process_time()
    lp = api.layouts(spec["path"], gpus=spec["gpus"], global_batch=spec["batch"], target="h100-80gb",
                     sequence_length=spec["seq"], tp_profiles={int(t): f for t, f in spec["tp_profiles"].items()},
                     time_limit=10 if spec["tiny"] else 60, **options)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    counts = Counter(r.status for r in lp.rows)
    b = lp.best
    best = b.layout.describe() if b else "none fits"
    step = seconds(b.step_s) if b and b.step_s else "-"
    tok = f"{lp.tokens_per_s_per_gpu:,.0f}" if lp.tokens_per_s_per_gpu else "-"
    mfu = f"{lp.mfu:.1%}" if lp.mfu is not None else "-"
    rows = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    name = spec["model"] + (" (Meta's)" if options.get("pp") else " (1F1B alone)" if options else "")
    return (f"{name:<29} {spec['gpus']:>6} {spec['batch']:>5}  {best:<56}  {step:>9}  {tok:>9}  {mfu:>6}  "
            f"{_fullest(lp):<24}  {_proven(lp):<28}  {rows:<44}  {wall:5.1f}s  {cpu:5.1f}s  {own_peak_rss_mb():7.0f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps({"line": _search(json.loads(sys.argv[2]))}))
        sys.exit(0)
    sys.exit(main())
