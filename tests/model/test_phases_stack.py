"""What the phase table reads off a capture of a Hugging Face decoder whose layers are one stack's
blocks (model/phases.py), checked against the model's configuration (tests/decoder_families.py:
2 sequences x 32 tokens per micro-batch, hidden 64, vocabulary 256, float32, Adam):

* only the hidden state crosses a cut (2 x 32 x 64 x 4 bytes): the stages built from the stack's
  modules compute the rotary tables, the mask and the labels themselves;
* a split backward's B frees, as it ends, the loss's saved log-softmax on the last layer
  (2 x 32 x 256 x 4 bytes, and the loss's three small tensors of 512 bytes each as captured);
* Gemma ties its embedding to its head: the bytes layer 0 shares with the last layer are the
  embedding, its gradient and Adam's two moments (4 x 256 x 64 x 4) and Adam's step count (one
  512-byte block as captured); Llama ties nothing;
* a block's input and output are read by no backward (not stashed) where its norms save a float32
  copy of a bfloat16 hidden state (2 x 32 x 64 x 2 bytes at every cut); in float32 the norm saves
  the hidden state itself, so every crossing tensor is stashed;
* a split backward's B keeps, for W, every node that uses a weight and every node its gradient flows on
  to: in a dense block that is every node (GPT-2's GELU squares its saved input before the gradient
  comes in: that node is kept too, so B frees nothing but the last layer's log-softmax); in Qwen2-MoE's
  block (bfloat16, 4 experts, top-2, expert and shared-expert width 64) the nodes only the output's
  gradient reaches are freed: the expert outputs the routing weights scale (2 x 32 tokens x 2 experts x
  64 x 2 bytes), the shared expert's output its sigmoid gate scales (2 x 32 x 64 x 2), the routing
  softmax (64 tokens x 4 experts x 4 bytes, float32), the top-2 indices, the sort's indices and their
  inverse permutation (64 x 2 x 8 bytes each) and two small tensors of 512 bytes as captured
  (the gate's sigmoid, the index of sorted tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest

HIDDEN_STATE = 2 * 32 * 64 * 4
LOG_SOFTMAX = 2 * 32 * 256 * 4
EMBEDDING_HELD = 4 * 256 * 64 * 4


@pytest.fixture(scope="module")
def tables():
    pytest.importorskip("transformers")
    import decoder_families as families
    from stagesplit import api
    from stagesplit.model.phases import phase_table
    tables = {name: phase_table(api.analyze(api.capture(families.capture_spec(name))).model)
              for name in ("llama", "gemma", "gpt2")}
    tables["llama-bf16"] = phase_table(api.analyze(api.capture(families.capture_spec("llama"),
                                                               dtype="bfloat16")).model)
    tables["qwen2_moe-bf16"] = phase_table(api.analyze(api.capture(families.capture_spec("qwen2_moe"),
                                                                   dtype="bfloat16")).model)
    return tables


def test_only_the_hidden_state_crosses_a_cut_of_one_stack(tables):
    for name, table in tables.items():
        hidden = HIDDEN_STATE // 2 if name.endswith("bf16") else HIDDEN_STATE
        assert table.forward_cut[1:-1].tolist() == [hidden] * 7
        assert table.backward_cut[1:-1].tolist() == [hidden] * 7


def test_a_bfloat16_hidden_state_is_not_stashed_where_the_norm_saves_a_float32_copy(tables):
    assert tables["llama"].forward_cut_unstashed.tolist() == [0] * 9
    assert tables["llama-bf16"].forward_cut_unstashed.tolist() == [0] + [HIDDEN_STATE // 2] * 7 + [0]


def test_b_frees_the_loss_s_log_softmax_on_the_last_layer(tables):
    frees = tables["llama"].input_backward_frees
    assert frees[-1] == LOG_SOFTMAX + 3 * 512
    assert frees[:-1].tolist() == [0] * 7


def test_b_keeps_every_node_of_a_dense_block_and_frees_a_mixture_of_experts_routing(tables):
    assert tables["gpt2"].input_backward_frees.tolist() == [0] * 7 + [LOG_SOFTMAX + 3 * 512]
    tokens, experts, top = 2 * 32, 4, 2
    routing = (tokens * top * 64 * 2 + tokens * 64 * 2 + tokens * experts * 4 + 3 * tokens * top * 8 + 2 * 512)
    frees = tables["qwen2_moe-bf16"].input_backward_frees
    assert routing == 29_696
    assert frees[:-1].tolist() == [routing] * 7
    # the last layer's MoE block is below the head's weight: only the loss's log-softmax is freed
    assert frees[-1] == LOG_SOFTMAX + 3 * 512


def test_w_keeps_the_gradients_it_reads_and_what_came_into_a_fused_layer_norm(tables):
    """GPT-2's block (hidden 64, MLP 256, nn.LayerNorm): per micro-batch its B keeps for W the GELU's
    input gradient c_fc's weight reads (2 x 32 x 256 x 4), the merged query-key-value gradient c_attn's
    reads (2 x 32 x 192 x 4), the gradient into attn.c_proj (a hidden state), and for each LayerNorm,
    whose one backward kernel makes the input's and the weight's gradients, the gradient that came
    into it (a hidden state: torch's W runs the node again from it; the weight's and bias's gradients
    the capture's B made are W's, made when W runs it)."""
    gpt2 = tables["gpt2"]
    per_block = 2 * 32 * 256 * 4 + 2 * 32 * 192 * 4 + HIDDEN_STATE + 2 * HIDDEN_STATE
    assert per_block == 163_840
    assert [int(gpt2.weight_stash[k, k] - gpt2.stash[k, k]) for k in range(1, 7)] == [per_block] * 6


def test_a_tied_embedding_is_what_layer_0_shares_with_the_last_layer(tables):
    assert tables["llama"].tied_with_first is None
    tied = tables["gemma"].tied_with_first
    assert tied[1:].tolist() == [EMBEDDING_HELD + 512] * 7 and tied[0] == 0


def test_a_traced_stack_sends_a_tensor_its_layers_share_across_every_cut_it_spans():
    """tests/traced_families.py's skip network: eight linear blocks (256 wide, 2 rows a micro-batch), the
    first block's output added to the fifth's. It is one stack's blocks but not a Hugging Face causal
    language model, so its export traces the stages (the capture records ``traced_stages``) and relays
    that output through the stages between: it crosses the cuts before layers 2 to 4 beside the hidden
    state (2 x 256 x 4 bytes each; before layer 1 it is the hidden state), its gradient the other way.
    Built from modules, as a decoder's stages are, only the hidden state would cross."""
    pytest.importorskip("torch")
    from dataclasses import replace

    import traced_families as families
    from stagesplit import api
    from stagesplit.model.phases import phase_table
    analysis = api.analyze(api.capture(families.capture_spec("skip_net")))
    grouping = analysis.profile.info.layer_grouping
    assert grouping.traced_stages and grouping.module_paths[0] == "blocks.0"
    row = 2 * families.FEATURES * 4
    table = phase_table(analysis.model)
    assert table.forward_cut.tolist() == [0, row] + [2 * row] * 3 + [row] * 3 + [0]
    assert table.backward_cut.tolist() == [0, row] + [2 * row] * 3 + [row] * 3 + [0]
    profile = analysis.profile
    profile.info.layer_grouping = replace(grouping, traced_stages=False)
    as_modules = phase_table(api.analyze(profile).model)
    assert as_modules.forward_cut.tolist()[2:5] == [row] * 3


