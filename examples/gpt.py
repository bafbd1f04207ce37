"""A small GPT-2-style language model, the example used by the README's PyTorch walk-through.

``build()`` is a stagesplit model factory: it takes no arguments and returns ``(model, inputs)``.
It builds the model on the ``meta`` device, so no weight memory is allocated and a model of any
size can be captured on a laptop CPU::

    stagesplit capture examples/gpt.py:build -o gpt.stagesplit
    stagesplit solve gpt.stagesplit --devices 4 --schedule 1f1b --target a100-80gb

Module names follow Hugging Face's GPT-2 (``transformer.h.3.mlp.c_fc``), so stagesplit's default
layer regex finds the blocks, and ``lm_head`` shares its weight with ``transformer.wte`` (tied
embeddings). Attention is written out (no fused kernel) so that real and captured runs allocate
the same tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 8192
    context: int = 256
    d_model: int = 256
    heads: int = 4
    layers: int = 8
    batch: int = 4
    tie_embeddings: bool = True


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        mask = torch.ones(cfg.context, cfg.context, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        scores = scores.masked_fill(~self.causal_mask[:t, :t], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.context, cfg.d_model)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = cfg
        self.transformer = Transformer(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.transformer(idx))


def make_inputs(cfg: GPTConfig, device: str | torch.device = "cpu") -> torch.Tensor:
    """A batch of token ids (all zeros: the values do not change memory or FLOPs)."""
    return torch.zeros(cfg.batch, cfg.context, dtype=torch.long, device=device)


def build(cfg: GPTConfig = GPTConfig()):
    """The stagesplit factory: the model and its inputs on the ``meta`` device (no memory used)."""
    with torch.device("meta"):
        model = GPT(cfg)
    return model, make_inputs(cfg, "meta")


def build_real(cfg: GPTConfig = GPTConfig()):
    """The same model with real CPU weights, for measurements that run the step for real."""
    torch.manual_seed(0)
    return GPT(cfg), make_inputs(cfg)


class PipelineStage:
    """Layers ``first..last`` of a real GPT run as one pipeline stage alone, for measurements:
    the first stage embeds token ids, the last applies the head and sums the logits, a middle
    stage takes (and sends back the gradient of) a hidden-state tensor. The first and the last
    stage each hold the tied embedding, as pipelines replicate it."""

    def __init__(self, model: GPT, first: int, last: int, device: str | torch.device = "cpu"):
        self.model, self.cfg, self.device = model, model.config, device
        self.blocks = list(model.transformer.h[first:last + 1])
        self.is_first, self.is_last = first == 0, last == self.cfg.layers - 1
        t = model.transformer
        self.modules = self.blocks + ([t.wte, t.wpe] if self.is_first else []) + \
            ([t.ln_f, model.lm_head] if self.is_last else [])
        self.params = list({id(p): p for m in self.modules for p in m.parameters()}.values())
        self.buffers = list({id(b): b for m in self.modules for b in m.buffers()}.values())

    def make_input(self) -> torch.Tensor:
        cfg = self.cfg
        if self.is_first:
            return torch.zeros(cfg.batch, cfg.context, dtype=torch.long, device=self.device)
        return torch.randn(cfg.batch, cfg.context, cfg.d_model, device=self.device, requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        if self.is_first:
            x = t.wte(x) + t.wpe(torch.arange(self.cfg.context, device=self.device))
        for block in self.blocks:
            x = block(x)
        return self.model.lm_head(t.ln_f(x)).sum() if self.is_last else x

    def backward(self, out: torch.Tensor) -> None:
        out.backward() if self.is_last else out.backward(torch.ones_like(out))
