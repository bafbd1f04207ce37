"""A capture with the CUDA attention kernels (``kernels="cuda"``): the kernel torch's CUDA
dispatcher would choose, by hand; the tensors the capture keeps for the backward, by hand and
against torch's own fake (meta) kernels for the CUDA operators; a Hugging Face Llama captured both
ways, the per-layer stash difference as the hand case predicts."""

from __future__ import annotations

import math

import pytest

from stagesplit.capturing.kernels import AttentionCall, choose_attention_kernel
from stagesplit.errors import StagesplitError

torch = pytest.importorskip("torch")

B, H, S, D = 2, 4, 128, 64
FLASH = "aten._scaled_dot_product_flash_attention"
EFFICIENT = "aten._scaled_dot_product_efficient_attention"


def _call(dtype="bfloat16", d=64, mask=False, causal=True, sq=128, sk=128, grad=True, heads=(4, 4), gqa=False,
          offsets=(0, 0, 0), dropout=0.0):
    return AttentionCall(dtype, d, d, d, sq, sk, mask, causal, dropout, grad, heads[0], heads[1], gqa, offsets)


def test_kernel_rules_by_hand():
    a100, h100, l4, t4, rtx5090 = (8, 0), (9, 0), (8, 9), (7, 5), (12, 0)
    assert choose_attention_kernel(a100, _call()) == "flash"
    assert choose_attention_kernel(h100, _call(dtype="float16")) == "flash"
    assert choose_attention_kernel(a100, _call(dtype="float32")) == "efficient"       # flash: half precision only
    assert choose_attention_kernel(a100, _call(mask=True)) == "efficient"             # flash: no explicit mask
    assert choose_attention_kernel(a100, _call(sq=1, sk=128)) == "efficient"          # causal needs square for flash
    assert choose_attention_kernel(a100, _call(sq=1, sk=128, causal=False)) == "flash"
    assert choose_attention_kernel(a100, _call(d=320)) == "efficient"                 # flash: head dim <= 256
    assert choose_attention_kernel(a100, _call(d=72)) == "flash"                      # padded to 80 in the composite
    assert choose_attention_kernel(a100, _call(d=36)) == "flash"
    assert choose_attention_kernel(a100, _call(d=36, mask=True)) == "math"            # efficient: d % 8 in half
    assert choose_attention_kernel(a100, _call(d=36, dtype="float32")) == "efficient"  # float32: d % 4
    assert choose_attention_kernel(a100, _call(d=6, dtype="float32")) == "math"
    # training with head dim in (192, 224] on sm86-sm89 and sm120-sm121: not flash
    assert choose_attention_kernel(l4, _call(d=200)) == "efficient"
    assert choose_attention_kernel(rtx5090, _call(d=200)) == "efficient"
    assert choose_attention_kernel(l4, _call(d=200, grad=False)) == "flash"
    assert choose_attention_kernel(l4, _call(d=232)) == "flash"
    assert choose_attention_kernel(l4, _call(d=232, dropout=0.1)) == "efficient"
    assert choose_attention_kernel(a100, _call(d=200)) == "flash"
    # sm75: no flash, and the efficient kernel takes float16 and float32 only
    assert choose_attention_kernel(t4, _call(dtype="float16")) == "efficient"
    assert choose_attention_kernel(t4, _call()) == "math"
    # grouped queries need enable_gqa and key heads dividing query heads
    assert choose_attention_kernel(a100, _call(heads=(8, 2), gqa=True)) == "flash"
    assert choose_attention_kernel(a100, _call(heads=(8, 2))) == "math"
    assert choose_attention_kernel(a100, _call(heads=(8, 3), gqa=True)) == "math"
    # the efficient kernel's pointers aligned to 8 elements (half) on sm80+
    assert choose_attention_kernel(a100, _call(mask=True, offsets=(0, 16, 32))) == "efficient"
    assert choose_attention_kernel(a100, _call(mask=True, offsets=(0, 2, 0))) == "math"


