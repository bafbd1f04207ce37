"""Hugging Face decoder language models of several families, built from configs (nothing is
downloaded): 8 small blocks, float32, SDPA attention (GPT-Neo: its own, the only one it has), no dropout, untied embeddings unless a
family ties them by default (GPT-2), labels = the input ids (the documented recipe). For the
tests that run the torch-pipelining export of a plan for each: ``factory(name)`` is a
``stagesplit capture`` factory (on the meta device), ``model(name)`` the same model with real
weights, ``batch(name, micro_batches)`` a whole batch (ids, labels)."""

from __future__ import annotations

import functools

__all__ = ["BATCH", "DECODER_VARIANTS", "FAMILIES", "MOE_FAMILIES", "SEQUENCE", "TABLE_FAMILIES", "batch", "capture_spec",
           "model"]

#: sequences per micro-batch and tokens per sequence
BATCH, SEQUENCE = 2, 32
VOCAB = 256
_COMMON = dict(vocab_size=VOCAB, use_cache=False, bos_token_id=1, eos_token_id=2)
_SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, max_position_embeddings=64,
              num_hidden_layers=8)


def _configs():
    import transformers as tf
    return {
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(n_embd=64, n_layer=8, n_head=4, n_positions=64, resid_pdrop=0.0,
                                                   embd_pdrop=0.0, attn_pdrop=0.0, **_COMMON)),
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **_SMALL,
                                                      **_COMMON)),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=False, **_SMALL,
                                                     **_COMMON)),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig(num_key_value_heads=2, sliding_window=None,
                                                            tie_word_embeddings=False, **_SMALL, **_COMMON)),
        "gpt_neox": (tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(tie_word_embeddings=False, hidden_dropout=0.0,
                                                             attention_dropout=0.0, **_SMALL, **_COMMON)),
        "opt": (tf.OPTForCausalLM, tf.OPTConfig(hidden_size=64, ffn_dim=128, num_attention_heads=4, num_hidden_layers=8,
                                                max_position_embeddings=64, word_embed_proj_dim=64, dropout=0.0,
                                                attention_dropout=0.0, tie_word_embeddings=False, **_COMMON)),
        "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config(num_key_value_heads=2, pad_token_id=0, resid_pdrop=0.0,
                                                   embd_pdrop=0.0, attention_dropout=0.0, tie_word_embeddings=False,
                                                   **_SMALL, **_COMMON)),
        "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                                                     **_SMALL, **_COMMON)),
        "gemma": (tf.GemmaForCausalLM, tf.GemmaConfig(num_key_value_heads=2, head_dim=16, **_SMALL, **_COMMON)),
        "mixtral": (tf.MixtralForCausalLM, tf.MixtralConfig(num_key_value_heads=2, num_local_experts=4,
                                                            num_experts_per_tok=2, tie_word_embeddings=False,
                                                            **_SMALL, **_COMMON)),
        # blocks that return tuples, which the decoder reads ``outputs[0]`` of
        "falcon": (tf.FalconForCausalLM, tf.FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=8,
                                                         new_decoder_architecture=True, num_kv_heads=2,
                                                         hidden_dropout=0.0, attention_dropout=0.0,
                                                         tie_word_embeddings=False, **_COMMON)),
        "gpt_neo": (tf.GPTNeoForCausalLM, tf.GPTNeoConfig(hidden_size=64, num_layers=8, num_heads=4,
                                                          attention_types=[[["global", "local"], 4]],
                                                          max_position_embeddings=64, resid_dropout=0.0,
                                                          embed_dropout=0.0, attention_dropout=0.0, **_COMMON)),
        # layers of two types, each given its own mask or rotary tables by the decoder, by position: Gemma 3's
        # local and global rotary bases (every sixth layer global), and Qwen2's sliding window of 8 tokens
        # from layer 4 on (on sequences of 32)
        "gemma3": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, **_SMALL, **_COMMON)),
        "qwen2_sliding": (tf.Qwen2ForCausalLM, tf.Qwen2Config(num_key_value_heads=2, use_sliding_window=True,
                                                              sliding_window=8, max_window_layers=4,
                                                              tie_word_embeddings=False, **_SMALL, **_COMMON)),
        "qwen2_moe": (tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig(num_key_value_heads=2, num_experts=4,
                                                               num_experts_per_tok=2, moe_intermediate_size=64,
                                                               shared_expert_intermediate_size=64,
                                                               tie_word_embeddings=False, **_SMALL, **_COMMON)),
        # BLOOM: ALiBi biases the decoder builds and hands each block (with the mask), no position embedding
        "bloom": (tf.BloomForCausalLM, tf.BloomConfig(hidden_size=64, n_layer=8, n_head=4, hidden_dropout=0.0,
                                                      attention_dropout=0.0, tie_word_embeddings=False, **_COMMON)),
        # DeepSeek-V3: latent attention (low-rank queries and keys, rotary on a slice), a dense first block
        # before mixture-of-experts blocks with a shared expert; GPT-OSS: attention sinks, sliding and full
        # attention in turn, experts with biases
        "deepseek_v3": (tf.DeepseekV3ForCausalLM, tf.DeepseekV3Config(
            num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=64, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
            q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            tie_word_embeddings=False, **_SMALL, **_COMMON)),
        "gpt_oss": (tf.GptOssForCausalLM, tf.GptOssConfig(num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                                        num_experts_per_tok=2, sliding_window=8,
                                                        layer_types=["sliding_attention", "full_attention"] * 4,
                                                        tie_word_embeddings=False, **_SMALL, **_COMMON)),
    }


