"""Capture benchmark (issues 7 and 20): record one training step of a LLaMA-style decoder on CPU
under fake tensors, then solve it, each shape in a fresh interpreter (so its time and peak RSS
are its own; the import of torch is measured apart).

* ``7b``: LLaMA-2-7B-shaped (32 layers, d 4096, FFN 11008, 32 heads, vocab 32000, sequence 4096,
  micro-batch 1, bfloat16 autocast with float32 parameters and Adam state), solved for
  8 x a100-80gb with 1F1B and 16 micro-batches. Targets on a 2-core machine: capture under
  120 s and 4 GB peak RSS.
* ``70b``: the 80-layer 70B shape (d 8192, FFN 28672, grouped-query attention with 64 query and
  8 key/value heads, vocab 32000, sequence 4096, micro-batch 1, bfloat16 parameters, gradients
  and Adam state), and the fewest 80 GB GPUs (a100-80gb) that hold it with 1F1B (stagesplit's
  ``devices`` objective: the first stage holds as many micro-batches as there are stages).

Run from the repository root:  python benchmarks/bench_capture.py [7b|70b ...] [--tiny]   (default: both)
(``--tiny``: the same two shapes a few layers deep and 64 wide, in seconds; not the benchmark's figures.)
"""

from __future__ import annotations

import json
import sys
import time

from _common import TINY_FLAG, peak_rss_mb, print_table, run_measurement, tiny_mode

SHAPES = {
    "7b": dict(layers=32, d=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000, seq=4096, batch=1),
    "70b": dict(layers=80, d=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000, seq=4096, batch=1),
}
#: ``--tiny`` (passed on to the measurement's child): the same shapes, small
TINY = tiny_mode()
if TINY:
    SHAPES = {"7b": dict(layers=8, d=64, ffn=128, heads=4, kv_heads=4, vocab=256, seq=32, batch=1),
              "70b": dict(layers=4, d=64, ffn=128, heads=4, kv_heads=2, vocab=256, seq=32, batch=1)}