class Attention(torch.nn.Module):
    def __init__(self, mask=None):
        super().__init__()
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)
        self.o = torch.nn.Linear(H * D, H * D)
        self.mask = mask

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
        if self.mask is not None:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        else:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, H * D))


def _capture(dtype, kernels="cuda", seq=S, model=None, target=None):
    from stagesplit.capturing.pytorch import capture_model
    return capture_model(model or Attention(), torch.randn(B, seq, H * D), dtype=dtype, kernels=kernels,
                         allocator_round=1, optimizer="none", target=target)


def _forward_end(profile) -> int:
    """The last step of the forward pass (the loss included)."""
    ops = profile.operations
    return max(int(ops.last_step[i]) for i, n in enumerate(ops.name)
               if "/backward/" not in n and "/optimizer/" not in n and "/recompute/" not in n)


def _kernel_tensors(profile, func: str) -> dict[int, tuple[int, bool]]:
    """The outputs of operation ``func`` (not a checkpoint's recomputation of it): {output index:
    (bytes, kept for the backward)}; kept: live past the last forward step."""
    forward_end = _forward_end(profile)
    found: dict[int, tuple[int, bool]] = {}
    v = profile.variables
    for i in range(len(v)):
        name = profile.names[v.name[i]] if v.name[i] >= 0 else ""
        if f"/{func}:out" not in name or "/recompute/" in name:
            continue
        c = int(v.live_class[i])
        end = int(profile.liveness.intervals[c][:, 1].max()) if c >= 0 else -1
        found[int(name.rpartition(":out")[2])] = (int(v.bytes[i]), end > forward_end + 1)
    return found


def test_flash_keeps_output_logsumexp_and_philox_state_no_scores():
    """bfloat16 on an A100: flash. It keeps the output (B*S*H*D*2 bytes), the float32
    log-sum-exp (B*H*S*4) and the philox seed (2 x uint64) and offset (uint64); nothing keeps
    an S x S matrix: no softmax, no matrix product of q and k runs."""
    profile = _capture("bfloat16")
    kept = _kernel_tensors(profile, FLASH)
    assert kept[0] == (B * S * H * D * 2, True)
    assert kept[1] == (B * H * S * 4, True)
    assert kept[6] == (16, True) and kept[7] == (8, True)
    assert "CUDA attention kernels assumed for sm80: flash x1" in profile.info.description
    names = set(profile.operations.name)
    assert not any("softmax" in n or "bmm" in n or "flash_attention_for_cpu" in n for n in names)
    assert f"<root>/backward/{FLASH}_backward" in names
    # the same FLOPs as the CPU kernel: 4*B*H*S*S*D forward (two products), 2.5 times that backward
    flops = dict(zip(profile.operations.name, profile.operations.compute))
    assert flops[f"<root>/{FLASH}"] == 4 * B * H * S * S * D
    assert flops[f"<root>/backward/{FLASH}_backward"] == 10 * B * H * S * S * D
    assert profile.operations.compute.sum() == _capture("bfloat16", kernels="cpu").operations.compute.sum()


def test_float32_runs_the_efficient_kernel_with_its_padded_logsumexp():
    """float32 on an A100: the memory-efficient kernel, its log-sum-exp padded to a multiple of
    32 query rows: 100 rows keep 128."""
    profile = _capture("float32", seq=100)
    kept = _kernel_tensors(profile, EFFICIENT)
    assert kept[0] == (B * 100 * H * D * 4, True)
    assert kept[1] == (B * H * math.ceil(100 / 32) * 32 * 4, True) == (B * H * 128 * 4, True)
    assert kept[2] == (8, True) and kept[3] == (8, True)     # philox seed and offset, int64
    assert "efficient x1" in profile.info.description


def test_a_boolean_mask_is_kept_as_the_efficient_kernels_additive_bias():
    """A boolean mask rules flash out; the efficient kernel gets it as an additive bias of the
    query's dtype (S x S, the mask's own shape, broadcast), which it keeps for the backward."""
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    profile = _capture("bfloat16", model=Attention(mask))
    kept = _kernel_tensors(profile, EFFICIENT)
    assert kept[1] == (B * H * S * 4, True)
    where = [profile.variables.bytes[i] for i in range(len(profile.variables))
             if profile.names[profile.variables.name[i]].endswith("aten.where:out0")]
    assert where == [S * S * 2]


