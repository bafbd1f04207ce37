"""Real model definitions, built from configs with random weights (nothing is downloaded), as
``stagesplit capture`` factories: Hugging Face transformers' GPT-2, Llama (grouped-query
attention), BERT, T5, BART, ViT, Mixtral, Qwen2-MoE and ResNet-50, and ResNet-50 from torchvision
and timm.

Every factory takes no arguments and builds a small configuration on the ``meta`` device, so
``stagesplit capture examples/real_models.py:t5 -o t5.stagesplit`` runs in seconds on a laptop.
``build(name, size="small"|"full", real=False)`` gives the same model at its published size
(``full``: GPT-2 small, Llama-2-7B-shaped, BERT-base, T5-small, BART-base, ViT-B/16,
ResNet-50 at 224 x 224, Mixtral-8x7B- and Qwen1.5-MoE-A2.7B-shaped) or with real CPU tensors
(``real=True``: the test suite runs one real training step of each small configuration to
measure its memory).

The mixtures of experts run in bfloat16 (capture them with ``--dtype bfloat16``): transformers'
default grouped expert kernel (``torch._grouped_mm``) has a fake kernel for bfloat16 only.
Needs ``pip install transformers`` (and torchvision or timm for the ResNets).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

SIZES = ("small", "full")
#: the factories that need bfloat16 (``--dtype bfloat16``)
BFLOAT16 = ("mixtral", "qwen2_moe")


def _lm_inputs(batch: int, seq: int, vocab: int, real: bool) -> dict[str, torch.Tensor]:
    """Token ids, passed again as the labels (one tensor: capture counts it once)."""
    ids = torch.randint(0, vocab, (batch, seq)) if real else torch.zeros(batch, seq, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}


def _make(model_cls, config, real: bool, dtype: torch.dtype | None = None):
    if real:
        torch.manual_seed(0)
        model = model_cls(config)
        return model.to(dtype) if dtype is not None else model
    with torch.device("meta"):
        return model_cls(config)


def _gpt2(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.GPT2Config(vocab_size=256 if small else 50257, n_positions=64 if small else 1024,
                        n_embd=64 if small else 768, n_layer=4 if small else 12, n_head=4 if small else 12)
    return _make(tf.GPT2LMHeadModel, cfg, real), _lm_inputs(2, 32 if small else 1024, cfg.vocab_size, real)


def _llama(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.LlamaConfig(vocab_size=256 if small else 32000, hidden_size=64 if small else 4096,
                         intermediate_size=128 if small else 11008, num_hidden_layers=4 if small else 32,
                         num_attention_heads=4 if small else 32, num_key_value_heads=2 if small else 8,
                         max_position_embeddings=64 if small else 4096)
    return _make(tf.LlamaForCausalLM, cfg, real), _lm_inputs(2 if small else 1, 32 if small else 4096,
                                                             cfg.vocab_size, real)


def _bert(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.BertConfig(vocab_size=256 if small else 30522, hidden_size=64 if small else 768,
                        num_hidden_layers=4 if small else 12, num_attention_heads=4 if small else 12,
                        intermediate_size=128 if small else 3072, max_position_embeddings=64 if small else 512)
    return _make(tf.BertForMaskedLM, cfg, real), _lm_inputs(2, 32 if small else 512, cfg.vocab_size, real)


def _t5(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.T5Config(vocab_size=256 if small else 32128, d_model=64 if small else 512, d_kv=16 if small else 64,
                      d_ff=128 if small else 2048, num_layers=4 if small else 6, num_decoder_layers=4 if small else 6,
                      num_heads=4 if small else 8, decoder_start_token_id=0, pad_token_id=0)
    return _make(tf.T5ForConditionalGeneration, cfg, real), _lm_inputs(2, 32 if small else 512, cfg.vocab_size, real)


def _bart(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.BartConfig(vocab_size=256 if small else 50265, d_model=64 if small else 768,
                        encoder_layers=3 if small else 6, decoder_layers=3 if small else 6,
                        encoder_attention_heads=4 if small else 12, decoder_attention_heads=4 if small else 12,
                        encoder_ffn_dim=128 if small else 3072, decoder_ffn_dim=128 if small else 3072,
                        max_position_embeddings=64 if small else 1024)
    return _make(tf.BartForConditionalGeneration, cfg, real), _lm_inputs(2, 32 if small else 1024, cfg.vocab_size,
                                                                         real)


def _vit(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.ViTConfig(image_size=32 if small else 224, patch_size=8 if small else 16, hidden_size=64 if small else 768,
                       num_hidden_layers=4 if small else 12, num_attention_heads=4 if small else 12,
                       intermediate_size=128 if small else 3072, num_labels=10 if small else 1000)
    side = cfg.image_size
    pixels = torch.randn(2, 3, side, side) if real else torch.zeros(2, 3, side, side)
    labels = torch.randint(0, cfg.num_labels, (2,)) if real else torch.zeros(2, dtype=torch.long)
    return _make(tf.ViTForImageClassification, cfg, real), {"pixel_values": pixels, "labels": labels}


def _mixtral(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.MixtralConfig(vocab_size=256 if small else 32000, hidden_size=64 if small else 4096,
                           intermediate_size=128 if small else 14336, num_hidden_layers=4 if small else 32,
                           num_attention_heads=4 if small else 32, num_key_value_heads=2 if small else 8,
                           num_local_experts=4 if small else 8, num_experts_per_tok=2,
                           max_position_embeddings=64 if small else 4096)
    return (_make(tf.MixtralForCausalLM, cfg, real, torch.bfloat16),
            _lm_inputs(2 if small else 1, 32 if small else 4096, cfg.vocab_size, real))


def _qwen2_moe(size: str, real: bool):
    import transformers as tf
    small = size == "small"
    cfg = tf.Qwen2MoeConfig(vocab_size=256 if small else 151936, hidden_size=64 if small else 2048,
                            intermediate_size=128 if small else 5632, num_hidden_layers=4 if small else 24,
                            num_attention_heads=4 if small else 16, num_key_value_heads=2 if small else 16,
                            moe_intermediate_size=32 if small else 1408,
                            shared_expert_intermediate_size=64 if small else 5632,
                            num_experts=4 if small else 60, num_experts_per_tok=2 if small else 4,
                            max_position_embeddings=64 if small else 4096)
    return (_make(tf.Qwen2MoeForCausalLM, cfg, real, torch.bfloat16),
            _lm_inputs(2 if small else 1, 32 if small else 4096, cfg.vocab_size, real))


def _hf_resnet50(size: str, real: bool):
    """transformers' ResNet-50 (its ResNetConfig defaults: bottleneck stages of 3, 4, 6 and 3 blocks),
    which, unlike torchvision's and timm's, installs beside a CPU-only torch."""
    import transformers as tf
    cfg = tf.ResNetConfig(num_labels=10)
    labels = torch.randint(0, 10, (2,)) if real else torch.zeros(2, dtype=torch.long)
    return _make(tf.ResNetForImageClassification, cfg, real), {"pixel_values": _images(size, real), "labels": labels}


def _images(size: str, real: bool) -> torch.Tensor:
    side = 32 if size == "small" else 224
    return torch.randn(2, 3, side, side) if real else torch.zeros(2, 3, side, side)


def torchvision_models():
    """``torchvision.models``. PyPI's torchvision wheels are built for CUDA torch: beside the CPU
    torch their C++ operators do not load, and the package's ``__init__`` fails registering fake
    kernels for them ("operator torchvision::nms does not exist"). The model code uses none of
    them, so it is then imported without that ``__init__``."""
    try:
        import torchvision.models
        return torchvision.models
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("torchvision")
        if spec is None or not spec.submodule_search_locations:
            raise
        package = types.ModuleType("torchvision")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__, package.__file__ = spec, spec.origin
        sys.modules["torchvision"] = package
        import torchvision.models
        return torchvision.models


def _resnet50(size: str, real: bool):
    resnet50 = torchvision_models().resnet50
    if real:
        torch.manual_seed(0)
        return resnet50(num_classes=10), _images(size, real)
    with torch.device("meta"):
        return resnet50(num_classes=10), _images(size, real)


def _timm_resnet50(size: str, real: bool):
    torchvision_models()                      # timm imports torchvision's FrozenBatchNorm2d
    import timm
    if real:
        torch.manual_seed(0)
        return timm.create_model("resnet50", pretrained=False, num_classes=10), _images(size, real)
    with torch.device("meta"):
        return timm.create_model("resnet50", pretrained=False, num_classes=10), _images(size, real)


BUILDERS: dict[str, Callable[[str, bool], tuple[Any, Any]]] = {
    "gpt2": _gpt2, "llama": _llama, "bert": _bert, "t5": _t5, "bart": _bart, "vit": _vit, "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe, "hf_resnet50": _hf_resnet50, "resnet50": _resnet50, "timm_resnet50": _timm_resnet50,
}


def build(name: str, size: str = "small", real: bool = False):
    """``(model, inputs)`` of model ``name`` (a key of ``BUILDERS``) at ``size``, on the meta
    device or, with ``real``, with real CPU tensors."""
    if size not in SIZES:
        raise ValueError(f"size: expected one of {', '.join(SIZES)}, got {size!r}")
    return BUILDERS[name](size, real)


def llama3_70b():
    """The Llama-3-70B shape (80 blocks, hidden 8,192, 64 query and 8 key-value heads, FFN 28,672,
    vocabulary 128,256) at sequence 8192, one sequence per micro-batch, on the meta device: the model of
    the shipped layout sample, ``profiles/llama3-70b.stagesplit`` (its command: docs/layouts.md)."""
    import transformers as tf
    cfg = tf.LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192)
    return _make(tf.LlamaForCausalLM, cfg, False), _lm_inputs(1, 8192, cfg.vocab_size, False)


def gpt2():
    return build("gpt2")


def llama():
    return build("llama")


def bert():
    return build("bert")


def t5():
    return build("t5")


def bart():
    return build("bart")


def vit():
    return build("vit")


def mixtral():
    return build("mixtral")


def qwen2_moe():
    return build("qwen2_moe")


def hf_resnet50():
    return build("hf_resnet50")


def resnet50():
    return build("resnet50")


def timm_resnet50():
    return build("timm_resnet50")
