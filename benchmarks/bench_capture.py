"""Capture benchmark (issue 7): record one training step of a LLaMA-2-7B-shaped model (32 layers,
d 4096, FFN 11008, vocab 32000, sequence 4096, micro-batch 1, bfloat16 autocast with float32
parameters and Adam state) on CPU under fake tensors, then solve it for 8 x a100-80gb with 1F1B
and 16 micro-batches. Targets on a 2-core machine: capture under 120 s and 4 GB peak RSS.

Run from the repository root:  python benchmarks/bench_capture.py
"""

from __future__ import annotations

import json
import sys
import time

from _common import peak_rss_mb, print_table, run_measurement


def llama_factory(layers=32, d=4096, ffn=11008, heads=32, vocab=32000, seq=4096, batch=1):
    """A LLaMA-2-style decoder with Hugging Face module names, built on the meta device."""
    import torch
    from torch import nn
    from torch.nn import functional as F

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
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (p(x).view(b, t, heads, d // heads).transpose(1, 2) for p in (self.q_proj, self.k_proj,
                                                                                     self.v_proj))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, d))

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


def measure() -> None:
    t0 = time.perf_counter()
    import torch  # noqa: F401  (the import is part of what a user waits for)
    from stagesplit.io.capture import capture_model
    t1 = time.perf_counter()
    model, inputs = llama_factory()
    profile = capture_model(model, inputs, dtype="bfloat16", amp=True, optimizer="adam", target="a100-80gb",
                            name="llama-2-7b-shaped")
    t2 = time.perf_counter()
    capture_rss = peak_rss_mb()
    from stagesplit.plan.advise import advise
    from stagesplit.model.analysis import Analysis
    from stagesplit.solver.problem import SolveOptions
    analysis = Analysis.of(profile)
    plan = advise(analysis.model, SolveOptions(devices=8, schedule="1f1b", micro_batches=16)).plan
    t3 = time.perf_counter()
    v = profile.variables
    print(json.dumps({
        "import_s": t1 - t0, "capture_s": t2 - t1, "solve_s": t3 - t2, "capture_rss_mb": capture_rss,
        "rss_mb": peak_rss_mb(), "ops": len(profile.operations), "storages": len(v),
        "always_gib": float(v.bytes[v.always_live].sum()) / 2**30, "layers": analysis.model.num_layers,
        "flops": float(profile.operations.compute.sum()), "status": plan.status, "split": plan.short_split_text(200),
        "stages": [[s.stage, f"{s.layers[0]}..{s.layers[-1]}", len(s.layers), s.in_flight,
                    s.worst_tile_bytes / 2**30, s.compute, s.time_s] for s in plan.stages]}))


def main() -> None:
    if "--measure" in sys.argv:
        measure()
        return
    r = run_measurement(__file__)
    print_table("stagesplit capture: LLaMA-2-7B-shaped training step on CPU (fake tensors)", [
        ("import torch + stagesplit.io.capture", f"{r['import_s']:.1f} s", ""),
        ("capture (32 layers, seq 4096, bf16 amp, Adam)", f"{r['capture_s']:.1f} s", "< 120 s"),
        ("peak RSS after capture", f"{r['capture_rss_mb'] / 1024:.2f} GB", "< 4 GB"),
        ("operations (program steps) / storages", f"{r['ops']:,} / {r['storages']:,}", ""),
        ("parameters + gradients + Adam state", f"{r['always_gib']:.1f} GiB", ""),
        ("FLOPs per step (flop_counter)", f"{r['flops']:.3g}", ""),
        ("layers found by the default regex", f"{r['layers']}", "32"),
        ("price + solve 8 x a100-80gb, 1F1B, 16 micro-batches", f"{r['solve_s']:.1f} s", ""),
        ("peak RSS, whole run", f"{r['rss_mb'] / 1024:.2f} GB", ""),
    ])
    print(f"split ({r['status']}): {r['split']}\n")
    title = "Stages (8 x a100-80gb, 80 GiB each; 1F1B, 16 micro-batches)"
    print(title)
    print("=" * len(title))
    print(f"{'stage':>5}  {'layers':>7}  {'count':>5}  {'in flight':>9}  {'memory (GiB)':>12}  {'TFLOP':>8}  "
          f"{'time (ms)':>9}")
    for stage, span, count, k, gib, flops, seconds in r["stages"]:
        ms = f"{seconds * 1e3:.1f}" if seconds is not None else "-"
        print(f"{stage:>5}  {span:>7}  {count:>5}  {k:>9}  {gib:>12.2f}  {flops / 1e12:>8.1f}  {ms:>9}")


if __name__ == "__main__":
    main()