def test_a_data_parallel_layout_s_gradients_cross_no_cut_of_a_traced_stack(tmp_path):
    """The example GPT (one stack's blocks, traced: ``traced_stages``) ties its embedding to its head. Under
    ZeRO 2 its rank holds each gradient unsharded during its backward: the tied embedding's spans the first
    and last layers, but it is the rank's own, sent by no stage. The layout marks the gradients it adds as
    gradients, FSDP's gathered parameters as parameters, so that the cuts stay what the activations make."""
    pytest.importorskip("torch")
    import numpy as np

    from stagesplit import api
    from stagesplit.io.profile import ROLES
    from stagesplit.model.analysis import Analysis
    from stagesplit.model.datasharding import DataLayout, shard_profile
    from stagesplit.model.phases import phase_table
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "gpt.py").write_text(f"import sys\nsys.path.insert(0, {str(root)!r})\n"
                                     "from examples.gpt import GPTConfig, build as build_gpt\n\n\ndef build():\n"
                                     "    return build_gpt(GPTConfig(vocab_size=64, context=8, d_model=16, heads=2, "
                                     "layers=6, batch=2))\n")
    analysis = api.analyze(api.capture(f"{tmp_path / 'gpt.py'}:build"))
    assert analysis.profile.info.layer_grouping.traced_stages
    plain = phase_table(analysis.model)
    for zero, added in ((2, ("unsharded gradients/",)), (3, ("fsdp/all-gather/", "fsdp/reduce-scatter/"))):
        sharded = shard_profile(analysis.profile, analysis.layers, DataLayout(8, zero))
        v = sharded.variables
        names = [sharded.names[int(n)] if n >= 0 else "" for n in v.name]
        for prefix in added:
            live_part = [i for i, name in enumerate(names) if name.startswith(prefix) and not v.always_live[i]]
            assert live_part, prefix
            want = "param" if "all-gather" in prefix else "grad"
            assert {ROLES[int(v.role[i])] for i in live_part} == {want}, prefix
        table = phase_table(Analysis.of(sharded).model)
        assert np.array_equal(table.forward_cut, plain.forward_cut), zero
        assert np.array_equal(table.backward_cut, plain.backward_cut), zero


