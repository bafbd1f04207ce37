"""The FLOPs of one aten operation, as a capture counts them.

``torch.utils.flop_counter``'s formulas count matrix products, convolutions and attention; this
module adds its own for the attention and grouped, batched or quantized matrix kernels torch has
none for (``FLOP_FORMULAS``), which a capture meets on CPU and accelerators alike. Every other
operation counts 0. torch is passed in, never imported here (it is an optional extra).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FLOP_FORMULAS", "flop_counter"]


def _mm(m: int, k: int, n: int) -> int:
    """A matrix product (m x k) @ (k x n): one multiply and one add per term, as torch counts."""
    return 2 * m * k * n


def _attention(q: tuple, k: tuple, v: tuple) -> int:
    """Scores q @ k^T and output scores @ v, for (batch, heads, sequence, head dim) shapes; keys
    and values may have fewer heads (grouped-query attention: they are shared, not fewer FLOPs)."""
    b, h, s_q, d = q[-4:] if len(q) >= 4 else (1, *q[-3:])
    s_k, d_v = k[-2], v[-1]
    return _mm(b * h * s_q, d, s_k) + _mm(b * h * s_q, s_k, d_v)


def _attention_backward(grad: tuple, q: tuple, k: tuple, v: tuple) -> int:
    """Fused attention's backward: the scores recomputed, then the gradients of the scores,
    values, queries and keys (five products, as torch counts its fused kernels)."""
    b, h, s_q, d = q[-4:] if len(q) >= 4 else (1, *q[-3:])
    s_k, d_v = k[-2], v[-1]
    n = b * h
    return (_mm(n * s_q, d, s_k) + _mm(n * s_q, d_v, s_k) + _mm(n * s_k, s_q, d_v) + _mm(n * s_q, s_k, d)
            + _mm(n * d, s_q, s_k))


def _shape(t) -> tuple:
    return tuple(int(x) for x in t.shape)


def _grouped_mm(a, b, *_args, **_kwargs) -> int:
    """``_grouped_mm``/``_scaled_grouped_mm``: every row of ``a`` meets its group's matrix once
    (a 2-d x 3-d product: the experts of a mixture), a batch of products (3-d x 3-d), or the
    groups split the inner or outer dimension (2-d x 2-d, 3-d x 2-d: the weight gradients).
    The offsets are data, unknown under fake tensors: every row is counted in a group."""
    sa, sb = _shape(a), _shape(b)
    if len(sa) == 2 and len(sb) == 3:
        return _mm(sa[0], sa[1], sb[2])
    if len(sa) == 3 and len(sb) == 3:
        return sa[0] * _mm(sa[1], sa[2], sb[2])
    if len(sa) == 2 and len(sb) == 2:
        return _mm(sa[0], sa[1], sb[1])
    if len(sa) == 3 and len(sb) == 2:
        return _mm(sa[1], sa[2], sb[1])
    raise ValueError(f"grouped mm of shapes {sa} and {sb}")


def _native_mha(query, key, value, embed_dim, num_head, *_args, **_kwargs) -> int:
    """nn.MultiheadAttention's fused path: q, k, v projections, attention, output projection."""
    e, h = int(embed_dim), int(num_head)
    sq, sk = _shape(query), _shape(key)
    b = sq[0] if len(sq) == 3 else 1
    l_q, l_k = sq[-2], sk[-2]
    return (_mm(b * l_q, e, e) + 2 * _mm(b * l_k, e, e) + _attention((b, h, l_q, e // h), (b, h, l_k, e // h),
                                                                     (b, h, l_k, e // h)) + _mm(b * l_q, e, e))


def _formula_table(torch) -> dict:
    """``{OpOverloadPacket: flops(*args, out_val=..., **kwargs)}`` for the attention and matrix
    kernels capture can meet that ``torch.utils.flop_counter`` leaves at 0 (CPU and accelerator
    names, forward and backward; a name this torch lacks is skipped)."""
    def attention(q, k, v, *_a, **_k):
        return _attention(_shape(q), _shape(k), _shape(v))

    def attention_backward(grad, q, k, v, *_a, **_k):
        return _attention_backward(_shape(grad), _shape(q), _shape(k), _shape(v))

    def flash_inplace(out, q, k, v, *_a, **_k):          # (out, query, key, value, ...), flash layout (b, s, h, d)
        return _attention(_bhsd(q), _bhsd(k), _bhsd(v))

    def _bhsd(t):
        s = _shape(t)
        return (s[0], s[2], s[1], s[3]) if len(s) == 4 else (1, s[1], s[0], s[2])

    def mm(a, b, *_a, **_k):
        sa, sb = _shape(a), _shape(b)
        return _mm(sa[0], sa[1], sb[-1])

    def addmm(_self, a, b, *_a, **_k):
        return mm(a, b)

    def addbmm(_self, b1, b2, *_a, **_k):
        s1, s2 = _shape(b1), _shape(b2)
        return s1[0] * _mm(s1[1], s1[2], s2[2])

    def mv(m, v, *_a, **_k):
        rows, cols = _shape(m)
        return _mm(rows, cols, 1)

    def addmv(_self, m, v, *_a, **_k):
        return mv(m, v)

    def dot(a, b, *_a, **_k):
        return _mm(1, _shape(a)[0], 1)

    def addr(_self, v1, v2, *_a, **_k):
        return _mm(_shape(v1)[0], 1, _shape(v2)[0])

    def int8pack(a, b, *_a, **_k):                         # the weight is (N, K)
        sa = _shape(a)
        return _mm(sa[0], sa[1], _shape(b)[0])

    def packed(a, _b, *_a, out_val=None, **_k):             # packed weights: N from the output
        sa = _shape(a)
        return _mm(sa[0], sa[1], _shape(out_val)[-1])

    def dyn_quant(inp, _w, _block, in_features, out_features, *_a, **_k):
        rows = 1
        for x in _shape(inp)[:-1]:
            rows *= x
        return _mm(rows, int(in_features), int(out_features))

    def foreach_mm(xs, ys, *_a, **_k):
        return sum(mm(a, b) for a, b in zip(xs, ys))

    table = {
        "_scaled_dot_product_flash_attention_for_cpu": attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward": attention_backward,
        "_scaled_dot_product_fused_attention_overrideable": attention,
        "_scaled_dot_product_fused_attention_overrideable_backward": attention_backward,
        "_scaled_dot_product_attention_math_for_mps": attention,
        "_flash_attention_forward_no_dropout_inplace": flash_inplace,
        "_native_multi_head_attention": _native_mha,
        "_grouped_mm": _grouped_mm,
        "_scaled_grouped_mm": _grouped_mm,
        "addbmm": addbmm,
        "mv": mv,
        "addmv": addmv,
        "dot": dot,
        "vdot": dot,
        "addr": addr,
        "_int_mm": mm,
        "_addmm_activation": addmm,
        "_scaled_mm_v2": mm,
        "_weight_int8pack_mm": int8pack,
        "_weight_int4pack_mm": packed,
        "_weight_int4pack_mm_for_cpu": packed,
        "_weight_int4pack_mm_with_scales_and_zeros": packed,
        "_dyn_quant_matmul_4bit": dyn_quant,
        "_foreach_mm": foreach_mm,
    }
    out = {}
    for name, formula in table.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            out[packet] = formula
    return out


#: the kernels ``_formula_table`` counts (documentation and tests)
FLOP_FORMULAS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
                 "_scaled_dot_product_fused_attention_overrideable",
                 "_scaled_dot_product_fused_attention_overrideable_backward",
                 "_scaled_dot_product_attention_math_for_mps", "_flash_attention_forward_no_dropout_inplace",
                 "_native_multi_head_attention", "_grouped_mm", "_scaled_grouped_mm", "addbmm", "mv", "addmv", "dot",
                 "vdot", "addr", "_int_mm", "_addmm_activation", "_scaled_mm_v2", "_weight_int8pack_mm",
                 "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu", "_weight_int4pack_mm_with_scales_and_zeros",
                 "_dyn_quant_matmul_4bit", "_foreach_mm")


def flop_counter(torch) -> Callable[..., float]:
    """``count(func, args, kwargs, out)``: the FLOPs of one aten call, from this module's formulas
    or torch's (0 for kernels neither knows)."""
    from torch.utils.flop_counter import flop_registry
    own = _formula_table(torch)

    def count(func, args, kwargs, out) -> float:
        packet = func._overloadpacket
        formula = own.get(packet)
        if formula is None:
            formula = flop_registry.get(packet)
        if formula is None:
            return 0.0
        try:
            return float(formula(*args, **kwargs, out_val=out))
        except Exception:
            return 0.0
    return count
