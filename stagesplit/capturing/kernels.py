"""The attention kernel a GPU would run, in a capture that runs on the CPU.

A capture runs CPU kernels under fake tensors, and where the CPU kernel keeps other tensors for
the backward than the CUDA kernel, the captured memory is the CPU's. Scaled dot-product
attention is the large case: on the CPU torch runs ``_scaled_dot_product_flash_attention_for_cpu``
or, where that kernel does not take the call, the math path that keeps an S x S matrix per head;
on a GPU it runs FlashAttention-2 (the output and a float32 log-sum-exp per query row) or the memory-efficient
kernel (the same, its log-sum-exp padded to a multiple of 32 rows, and the additive mask). With
``kernels="cuda"`` a capture intercepts ``torch.nn.functional.scaled_dot_product_attention``
(``cuda_attention``), chooses the kernel torch's CUDA dispatcher would choose on the target's
architecture (``choose_attention_kernel``), and runs that kernel's own operators through torch's
registered fake (meta) kernels on the CPU fake tensors; torch's own derivatives for those operators
(tools/autograd/derivatives.yaml) keep for the backward what they keep on a GPU, so the recorder
sees the CUDA kernel's outputs and saved tensors, and its backward operator.

The rules are those of torch's ``sdp::select_sdp_backend`` (aten/src/ATen/native/transformers/
cuda/sdp_utils.cpp) and the CUDA branch of ``scaled_dot_product_attention``
(aten/src/ATen/native/transformers/attention.cpp): flash when there is no explicit mask, q, k and v
share a head dimension of at most 256 (not in (192, 224] for training on sm86/sm89/sm120/sm121),
causal only with as many queries as keys, float16 or bfloat16, on sm80 to sm121; else the
memory-efficient kernel (sm50 to sm121, head dimensions multiples of the GEMM alignment: 8 for
half precision and 4 for float32 on sm80+, float32, float16, and on sm80+ bfloat16); else the math
path. cuDNN attention, which torch ranks first on sm90 and sm10x when the runtime cuDNN is newer
than 9.15, is not chosen: its fake kernel keeps the same tensors as flash (the output and a
float32 log-sum-exp per query row), so flash stands for it. With grouped queries (fewer key and
value heads, ``enable_gqa``) flash takes key and value as they are; torch's fake kernel for the
memory-efficient backward gives key and value gradients with the query's heads, so before that
kernel the capture repeats key and value heads, as the math path does (an assumption: the
copies are counted). Under autocast, q, k and v are cast to its lower precision first, as
autocast casts attention's inputs. Fused cross-entropy and cuDNN convolution workspaces are not
modelled (docs/gpu.md says why).

torch is passed in, never imported at module level (it is an optional extra).
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import OptionError
from ..io.profile import Target

__all__ = ["KERNELS", "COMPUTE_CAPABILITIES", "AttentionCall", "choose_attention_kernel", "target_architecture",
           "check_kernels", "cuda_attention", "kernels_note"]

KERNELS = ("cpu", "cuda")

#: the compute capability of each shipped GPU target, from NVIDIA's table of CUDA GPUs
#: (https://developer.nvidia.com/cuda-gpus): A100 8.0, H100 9.0
COMPUTE_CAPABILITIES: dict[str, tuple[int, int]] = {"a100-40gb": (8, 0), "a100-80gb": (8, 0), "h100-80gb": (9, 0)}
#: what a GPU target outside the table is taken to be (said in the profile)
ASSUMED_CAPABILITY = (8, 0)

_HALF = ("float16", "bfloat16")


@dataclass(frozen=True)
class AttentionCall:
    """What the CUDA dispatcher looks at in one attention call (dense inputs, batch x heads x
    sequence x head dimension)."""

    dtype: str                     # float32, float16, bfloat16
    head_dim_qk: int
    head_dim_key: int
    head_dim_v: int
    queries: int
    keys: int
    has_mask: bool
    is_causal: bool
    dropout: float = 0.0
    requires_grad: bool = True
    heads_q: int = 1
    heads_kv: int = 1
    enable_gqa: bool = False
    #: storage offset in bytes of q, k and v (the efficient kernel's pointer alignment on sm80+)
    offsets_bytes: tuple[int, int, int] = (0, 0, 0)


def _in(cc: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= cc <= high


def _heads_ok(call: AttentionCall) -> bool:
    """check_batch_size_and_num_heads_dense: the same number of heads, or, with enable_gqa, key
    heads dividing query heads (flash and efficient both accept grouped queries)."""
    if call.heads_q == call.heads_kv:
        return True
    return call.enable_gqa and call.heads_kv > 0 and call.heads_q % call.heads_kv == 0


def _gemm_alignment(cc: tuple[int, int], dtype: str) -> int:
    """minimum_gemm_alignment: 4 on sm80+, at least 128 bits when tensor cores are used (sm80+,
    or sm70+ in half precision)."""
    half = dtype in _HALF
    tensor_cores = cc[0] >= 8 or (cc[0] >= 7 and half)
    alignment = 4 if cc[0] >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def _flash_ok(cc: tuple[int, int], call: AttentionCall) -> bool:
    d = call.head_dim_qk
    if call.has_mask or not (d == call.head_dim_key == call.head_dim_v and d <= 256):
        return False
    if not _in(cc, (8, 0), (12, 1)):
        return False
    if call.requires_grad and (_in(cc, (8, 6), (8, 9)) or _in(cc, (12, 0), (12, 1))):
        if not (d <= 192 or (call.dropout == 0.0 and d > 224)):
            return False
    if call.is_causal and call.queries != call.keys:
        return False
    if call.dtype not in _HALF:
        return False
    return _heads_ok(call) and call.queries > 0 and call.keys > 0


def _efficient_ok(cc: tuple[int, int], call: AttentionCall) -> bool:
    if not _in(cc, (5, 0), (12, 1)):
        return False
    align = _gemm_alignment(cc, call.dtype)
    if not (call.head_dim_qk == call.head_dim_key and call.head_dim_qk > 0 and call.head_dim_v > 0
            and call.head_dim_qk % align == 0 and call.head_dim_v % align == 0):
        return False
    if cc[0] >= 8:
        size = 4 if call.dtype == "float32" else 2
        if any(off % (align * size) for off in call.offsets_bytes):
            return False
    if not (_heads_ok(call) and call.queries > 0 and call.keys > 0):
        return False
    allowed = ("float16", "float32", "bfloat16") if cc[0] >= 8 else ("float16", "float32")
    return call.dtype in allowed


def choose_attention_kernel(cc: tuple[int, int], call: AttentionCall) -> str:
    """``flash``, ``efficient`` or ``math``: the first of torch's default order that accepts the
    call on a GPU of compute capability ``cc`` (see the module's docstring for the rules)."""
    if _flash_ok(cc, call):
        return "flash"
    if _efficient_ok(cc, call):
        return "efficient"
    return "math"


def target_architecture(target: Target) -> tuple[tuple[int, int], bool]:
    """(compute capability, whether it is known) of a GPU target; one outside the table is taken
    to be ``ASSUMED_CAPABILITY``."""
    found = COMPUTE_CAPABILITIES.get(target.name)
    return (found, True) if found is not None else (ASSUMED_CAPABILITY, False)


def check_kernels(kernels: str, target: Target) -> None:
    """Before the model runs: CUDA kernels are a GPU's (an IPU target has no such kernels)."""
    if kernels not in KERNELS:
        raise OptionError("kernels", f"expected one of {', '.join(KERNELS)}, got '{kernels}'")
    if kernels == "cuda" and target.kind != "gpu":
        raise OptionError("kernels", f"cuda kernels need a GPU target; {target.name} is of kind {target.kind}")


def kernels_note(used: Counter, target: Target) -> str:
    """The sentence a profile's description gets: which attention kernels the capture assumed."""
    cc, known = target_architecture(target)
    arch = f"sm{cc[0]}{cc[1]}" + ("" if known else f" (assumed: {target.name} is not in stagesplit's table)")
    if not used:
        return f"CUDA kernels assumed for {arch}; no attention call"
    calls = ", ".join(f"{name} x{used[name]}" for name in ("flash", "efficient", "math") if used[name])
    return f"CUDA attention kernels assumed for {arch}: {calls}"


def _pad_last(torch, t, multiple: int):
    extra = -t.shape[-1] % multiple
    return t if extra == 0 else torch.nn.functional.pad(t, (0, extra))


def _aligned(t, alignment: int) -> bool:
    """attention.cpp's aligned_tensor: every stride but the last a multiple of ``alignment``, the last 1."""
    return all(s % alignment == 0 for s in t.stride()[:-1]) and t.stride()[-1] == 1


def _call_of(torch, q, k, v, mask, dropout: float, causal: bool, enable_gqa: bool) -> AttentionCall:
    dtype = str(q.dtype).replace("torch.", "")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return AttentionCall(dtype, int(q.shape[-1]), int(k.shape[-1]), int(v.shape[-1]), int(q.shape[-2]),
                         int(k.shape[-2]), mask is not None, bool(causal), float(dropout), grad,
                         int(q.shape[-3]) if q.dim() >= 3 else 1, int(k.shape[-3]) if k.dim() >= 3 else 1,
                         bool(enable_gqa), tuple(int(t.storage_offset()) * t.element_size() for t in (q, k, v)))


@contextlib.contextmanager
def cuda_attention(torch, target: Target, used: Counter, cp_mesh=None) -> Iterator[None]:
    """While open, ``scaled_dot_product_attention`` on 4-dimensional inputs runs the kernel torch's
    CUDA dispatcher would choose on ``target``; ``used`` counts the calls by kernel (a checkpointed
    block's recomputation runs its kernel again, not counted as another call). Other shapes
    (nested, 3-dimensional) run as they would on the CPU. With ``cp_mesh`` (a context-parallel
    capture) the fused kernels get their inputs as torch's ring attention takes them
    (``contextparallel.ring_inputs``) and return the rank's local output; the math kernel, which
    torch's ring does not run, and an explicit mask, which it does not take, are refused."""
    from torch.overrides import TorchFunctionMode

    cc, _known = target_architecture(target)
    aten = torch.ops.aten
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        q, k, v = query, key, value
        if torch.is_autocast_enabled("cpu"):              # autocast runs attention in its lower precision
            low = torch.get_autocast_dtype("cpu")
            q, k, v = (t.to(low) if t.is_floating_point() else t for t in (q, k, v))
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.to(low)
        call = _call_of(torch, q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
        kernel = choose_attention_kernel(cc, call)
        if torch._C._current_autograd_node() is None:      # a checkpoint's recomputation is not a call of its own
            used[kernel] += 1
        if cp_mesh is not None and (kernel == "math" or attn_mask is not None):
            why = "an explicit attention mask" if attn_mask is not None else "torch's math attention kernel"
            raise OptionError("cp", f"attention here takes {why} on {target.name}; torch's context-parallel ring "
                              "attention runs only the fused kernels (flash, memory-efficient) without a mask")

        def ring(*tensors):
            if cp_mesh is None:
                return tensors
            from .contextparallel import ring_inputs
            return ring_inputs(torch, cp_mesh, tensors)

        def local(t):
            return t.to_local() if cp_mesh is not None else t
        if kernel == "flash":
            d = q.shape[-1]
            scale = scale if scale is not None else 1.0 / math.sqrt(d)
            out = local(aten._scaled_dot_product_flash_attention(
                *ring(_pad_last(torch, q, 8), _pad_last(torch, k, 8), _pad_last(torch, v, 8)), float(dropout_p),
                bool(is_causal), False, scale=scale)[0])
            return out if out.shape[-1] == d else out[..., :d]
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:          # convert_boolean_attn_mask
            bias = torch.where(bias, 0.0, torch.full((), -math.inf, dtype=q.dtype))
        if kernel == "efficient":
            if k.shape[-3] != q.shape[-3]:                       # grouped queries: see the module's docstring
                k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
                v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
            if bias is not None:                                 # preprocess_mask
                if not _aligned(bias, 8):
                    last = bias.shape[-1]
                    bias = torch.nn.functional.pad(bias, (0, 8 - last % 8))[..., :last]
                bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            return local(aten._scaled_dot_product_efficient_attention(*ring(q, k, v), bias, call.requires_grad,
                                                                      float(dropout_p), bool(is_causal),
                                                                      scale=scale)[0])
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, bias, dropout_p, is_causal, None,
                                                                  scale=scale, enable_gqa=enable_gqa)[0]

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa or func is torch._C._nn.scaled_dot_product_attention:
                q = args[0] if args else kwargs.get("query")
                if isinstance(q, torch.Tensor) and q.dim() == 4 and not q.is_nested:
                    return run(*args, **kwargs)
            return func(*args, **kwargs)

    def patched(*args, **kwargs):
        q = args[0] if args else kwargs.get("query")
        if isinstance(q, torch.Tensor) and q.dim() == 4 and not q.is_nested:
            return run(*args, **kwargs)
        return sdpa(*args, **kwargs)

    # Torch function modes are not active in the backward, where activation checkpointing runs a
    # block's forward again: the module attribute, looked up at each call, is replaced too (and
    # put back), so that the recomputation runs the same kernel as the forward.
    functional = torch.nn.functional
    functional.scaled_dot_product_attention = patched
    try:
        with Mode():
            yield
    finally:
        functional.scaled_dot_product_attention = sdpa
