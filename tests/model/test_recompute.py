"""What recomputing a layer saves (model/recompute.py), by hand on the example GPT and against
the capture of the same model whose blocks really are checkpointed.

The example GPT's block (examples/gpt.py) with B sequences of T tokens, width D, H heads, in
float32, stashes of its own (what its forward makes and only its backward reads):

* both layer norms' mean and rstd: 4 x 4BT bytes;
* the causal mask's negation, which masked_fill keeps: T x T booleans;
* seven (B, T, D) tensors: ln_1's output (c_attn's input), the contiguous copies of q, k^T and
  v the batched products keep, the attention output's contiguous copy (c_proj's input), the
  residual sum (ln_2's input) and ln_2's output (c_fc's input): 7 x 4BTD;
* the softmax output: 4BHT^2; c_fc's output (GELU's input) and GELU's output: 2 x 16BTD.

Full recompute drops them all. Selective recompute keeps the outputs of the matrix products
(c_fc's output, which is stashed anyway, and four that the backward never reads: c_attn's
output 12BTD, the scores 4BHT^2, the attention output and both projections' outputs 3 x 4BTD),
and drops the rest. The first and the last layer count only their block: the embedding, the
final norm and the head are not checkpointed with it. tests/model/test_recompute_torch.py
measures the same rules against torch's own checkpointing."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

B, T, D, H, L = 2, 16, 32, 2, 3


def _table(mode: str = "none"):
    import torch
    from torch.utils.checkpoint import checkpoint

    from examples.gpt import GPT, GPTConfig
    from stagesplit.capturing.pytorch import capture_model
    from stagesplit.model.analysis import Analysis
    from stagesplit.model.phases import phase_table

    class Checkpointed(GPT):
        def forward(self, idx):
            t = self.transformer
            x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in t.h:
                x = checkpoint(block, x, use_reentrant=False)
            return self.lm_head(t.ln_f(x))

    cfg = GPTConfig(vocab_size=64, context=T, d_model=D, heads=H, layers=L, batch=B, tie_embeddings=False)
    with torch.device("meta"):
        model = (Checkpointed if mode == "full" else GPT)(cfg)
    ids = torch.zeros(B, T, dtype=torch.long, device="meta")
    profile = capture_model(model, ids, loss_fn=lambda out: out.sum(), optimizer="adam", allocator_round=1)
    return phase_table(Analysis.of(profile).model)


def test_what_each_block_of_the_example_gpt_saves_by_hand():
    rc = _table().recompute
    own = 4 * (4 * B * T) + T * T + 7 * (4 * B * T * D) + 4 * B * H * T * T + 2 * (16 * B * T * D)
    kept_beyond = 12 * B * T * D + 4 * B * H * T * T + 3 * (4 * B * T * D)
    assert rc.saved[2].tolist() == [own] * L                       # first and last blocks: their block only
    assert rc.saved[1].tolist() == [own - 16 * B * T * D - kept_beyond] * L
    assert rc.saved[0].tolist() == [0] * L
    # the backward holds the block's stash again while it runs (and the rerun forward's transient
    # where it is larger than the backward's); selective also the output of the block's last
    # matrix product (the MLP's c_proj, 4BTD), which torch's stopped re-run still references
    assert np.all(rc.rerun[2] >= rc.saved[2])
    assert rc.rerun[1].tolist() == [own - 16 * B * T * D - kept_beyond + 4 * B * T * D] * L
    # full recompute repeats the block's forward: its matrix products' FLOPs (unit: flops)
    flops = 2 * B * T * D * (3 * D) + 2 * (2 * B * H * T * T * (D // H)) + 2 * B * T * D * D + 2 * (2 * B * T * D * 4 * D)
    assert rc.added[2].tolist() == pytest.approx([flops] * L)


@pytest.mark.slow
def test_full_recompute_saves_what_the_checkpointed_model_does_not_stash():
    """The independent oracle: capture the model whose blocks run under torch.utils.checkpoint
    (non-reentrant); each layer's stash there is the plain model's less what full recompute
    saves, byte for byte."""
    plain, checkpointed = _table(), _table("full")
    d = np.arange(L)
    assert (plain.stash[d, d] - checkpointed.stash[d, d]).tolist() == plain.recompute.saved[2].tolist()
    assert not checkpointed.recompute.saved[2].any()               # nothing of its own left to drop


def test_the_transients_depend_on_where_in_the_chunk_the_recomputed_layers_are():
    """Two layers of own stash 8 and 10; selective saves 3 and 4 and holds 5 and 6 again; full
    holds its own again. Forward: the largest over layers of (what the earlier layers kept + the
    layer's own); backward: the largest of what all layers kept and, per recomputed layer, what
    it and the earlier layers kept + its rerun. Changes are against no recompute (18 both)."""
    from stagesplit.model.recompute import RecomputeTable
    table = RecomputeTable(saved=np.array([[0, 0], [3, 4], [8, 10]]), rerun=np.array([[0, 0], [5, 6], [8, 10]]),
                           added=np.array([[0.0, 0.0], [0.5, 0.5], [1.0, 1.0]]), time_unit="seconds")

    def changes(choice):
        saved, forward, backward, added = table.chunk_changes((0, 2), np.array(choice))
        return int(saved[0]), int(forward[0]), int(backward[0]), float(added[0])

    # full first: forward max(0 + 8, 0 + 10) = 10; backward max(kept 10, 0 + 8) = 10
    assert changes([2, 0]) == (8, 10 - 18, 10 - 18, 1.0)
    # full second: forward max(8, 8 + 10) = 18; backward max(8, 8 + 0 + 10) = 18: no transient gain
    assert changes([0, 2]) == (10, 0, 0, 1.0)
    # selective first: kept 5 of layer 0; forward max(8, 5 + 10) = 15; backward max(15, 5 + 5) = 15
    assert changes([1, 0]) == (3, 15 - 18, 15 - 18, 0.5)
    # both full: forward max(8, 10) = 10; backward max(0, 0 + 8, 0 + 10) = 10
    assert changes([2, 2]) == (18, 10 - 18, 10 - 18, 2.0)
    # two chunks, one layer each: each its own
    saved, forward, backward, _ = table.chunk_changes((0, 1, 2), np.array([0, 2]))
    assert saved.tolist() == [0, 10] and forward.tolist() == [0, 0] and backward.tolist() == [0, 0]