#: the families the tests run (gemma ties its embeddings, as GPT-2 does)
FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "gpt_neox", "opt", "phi3", "qwen3", "gemma")
#: families whose decoders call their blocks differently: blocks that return tuples (Falcon, GPT-Neo), layers
#: whose mask or rotary tables the decoder picks by position (Gemma 3, Qwen2 with a sliding window), biases the
#: decoder makes for every block (BLOOM's ALiBi)
DECODER_VARIANTS = ("falcon", "gpt_neo", "gemma3", "qwen2_sliding", "bloom")


def model(name: str, device: str | None = None):
    """Family ``name``'s model with random weights (seeded by the caller), in training mode."""
    import torch
    cls, config = _configs()[name]
    config._attn_implementation = "sdpa" if cls._supports_sdpa else "eager"     # GPT-Neo has only its own
    # mixture of experts: torch's grouped matrix product (whose shapes do not depend on the routing, as a
    # capture under fake tensors needs) takes bfloat16 only
    dtype = torch.bfloat16 if name in MOE_FAMILIES else torch.float32
    if device == "meta":
        with torch.device("meta"):
            return cls(config).to(dtype)
    return cls(config).to(dtype).train()


def batch(name: str, micro_batches: int, seed: int = 7) -> tuple:
    """``micro_batches`` micro-batches of token ids, and the labels (the ids themselves)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH * micro_batches, SEQUENCE), generator=g)
    return ids, ids


def factory(name: str):
    """A capture factory: the model on the meta device and one micro-batch, labels = input ids."""
    import torch
    ids = torch.zeros(BATCH, SEQUENCE, dtype=torch.long, device="meta")
    return model(name, "meta"), {"input_ids": ids, "labels": ids}


#: mixture-of-experts families: which expert each token goes to depends on the weights, so a capture
#: (fake tensors) and a run route tokens differently
MOE_FAMILIES = ("mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss")
#: the families of the README's table (benchmarks/bench_exported.py's default)
TABLE_FAMILIES = FAMILIES + ("mixtral", "qwen2_moe")

for _name in FAMILIES + DECODER_VARIANTS + MOE_FAMILIES:
    globals()[_name] = functools.partial(factory, _name)


def capture_spec(name: str) -> str:
    """The ``stagesplit capture`` factory spec of family ``name``."""
    from pathlib import Path
    return f"{Path(__file__).resolve()}:{name}"