def test_the_capture_keeps_what_torchs_cuda_meta_kernels_return():
    """The oracle: torch's CUDA operators called directly on meta tensors of the same shapes
    return tensors of exactly the bytes the capture recorded, forward and backward."""
    aten = torch.ops.aten
    for dtype, seq, func in ((torch.bfloat16, S, FLASH), (torch.float32, 100, EFFICIENT)):
        q, k, v = (torch.empty(B, H, seq, D, dtype=dtype, device="meta") for _ in range(3))
        if func == FLASH:
            outs = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)
            grads = aten._scaled_dot_product_flash_attention_backward(
                outs[0], q, k, v, outs[0], outs[1], None, None, seq, seq, 0.0, True, outs[6], outs[7])
        else:
            outs = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)
            grads = aten._scaled_dot_product_efficient_attention_backward(
                outs[0], q, k, v, None, outs[0], outs[1], outs[2], outs[3], 0.0, [True, True, True, False], True)
        profile = _capture(str(dtype).replace("torch.", ""), seq=seq)
        expected = {i: t.numel() * t.element_size() for i, t in enumerate(outs) if isinstance(t, torch.Tensor)}
        recorded = {i: b for i, (b, _) in _kernel_tensors(profile, func).items()}
        assert recorded == expected
        backward = {i: b for i, (b, _) in _kernel_tensors(profile, f"{func}_backward").items()}
        assert backward == {i: t.numel() * t.element_size() for i, t in enumerate(grads) if t is not None}


def test_autocast_runs_attention_in_its_lower_precision():
    """With --amp the parameters are float32 and autocast runs attention in bfloat16, as CUDA's
    autocast does: flash, on bfloat16 q, k and v."""
    from stagesplit.capturing.pytorch import capture_model
    profile = capture_model(Attention(), torch.randn(B, S, H * D), amp=True, kernels="cuda", allocator_round=1,
                            optimizer="none")
    kept = _kernel_tensors(profile, FLASH)
    assert kept[0] == (B * S * H * D * 2, True) and kept[1] == (B * H * S * 4, True)
    assert profile.info.description.endswith("flash x1")


