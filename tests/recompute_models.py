"""Models whose blocks recompute their activations the way torch does it, for the recompute tests
(tests/model/test_recompute_torch.py, tests/exporters/test_export_recompute_torch.py).

Two activation-heavy configurations (activations, not weights, make most of a step's memory,
so that what recompute saves is most of what is measured): the example GPT (examples/gpt.py)
and a Hugging Face Llama built from a config. Each is built with every block recomputed one of
three ways:

* ``none``: the plain model (what stagesplit captures and predicts from);
* ``full``: every block under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``;
  the Llama through Hugging Face's own switch (``activation_checkpointing_enable``, which
  transformers 5 calls what was ``gradient_checkpointing_enable``);
* ``selective``: the same with torch's selective activation checkpointing
  (``create_selective_checkpoint_contexts``), keeping the outputs of the operations
  ``model/recompute.py`` keeps (``EXPENSIVE_OPERATIONS``) and re-running the rest.

``chunks`` cuts a model into pipeline chunks (the embedding with the first, the head with the
last) for tests/pipeline_harness.py. Everything is module-level so that cases pickle.
"""

from __future__ import annotations

import functools
import warnings

__all__ = ["GPT", "LLAMA", "MODES", "batch", "capture", "chunks", "cut", "keep_expensive", "measured_step_peak", "model",
           "num_layers"]

MODES = ("none", "selective", "full")
#: the example GPT: 4 blocks, a micro-batch of 8 sequences of 64 tokens, a small vocabulary
GPT = dict(vocab_size=128, context=64, d_model=64, heads=4, layers=4, batch=8, tie_embeddings=False)
#: a Llama of 4 decoder layers (grouped-query attention), the same micro-batch
LLAMA = dict(vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, use_cache=False,
             attn_implementation="sdpa")
LLAMA_BATCH, LLAMA_CONTEXT = 8, 64


def keep_expensive(ctx, op, *args, **kwargs):
    """The selective policy: keep the outputs of the operations the cost model keeps."""
    from torch.utils.checkpoint import CheckpointPolicy

    from stagesplit.model.recompute import EXPENSIVE_OPERATIONS
    packet = getattr(op, "overloadpacket", None)
    name = f"{op.namespace}.{packet.__name__}" if packet is not None else ""
    return CheckpointPolicy.MUST_SAVE if EXPENSIVE_OPERATIONS.fullmatch(name) else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpoint_kwargs(mode: str) -> dict:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    kwargs: dict = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, keep_expensive)
    return kwargs


def _gpt_class():
    import torch
    from torch.utils.checkpoint import checkpoint

    from examples.gpt import GPT as PlainGPT

    class CheckpointedGPT(PlainGPT):
        """examples/gpt.py's GPT whose blocks run under torch.utils.checkpoint (``mode``)."""

        def __init__(self, cfg, mode: str):
            super().__init__(cfg)
            self.mode = mode

        def forward(self, idx):
            t = self.transformer
            x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in t.h:
                x = block(x) if self.mode == "none" else checkpoint(block, x, **_checkpoint_kwargs(self.mode))
            return self.lm_head(t.ln_f(x))

    return CheckpointedGPT


def model(name: str, mode: str):
    """Model ``name`` ("gpt" or "llama") with every block recomputed as ``mode`` says (seed 0)."""
    import torch
    torch.manual_seed(0)
    if name == "gpt":
        from examples.gpt import GPTConfig
        return _gpt_class()(GPTConfig(**GPT), mode)
    from transformers import LlamaConfig, LlamaForCausalLM
    llama = LlamaForCausalLM(LlamaConfig(**LLAMA))
    if mode != "none":
        # Hugging Face's own switch (transformers 5 renamed gradient_checkpointing_enable, which warns)
        enable = getattr(llama, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs=_checkpoint_kwargs(mode))
        else:
            llama.gradient_checkpointing_enable(gradient_checkpointing_kwargs=_checkpoint_kwargs(mode))
    llama.train()
    return llama


def num_layers(name: str) -> int:
    return GPT["layers"] if name == "gpt" else LLAMA["num_hidden_layers"]


def _inputs(name: str, sequences: int, device: str = "cpu"):
    """Token ids: random on CPU (fixed seed; the gradients then say something, and the memory is
    the same for any ids), zeros on the meta device (for capture)."""
    import torch
    context = GPT["context"] if name == "gpt" else LLAMA_CONTEXT
    if device == "meta":
        return torch.zeros(sequences, context, dtype=torch.long, device=device)
    vocab = GPT["vocab_size"] if name == "gpt" else LLAMA["vocab_size"]
    return torch.randint(0, vocab, (sequences, context), generator=torch.Generator().manual_seed(7))


def _micro_batch(name: str) -> int:
    return GPT["batch"] if name == "gpt" else LLAMA_BATCH


def _sum_logits(out):
    return (out.logits if hasattr(out, "logits") else out).sum()


