"""stagesplit capture --cp: one context-parallel rank, torch's own ring attention under the fake
process group.

A one-attention model whose rank's bytes and ring collectives are written out by arithmetic
(bfloat16, batch B, sequence S, H heads of dimension d, N ranks); the degree refused in one line;
an explicit mask refused; the layout's round trip through both file formats; TP x CP on a Hugging
Face Llama from a config; the command line. torch's ring attention does not run on the CPU (its
handlers are for the CUDA kernels: docs/layouts.md), so there is no real-process check."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

import tp_harness  # noqa: E402
from stagesplit.capturing.profilebuild import peak_bytes  # noqa: E402
from stagesplit.capturing.pytorch import capture_model  # noqa: E402
from stagesplit.cli import main  # noqa: E402
from stagesplit.errors import OptionError  # noqa: E402
from stagesplit.io import load_profile, save_profile  # noqa: E402
from stagesplit.io.profile import Collective, ParallelLayout  # noqa: E402
from stagesplit.reporting.layout import context_parallel_line  # noqa: E402

BF16, F32 = 2, 4
B, S, V, D, H = 2, 32, 64, 32, 2
HD = D // H


class Ring(torch.nn.Module):
    """Token ids -> Embedding(V, D) -> q, k, v projections -> causal attention -> Linear(D, V)."""

    def __init__(self, mask: bool = False):
        super().__init__()
        self.mask = mask
        self.embed = torch.nn.Embedding(V, D)
        self.q, self.k, self.v = (torch.nn.Linear(D, D, bias=False) for _ in range(3))
        self.head = torch.nn.Linear(D, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        b, s, _ = x.shape
        q, k, v = (lin(x).view(b, s, H, HD).transpose(1, 2) for lin in (self.q, self.k, self.v))
        if self.mask:
            m = torch.ones(s, s, dtype=torch.bool).tril()
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
        else:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(y.transpose(1, 2).reshape(b, s, D))


def _capture(cp: int, seq: int = S, **kw):
    return capture_model(Ring(**kw), torch.zeros(B, seq, dtype=torch.long), dtype="bfloat16", allocator_round=1,
                         cp=cp, optimizer="none")


def _named(profile, suffix: str) -> list[int]:
    v = profile.variables
    return [int(v.bytes[i]) for i in range(len(v)) if profile.variable_name(i).endswith(suffix)]


@pytest.mark.parametrize("n", [2, 4])
def test_ring_rank_bytes_by_hand(n):
    """Rank 0 of N holds every parameter whole and S/N of each token's activations: the embedding's
    output B x S/N x D, the logits B x S/N x V (bfloat16). torch's ring (its default rotation, one
    all-gather) gathers K and V of the whole sequence once in the forward and once in the backward,
    2 x B x H x S x d bfloat16 bytes; the backward sends the key/value gradients (float32, torch
    accumulates them so) of a block, 2 x B x H x S/N x d x 4 bytes, N times around the ring (one per
    step after the first, and one home). On so small a model the ring's buffers outweigh what the
    shards save: the rank's peak is not below the single device's here."""
    one, rank = _capture(1), _capture(n)
    for name in ("embed.weight", "q.weight", "k.weight", "v.weight", "head.weight"):
        assert _named(rank, name) == _named(one, name)
    assert _named(rank, "embed/aten.embedding:out0") == [B * (S // n) * D * BF16]
    assert _named(rank, "head/aten.mm:out0") == [B * (S // n) * V * BF16]
    layout = rank.info.parallel_layout
    assert (layout.context_parallel, layout.tensor_parallel, layout.cp_load_balanced) == (n, 1, True)
    gathered = 2 * B * H * S * HD * BF16
    sent = 2 * B * H * (S // n) * HD * F32
    assert [(c.kind, c.bytes, c.group_size, c.group, c.phase) for c in layout.collectives] == (
        [("all_gather_into_tensor", gathered, n, "cp", "forward"), ("all_gather_into_tensor", gathered, n, "cp",
                                                                     "backward")]
        + [("all_to_all_single", sent, n, "cp", "backward")] * n)
    # the backward's float32 accumulators of the query, key and value gradients of the rank's block
    assert _named(rank, "backward/aten.zeros_like:out0") == [B * H * (S // n) * HD * F32] * 3
    assert one.info.parallel_layout is None and peak_bytes(rank) > 0


def test_contiguous_shards_where_2n_does_not_divide():
    """torch balances the load only where 2N divides the sequence; else contiguous shards."""
    layout = _capture(2, seq=6).info.parallel_layout
    assert (layout.context_parallel, layout.cp_load_balanced) == (2, False)
    assert "in contiguous shards" in context_parallel_line(layout)


def test_degree_refused_in_one_line(capsys, tmp_path):
    with pytest.raises(OptionError) as caught:
        _capture(3)
    assert str(caught.value) == "cp: the input has a sequence of 32 tokens, not divisible by 3 context-parallel ranks"
    with pytest.raises(OptionError, match="cp: expected a whole number of ranks in 1..4096, got 0"):
        _capture(0)


def test_mask_refused():
    with pytest.raises(OptionError) as caught:
        _capture(2, mask=True)
    assert str(caught.value).startswith("cp: attention here takes an explicit attention mask on a100-80gb; torch's "
                                        "context-parallel ring attention runs only the fused kernels")


@pytest.mark.parametrize("suffix", [".stagesplit", ".json"])
def test_layout_round_trip(tmp_path, suffix):
    profile = _capture(2)
    path = tmp_path / f"rank{suffix}"
    save_profile(profile, path)
    back = load_profile(path).info.parallel_layout
    assert back == profile.info.parallel_layout
    assert back.collectives[0].group == "cp"


def test_tp_and_cp_together():
    """TP 2 x CP 2 on the tests' Llama (4 heads, 2 KV heads, head dimension 16, 2 blocks, batch 2
    x 32): each group's collectives recorded on its own group of 2; the ring gathers K and V of
    the rank's one KV head over the whole sequence, 2 x 2 x 1 x 32 x 16 x 2 bytes, per block and
    pass."""
    pytest.importorskip("transformers", reason="the Llama case builds a Hugging Face model from a config")
    profile = capture_model(tp_harness.build("llama", "meta"), tp_harness.inputs("llama", "meta"),
                            dtype="bfloat16", allocator_round=1, tp=2, cp=2)
    layout = profile.info.parallel_layout
    assert (layout.tensor_parallel, layout.context_parallel) == (2, 2)
    assert {c.group_size for c in layout.collectives} == {2}
    gathers = [c.bytes for c in layout.collectives if c.group == "cp" and c.kind == "all_gather_into_tensor"]
    assert gathers == [2 * 2 * 1 * 32 * 16 * BF16] * 4
    assert sum(c.group == "tp" and c.kind == "all_reduce" for c in layout.collectives) == 16
    # the line docs/layouts.md shows
    assert context_parallel_line(layout) == (
        "rank 0 of 2 context-parallel ranks, the sequence in head and tail chunks; ring attention: 8 collectives per "
        "step (4 all_gather_into_tensor, 4 all_to_all_single), 32.0 KiB")


def test_context_parallel_line_by_hand():
    layout = ParallelLayout(collectives=(Collective(0, "all_reduce", 1024, 2, "forward"),
                                         Collective(1, "all_gather_into_tensor", 2048, 2, "forward", "cp"),
                                         Collective(2, "all_to_all_single", 1024, 2, "backward", "cp")),
                            context_parallel=2, cp_load_balanced=True)
    assert context_parallel_line(layout) == (
        "rank 0 of 2 context-parallel ranks, the sequence in head and tail chunks; ring attention: 2 collectives per "
        "step (1 all_gather_into_tensor, 1 all_to_all_single), 3.0 KiB")


def test_cli(tmp_path, capsys):
    factory = tmp_path / "ring.py"
    factory.write_text(textwrap.dedent(f"""
        import sys
        import torch
        sys.path.insert(0, {str(tp_harness.ROOT / "tests" / "capturing")!r})
        from test_contextparallel import Ring

        def build():
            return Ring(), torch.zeros(2, 32, dtype=torch.long)
    """))
    out = tmp_path / "ring.stagesplit"
    assert main(["capture", f"{factory}:build", "--cp", "2", "--dtype", "bfloat16", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert context_parallel_line(load_profile(out).info.parallel_layout) in err
    bad = tmp_path / "bad.stagesplit"
    assert main(["capture", f"{factory}:build", "--cp", "3", "-o", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("stagesplit: error: --cp: the input has a sequence of 32 tokens, not "
                                            "divisible by 3 context-parallel ranks")
    assert not bad.exists()