def test_a_split_backward_s_peaks_are_priced_when_first_read_and_the_table_keeps_no_path_to_its_model():
    """A phase table prices B's and W's peaks only when a schedule that splits the backward reads them
    (two of its six sweeps, the costliest: the stash held through B): a 1F1B or interleaved solve never
    does. What it prices later is what it prices at once, even once the model it was made from is gone:
    the table keeps a view of its own, and the model, which keeps its table, is freed as soon as it is
    let go (no reference cycle for the collector to find)."""
    pytest.importorskip("transformers")
    import gc
    import weakref

    import numpy as np

    import decoder_families as families
    from stagesplit import api
    from stagesplit.model.phases import PHASE_KINDS
    from stagesplit.solver.chunk_problem import chunk_memory
    from stagesplit.solver.schedule_generation import build_schedule
    profile = api.capture(families.capture_spec("llama"))
    bounds = (0, 2, 4, 6, 8)
    at_once = api.analyze(profile).model.phase_table
    eager = {kind: np.array(at_once.peaks[kind]) for kind in PHASE_KINDS}
    model = api.analyze(profile).model
    gone = weakref.ref(model)
    table = model.phase_table
    split = ("backward_input", "backward_weight")
    assert sorted(table.peaks.priced) == ["forward", "full_backward", "optimizer"]
    for schedule in (build_schedule("1f1b", 4, 4), build_schedule("interleaved-1f1b", 2, 4, 2)):
        chunk_memory(table, bounds, schedule)
    assert not set(split) & set(table.peaks.priced)
    gc.disable()
    try:
        del model
        assert gone() is None
    finally:
        gc.enable()
    zbv = chunk_memory(table, bounds, build_schedule("zbv", 2, 4, 2))
    assert set(table.peaks.priced) == set(PHASE_KINDS)
    for kind in PHASE_KINDS:
        assert np.array_equal(table.peaks[kind], eager[kind]), kind
    # B's own figure (priced with the stash held through B), not the whole backward's a 1F1B chunk stands for
    assert (zbv.backward_peak > 0).all() and not np.array_equal(eager["backward_input"], eager["full_backward"])