def test_checkpointed_attention_runs_the_kernel_again_in_the_backward():
    """Under activation checkpointing the forward's kernel runs again in the backward (recompute),
    and the forward keeps none of its outputs."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Attention()

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    profile = _capture("bfloat16", model=Checkpointed())
    names = list(profile.operations.name)
    assert f"inner/{FLASH}" in names and f"inner/recompute/{FLASH}" in names
    assert f"inner/backward/{FLASH}_backward" in names
    assert not any(keep for _, keep in _kernel_tensors(profile, FLASH).values())
    assert profile.info.description.endswith("flash x1")


def test_cpu_kernels_stay_the_default():
    profile = _capture("bfloat16", kernels="cpu")
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in " ".join(profile.operations.name)
    assert "CUDA" not in profile.info.description


def test_bad_kernels_option_is_one_line():
    with pytest.raises(StagesplitError, match="kernels.*expected one of cpu, cuda, got 'tpu'"):
        _capture("bfloat16", kernels="tpu")
    from stagesplit import api
    from stagesplit.errors import OptionError
    with pytest.raises(OptionError, match="expected one of cpu, cuda, got 'tpu'") as raised:
        api.capture("no/such/file.py:build", kernels="tpu")           # checked before the factory is looked for
    assert raised.value.parameter == "kernels"
    with pytest.raises(StagesplitError, match="cuda kernels need a GPU target; ipu-mk2 is of kind ipu"):
        _capture("bfloat16", target="ipu-mk2")


@pytest.mark.slow
def test_llama_captured_both_ways_differs_per_layer_by_the_hand_figures():
    """A Hugging Face Llama (tests/decoder_families.py: 4 heads of 16, 2 key/value heads, 32
    tokens, batch 2, SDPA with enable_gqa), captured with CPU and with CUDA kernels. bfloat16:
    flash, which keeps what the CPU's flash kernel keeps (the output, the log-sum-exp, q, k and
    v) and the philox seed and offset, 512 bytes each once rounded: 1,024 bytes more stash per
    layer. float32: the efficient kernel, with key and value repeated to 4 heads: it keeps those
    (2 x B*4*32*16*4 bytes) instead of the 2-head ones the CPU kernel keeps (2 x B*2*32*16*4),
    and the seed and offset."""
    import decoder_families as families
    from stagesplit.capturing.pytorch import capture
    from stagesplit.model.analysis import Analysis

    def stash(kernels, dtype):
        profile = capture(families.capture_spec("llama"), kernels=kernels, dtype=dtype)
        analysis = Analysis.of(profile)
        return [int(analysis.model.stage_memory(i, i).stash[0]) for i in range(len(analysis.layers.names))]

    b, s, heads, kv_heads, d = families.BATCH, families.SEQUENCE, 4, 2, 16
    cpu, cuda = stash("cpu", "bfloat16"), stash("cuda", "bfloat16")
    assert len(cpu) == 8 and [c - p for p, c in zip(cpu, cuda)] == [2 * 512] * 8
    cpu, cuda = stash("cpu", "float32"), stash("cuda", "float32")
    repeated = 2 * b * heads * s * d * 4 - 2 * b * kv_heads * s * d * 4
    assert [c - p for p, c in zip(cpu, cuda)] == [repeated + 2 * 512] * 8


def test_math_path_and_a_gpu_target_outside_the_table(tmp_path):
    """A head dimension of 6 in float32 fits neither fused kernel: the math path, whose S x S
    scores are kept. A GPU target stagesplit has no compute capability for is taken as sm80,
    and the profile says so."""
    from stagesplit.io.targets import load_target
    yaml = tmp_path / "mygpu.yaml"
    yaml.write_text("kind: gpu\ntiles: 1\nbytes_per_tile: 1000000000\n")

    class Narrow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(12, 36)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 16, 3, 2, 6).permute(2, 0, 3, 1, 4)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    from stagesplit.capturing.pytorch import capture_model
    profile = capture_model(Narrow(), torch.randn(2, 16, 12), kernels="cuda", optimizer="none", allocator_round=1,
                            target=load_target(str(yaml)))
    assert profile.info.description.endswith("CUDA attention kernels assumed for sm80 (assumed: mygpu is not in "
                                             "stagesplit's table): math x1")
    names = " ".join(profile.operations.name)
    assert "aten._softmax" in names and "flash" not in names and "efficient" not in names


FACTORY = """
import torch
B, H, S, D = 2, 4, 128, 64


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def build():
    return Attention(), torch.zeros(B, S, H * D)
