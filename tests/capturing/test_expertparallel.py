"""stagesplit capture --ep: one expert-parallel rank of a mixture-of-experts model, composed from rules
on the one-device record (capturing/expertparallel.py).

Qwen2-MoE and Mixtral from transformers' configs (the tests' decoder families, 2 blocks, bfloat16, 4
experts, top-2, hidden 64, batch 2 x 32): each rank's expert bytes and the tokens' exchanges computed
by hand; the degree refused in one line; a dense model refused; the layout's round trip; the command
line."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the mixture-of-experts models come from transformers' configs")

import decoder_families  # noqa: E402
from stagesplit.capturing.pytorch import capture_model  # noqa: E402
from stagesplit.cli import main  # noqa: E402
from stagesplit.errors import OptionError  # noqa: E402
from stagesplit.io import load_profile, save_profile  # noqa: E402
from stagesplit.io.profile import Collective, ParallelLayout  # noqa: E402
from stagesplit.reporting.layout import expert_parallel_line  # noqa: E402

BF16 = 2
E, K, H, T = 4, 2, 64, 2 * 32          # experts, top-k, hidden, tokens of the batch


def _model(family: str):
    cls, config = decoder_families._configs()[family]
    config.num_hidden_layers = 2
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        return cls(config).to(torch.bfloat16)


def _capture(family: str, ep: int):
    ids = torch.zeros(2, 32, dtype=torch.long, device="meta")
    return capture_model(_model(family), {"input_ids": ids, "labels": ids}, dtype="bfloat16", allocator_round=1,
                         ep=ep)


def _by_name(profile) -> dict[str, int]:
    v = profile.variables
    return {profile.variable_name(i): int(v.bytes[i]) for i in range(len(v))}


@pytest.mark.parametrize("family, expert_params", [
    # Qwen2-MoE: gate_up_proj (4, 2 x 64, 64) and down_proj (4, 64, 64)
    ("qwen2_moe", {"gate_up_proj": E * 128 * H * BF16, "down_proj": E * 64 * 64 * BF16}),
    # Mixtral: gate_up_proj (4, 2 x 128, 64) and down_proj (4, 64, 128)
    ("mixtral", {"gate_up_proj": E * 256 * H * BF16, "down_proj": E * 64 * 128 * BF16}),
])
@pytest.mark.parametrize("ep", [2, 4])
def test_rank_bytes_by_hand(family, expert_params, ep):
    """Each experts parameter, its gradient and both Adam moments are 1/N of the whole; the step
    counters, the router and (Qwen2-MoE) the shared expert stay whole; per experts module four
    exchanges of T x k x hidden bfloat16 bytes (dispatch and combine, forward and backward), each a
    receive buffer allocated beside its send."""
    one, rank = _by_name(_capture(family, 1)), _capture(family, ep)
    got = _by_name(rank)
    for layer in (0, 1):
        base = f"model.layers.{layer}.mlp.experts"
        for name, nbytes in expert_params.items():
            for suffix in ("", ".grad", ".exp_avg", ".exp_avg_sq"):
                assert one[f"{base}.{name}{suffix}"] == nbytes
                assert got[f"{base}.{name}{suffix}"] == nbytes // ep
            assert got[f"{base}.{name}.step"] == one[f"{base}.{name}.step"] == 4
        assert got[f"model.layers.{layer}.mlp.gate.weight"] == one[f"model.layers.{layer}.mlp.gate.weight"]
    if family == "qwen2_moe":
        assert got["model.layers.0.mlp.shared_expert.up_proj.weight"] == 64 * 64 * BF16
    exchange = T * K * H * BF16
    buffers = [n for n in got if "all_to_all_single:" in n]
    assert len(buffers) == 2 * 4 and all(got[n] == exchange for n in buffers)
    layout = rank.info.parallel_layout
    assert layout.expert_parallel == ep
    assert layout.experts == (("model.layers.0.mlp.experts", E), ("model.layers.1.mlp.experts", E))
    assert [(c.kind, c.bytes, c.group_size, c.group) for c in layout.collectives] == \
        [("all_to_all_single", exchange, ep, "ep")] * 8
    assert [c.phase for c in layout.collectives] == ["forward"] * 4 + ["backward"] * 4      # in step order
    v = rank.variables
    saved = 2 * sum(expert_params.values()) * 4 * (ep - 1) // ep
    live = int(v.bytes[v.always_live].sum())
    one_profile = _capture(family, 1).variables
    assert live == int(one_profile.bytes[one_profile.always_live].sum()) - saved


def test_degree_refused_in_one_line():
    with pytest.raises(OptionError) as caught:
        _capture("qwen2_moe", 3)
    assert str(caught.value) == "ep: model.layers.0.mlp.experts has 4 experts, not divisible by 3 expert-parallel ranks"


def test_a_dense_model_refused():
    import tp_harness
    with pytest.raises(OptionError) as caught:
        capture_model(tp_harness.build("llama", "meta"), tp_harness.inputs("llama", "meta"), ep=2)
    assert str(caught.value).startswith("ep: LlamaForCausalLM has no mixture-of-experts module")


@pytest.mark.parametrize("suffix", [".stagesplit", ".json"])
def test_layout_round_trip(tmp_path, suffix):
    profile = _capture("qwen2_moe", 2)
    path = tmp_path / f"rank{suffix}"
    save_profile(profile, path)
    assert load_profile(path).info.parallel_layout == profile.info.parallel_layout


def test_expert_parallel_line_by_hand():
    layout = ParallelLayout(collectives=(Collective(0, "all_to_all_single", 1024, 2, "forward", "ep"),
                                         Collective(1, "all_to_all_single", 1024, 2, "backward", "ep")),
                            expert_parallel=2, experts=(("a.experts", 8), ("b.experts", 8)))
    assert expert_parallel_line(layout) == ("rank 0 of 2 expert-parallel ranks: 4 of 8 experts in each of 2 experts "
                                            "modules; 2 all-to-alls per step, 2.0 KiB (composed from rules)")


def test_cli(tmp_path, capsys):
    out = tmp_path / "moe.stagesplit"
    spec = decoder_families.capture_spec("qwen2_moe")
    assert main(["capture", spec, "--ep", "2", "--dtype", "bfloat16", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert expert_parallel_line(load_profile(out).info.parallel_layout) in err
    bad = tmp_path / "bad.stagesplit"
    assert main(["capture", spec, "--ep", "3", "--dtype", "bfloat16", "-o", str(bad)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "stagesplit: error: --ep: model.layers.0.mlp.experts has 4 experts, not divisible by 3 expert-parallel ranks")
    assert not bad.exists()