def capture(name: str, mode: str = "none"):
    """stagesplit's capture of one micro-batch of model ``name`` (exact bytes, Adam)."""
    import torch

    from stagesplit.capturing.pytorch import capture_model
    with torch.device("meta"):
        m = model(name, mode)
    return capture_model(m, _inputs(name, _micro_batch(name), "meta"), loss_fn=_sum_logits, optimizer="adam",
                         allocator_round=1)


def measured_step_peak(name: str, mode: str) -> int:
    """torch's MemTracker on one real training step of one micro-batch on CPU tensors (Adam, after
    a warm-up step that makes its state; gradients kept, as gradient accumulation does)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    m = model(name, mode)
    ids = _inputs(name, _micro_batch(name))
    optimizer = torch.optim.Adam(m.parameters(), foreach=False)

    def step():
        _sum_logits(m(ids)).backward()
        optimizer.step()

    step()
    optimizer.zero_grad(set_to_none=False)
    tracker = MemTracker()
    tracker.track_external(m, optimizer, ids)
    with warnings.catch_warnings():
        # MemTracker's module tracker warns when a module it saw has been freed ("Module is None")
        warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
        with tracker:
            step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def sum_loss(output, target):
    """The pipelines' loss: the logits summed, as the captures' loss is."""
    return output.sum()


def batch(name: str, micro_batches: int) -> tuple:
    """A whole batch of ``micro_batches`` micro-batches (token ids) and a placeholder target."""
    import torch
    return _inputs(name, _micro_batch(name) * micro_batches), torch.zeros(_micro_batch(name) * micro_batches)


def chunks(name: str, bounds, mode: str = "none") -> list:
    """Model ``name`` cut into the chunks ``bounds[k]..bounds[k+1]-1`` (blocks), every block
    recomputed as ``mode`` says (a str, or one per layer)."""
    modes = [mode] * num_layers(name) if isinstance(mode, str) else list(mode)
    return cut(model(name, "none"), name, bounds, modes)


def cut(whole, name: str, bounds, modes=None) -> list:
    """``whole``, the example GPT (``name`` "gpt") or a Hugging Face Llama ("llama") of any
    configuration, cut into the chunks ``bounds[k]..bounds[k+1]-1`` (blocks), the embedding with
    the first and the head with the last; block i recomputed as ``modes[i]`` says (None: none)."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    layers = len(whole.transformer.h) if name == "gpt" else len(whole.model.layers)
    modes = ["none"] * layers if modes is None else list(modes)

    def run(index: int, block, *args, **kwargs):
        if modes[index] == "none":
            return block(*args, **kwargs)
        return checkpoint(block, *args, **kwargs, **_checkpoint_kwargs(modes[index]))

    if name == "gpt":
        class GptChunk(nn.Module):
            def __init__(self, first, last):
                super().__init__()
                t = whole.transformer
                self.first_index, self.is_first, self.is_last = first, first == 0, last == layers - 1
                if self.is_first:
                    self.wte, self.wpe = t.wte, t.wpe
                self.blocks = nn.ModuleList(t.h[first:last + 1])
                if self.is_last:
                    self.ln_f, self.lm_head = t.ln_f, whole.lm_head

            def forward(self, x):
                if self.is_first:
                    x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
                for k, block in enumerate(self.blocks):
                    x = run(self.first_index + k, block, x)
                return self.lm_head(self.ln_f(x)) if self.is_last else x

        return [GptChunk(a, b - 1) for a, b in zip(bounds[:-1], bounds[1:])]

    from transformers.masking_utils import create_causal_mask

    class LlamaChunk(nn.Module):
        def __init__(self, first, last):
            super().__init__()
            inner = whole.model
            self.first_index, self.is_first, self.is_last = first, first == 0, last == layers - 1
            if self.is_first:
                self.embed_tokens = inner.embed_tokens
            self.layers = nn.ModuleList(inner.layers[first:last + 1])
            self.rotary_emb = inner.rotary_emb
            if self.is_last:
                self.norm, self.lm_head = inner.norm, whole.lm_head

        def forward(self, x):
            if self.is_first:
                x = self.embed_tokens(x)
            # as LlamaModel.forward does: the same mask and rotary tables for every layer
            positions = torch.arange(x.shape[1]).unsqueeze(0)
            mask = create_causal_mask(config=whole.config, inputs_embeds=x, attention_mask=None, cache=None,
                                      position_ids=positions)
            rotary = self.rotary_emb(x, positions)
            for k, layer in enumerate(self.layers):
                x = run(self.first_index + k, layer, x, attention_mask=mask, position_embeddings=rotary,
                        position_ids=positions)
                x = x[0] if isinstance(x, tuple) else x
            return self.lm_head(self.norm(x)) if self.is_last else x

    return [LlamaChunk(a, b - 1) for a, b in zip(bounds[:-1], bounds[1:])]