"""


def test_cli_kernels_option(tmp_path, capsys):
    from stagesplit.cli import main
    from stagesplit.io import load_profile
    factory = tmp_path / "attn.py"
    factory.write_text(FACTORY)
    out = tmp_path / "attn.stagesplit"
    assert main(["capture", f"{factory}:build", "-o", str(out), "--dtype", "bfloat16", "--kernels", "cuda"]) == 0
    capsys.readouterr()
    profile = load_profile(out)
    assert profile.info.description.endswith("; CUDA attention kernels assumed for sm80: flash x1")
    assert any(n.endswith(FLASH) for n in profile.operations.name)
    assert main(["capture", f"{factory}:build", "-o", str(tmp_path / "x.stagesplit"), "--kernels", "cuda",
                 "--target", "ipu-mk2"]) == 2
    assert capsys.readouterr().err.strip() == ("stagesplit: error: --kernels: cuda kernels need a GPU target; "
                                               "ipu-mk2 is of kind ipu")
    assert not (tmp_path / "x.stagesplit").exists()


def test_flash_pads_a_head_dimension_to_a_multiple_of_8():
    """Head dimension 36: attention.cpp pads q, k and v to 40 before flash and slices the output
    back; the padded copies and the 40-wide output and log-sum-exp are what flash keeps."""
    class Narrow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(72, 216)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 16, 3, 2, 36).permute(2, 0, 3, 1, 4)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    from stagesplit.capturing.pytorch import capture_model
    profile = capture_model(Narrow(), torch.randn(2, 16, 72), dtype="bfloat16", kernels="cuda", optimizer="none",
                            allocator_round=1)
    kept = _kernel_tensors(profile, FLASH)
    assert kept[0] == (2 * 2 * 16 * 40 * 2, True) and kept[1] == (2 * 2 * 16 * 4, True)
    v = profile.variables
    pads = [int(v.bytes[i]) for i in range(len(v)) if profile.names[v.name[i]] == "<root>/aten.constant_pad_nd:out0"]
    assert pads == [2 * 2 * 16 * 40 * 2] * 3                  # q, k and v, each padded


class DroppedAttention(Attention):
    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
        return self.o(y.transpose(1, 2).reshape(b, s, H * D))


def _kept(profile) -> list[tuple[str, int]]:
    """Every variable that is not always live and is live across the end of the forward pass."""
    forward_end = _forward_end(profile)
    v = profile.variables
    kept = []
    for i in range(len(v)):
        if v.always_live[i] or v.live_class[i] < 0:
            continue
        intervals = profile.liveness.intervals[int(v.live_class[i])]
        if intervals[:, 0].min() <= forward_end and intervals[:, 1].max() > forward_end + 1:
            kept.append((profile.names[v.name[i]], int(v.bytes[i])))
    return sorted(kept)


def test_attention_dropout_runs_the_math_path_on_the_cpu_and_flash_on_the_gpu():
    """The CPU's fused kernel takes no dropout, so with dropout the CPU capture runs the math path
    and keeps S x S float32 tensors per head (the softmax, the dropout mask, the dropped weights);
    flash draws its dropout from the philox state and keeps only its own tensors. What the CUDA
    capture keeps past the forward (the loss included), by hand: the input, the q/k/v
    projection's output (q, k and v are views of it), flash's output, log-sum-exp, seed and offset,
    and the loss."""
    cpu = _kept(_capture("bfloat16", kernels="cpu", model=DroppedAttention()))
    scores = B * H * S * S * 4
    assert ("<root>/aten._safe_softmax:out0", scores) in cpu and ("<root>/aten.mul:out0", scores) in cpu
    cuda = _kept(_capture("bfloat16", model=DroppedAttention()))
    assert cuda == sorted([("input[0]", B * S * H * D * 2), ("qkv/aten.addmm:out0", 3 * B * S * H * D * 2),
                           ("loss/aten.sum:out0", 2), (f"<root>/{FLASH}:out0", B * S * H * D * 2),
                           (f"<root>/{FLASH}:out1", B * H * S * 4), (f"<root>/{FLASH}:out6", 16),
                           (f"<root>/{FLASH}:out7", 8)])
    assert sum(b for _, b in cpu) == 2_621_442 and sum(b for _, b in cuda) == 659_482


def test_torchs_attention_function_is_put_back_after_a_capture_and_after_a_failure():
    original = torch.nn.functional.scaled_dot_product_attention

    class Failing(Attention):
        def forward(self, x):
            super().forward(x)
            raise ValueError("boom")

    _capture("bfloat16")
    assert torch.nn.functional.scaled_dot_product_attention is original
    with pytest.raises(StagesplitError, match="boom"):
        _capture("bfloat16", model=Failing())
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_a_model_without_attention_says_so():
    from stagesplit.capturing.pytorch import capture_model
    profile = capture_model(torch.nn.Linear(8, 8), torch.randn(2, 8), kernels="cuda", target="h100-80gb")
    assert profile.info.description.endswith("; CUDA kernels assumed for sm90; no attention call")