def llama_factory(layers=32, d=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000, seq=4096, batch=1):
    """A LLaMA-style decoder with Hugging Face module names, built on the meta device. Keys and
    values have ``kv_heads`` heads, repeated to the query heads before the fused attention (as
    transformers' ``repeat_kv`` does)."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    head_dim = d // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            var = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(var + 1e-5)).to(x.dtype) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(d, heads * head_dim, bias=False)
            self.k_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(heads * head_dim, d, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, heads, head_dim).transpose(1, 2)
            k, v = (p(x).view(b, t, kv_heads, head_dim).transpose(1, 2) for p in (self.k_proj, self.v_proj))
            if kv_heads != heads:
                k, v = (z[:, :, None].expand(b, kv_heads, heads // kv_heads, t, head_dim)
                        .reshape(b, heads, t, head_dim) for z in (k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, heads * head_dim))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(d, ffn, bias=False)
            self.up_proj = nn.Linear(d, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, d, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.self_attn = RMSNorm(), Attention()
            self.post_attention_layernorm, self.mlp = RMSNorm(), MLP()

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.norm = RMSNorm()

        def forward(self, ids):
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Decoder()
            self.lm_head = nn.Linear(d, vocab, bias=False)

        def forward(self, input_ids, labels):
            logits = self.lm_head(self.model(input_ids)).float()
            return F.cross_entropy(logits.view(-1, vocab), labels.view(-1))

    with torch.device("meta"):
        model = LlamaForCausalLM()
        ids = torch.zeros(batch, seq, dtype=torch.long)
    return model, {"input_ids": ids, "labels": ids.clone()}


def measure(shape: str) -> None:
    import resource
    t0 = time.perf_counter()
    import torch  # noqa: F401  (the import is part of what a user waits for)

    from stagesplit.capturing.pytorch import capture_model
    t1 = time.perf_counter()
    import_rss = peak_rss_mb()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    model, inputs = llama_factory(**SHAPES[shape])
    if shape == "7b":
        profile = capture_model(model, inputs, dtype="bfloat16", amp=True, optimizer="adam", target="a100-80gb",
                                name="llama-2-7b-shaped")
    else:
        profile = capture_model(model, inputs, dtype="bfloat16", optimizer="adam", target="a100-80gb",
                                name="llama-70b-shaped")
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    t2 = time.perf_counter()
    capture_rss = peak_rss_mb()
    from stagesplit.api import solve
    from stagesplit.model.analysis import Analysis
    analysis = Analysis.of(profile)
    if shape == "7b":
        plan = solve(analysis, 8, schedule="1f1b", micro_batches=16)
    else:
        plan = solve(analysis, analysis.model.num_layers, objective="devices", schedule="1f1b")
    t3 = time.perf_counter()
    v = profile.variables
    print(json.dumps({
        "shape": shape, "import_s": t1 - t0, "import_rss_mb": import_rss, "capture_s": t2 - t1,
        "capture_cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        "solve_s": t3 - t2, "capture_rss_mb": capture_rss, "rss_mb": peak_rss_mb(), "ops": len(profile.operations),
        "storages": len(v), "always_gib": float(v.bytes[v.always_live].sum()) / 2**30,
        "layers": analysis.model.num_layers, "flops": float(profile.operations.compute.sum()),
        "status": plan.status, "devices": len(plan.stages), "split": plan.short_split_text(200),
        "stages": [[s.stage, f"{s.layers[0]}..{s.layers[-1]}", len(s.layers), s.in_flight,
                    s.worst_tile_bytes / 2**30, s.compute, s.time_s] for s in plan.stages]}))


def report(r: dict) -> None:
    shape = SHAPES[r["shape"]]
    if r["shape"] == "7b":
        title = "stagesplit capture: LLaMA-2-7B-shaped training step on CPU (fake tensors)"
        what = f"capture ({shape['layers']} layers, seq {shape['seq']}, bf16 amp, Adam)"
        solved = ("price + solve 8 x a100-80gb, 1F1B, 16 micro-batches", f"{r['solve_s']:.1f} s", "")
    else:
        title = "stagesplit capture: 80-layer 70B-shaped training step on CPU (fake tensors)"
        what = (f"capture ({shape['layers']} layers, GQA {shape['heads']}/{shape['kv_heads']}, seq {shape['seq']}, "
                "bf16, Adam)")
        solved = ("price + solve for the fewest a100-80gb, 1F1B", f"{r['solve_s']:.1f} s", "")
    if TINY:
        title += f" (--tiny: {shape['layers']} layers, d {shape['d']})"
    rows = [
        ("import torch + stagesplit.capturing.pytorch", f"{r['import_s']:.1f} s", ""),
        ("peak RSS after the import", f"{r['import_rss_mb'] / 1024:.2f} GB", ""),
        (what, f"{r['capture_s']:.1f} s ({r['capture_cpu_s']:.1f} CPU-s)", "< 120 s"),
        ("peak RSS after capture", f"{r['capture_rss_mb'] / 1024:.2f} GB", "< 4 GB"),
        ("operations (program steps) / storages", f"{r['ops']:,} / {r['storages']:,}", ""),
        ("parameters + gradients + Adam state", f"{r['always_gib']:.1f} GiB", ""),
        ("FLOPs per step", f"{r['flops']:.3g}", ""),
        ("layers found (the module tree's blocks)", f"{r['layers']}", f"{shape['layers']}"),
        solved,
        ("peak RSS, whole run", f"{r['rss_mb'] / 1024:.2f} GB", ""),
    ]
    if r["shape"] == "70b":
        rows.append(("fewest a100-80gb GPUs that hold it, 1F1B", f"{r['devices']}", ""))
    print_table(title, rows)
    print(f"split ({r['status']}): {r['split']}\n")
    title = (f"Stages ({r['devices']} x a100-80gb, 80 GiB each; 1F1B"
             + (", 16 micro-batches)" if r["shape"] == "7b" else ")"))
    print(title)
    print("=" * len(title))
    print(f"{'stage':>5}  {'layers':>7}  {'count':>5}  {'in flight':>9}  {'memory (GiB)':>12}  {'TFLOP':>8}  "
          f"{'time (ms)':>9}")
    for stage, span, count, k, gib, flops, seconds in r["stages"]:
        ms = f"{seconds * 1e3:.1f}" if seconds is not None else "-"
        print(f"{stage:>5}  {span:>7}  {count:>5}  {k:>9}  {gib:>12.2f}  {flops / 1e12:>8.1f}  {ms:>9}")
    print()


def main() -> None:
    if "--measure" in sys.argv:
        measure(sys.argv[sys.argv.index("--measure") + 1])
        return
    shapes = [a for a in sys.argv[1:] if a in SHAPES] or list(SHAPES)
    for shape in shapes:
        report(run_measurement(__file__, shape, *([TINY_FLAG] if TINY else [])))


if __name__ == "__main__":
    main()
