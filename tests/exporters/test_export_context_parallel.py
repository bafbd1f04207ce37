"""The exports carry context parallelism (issue #32): a plan whose profile is one rank of CP ranks
(``profile.context_parallel``), its request's data-parallel ranks being those its gradients are shared
over (data x context parallel, as Megatron and torchtitan shard them), in each framework's words and
read back by its own config classes:

* torchtitan: ``--parallelism.context_parallel_degree C`` with ``data_parallel_shard_degree`` D / C and
  the plan's resharding (torchtitan runs FSDP2 over ``dp_shard x cp`` whenever CP is on: ZeRO 3 only);
* Megatron: ``--context-parallel-size C``; its data-parallel size is the world size over TP x PP x CP.

And expert parallelism (``profile.expert_parallel``: ranks taken from the data x context ranks): Megatron's
``--expert-model-parallel-size``, torchtitan's ``--parallelism.expert_parallel_degree`` (ZeRO 3 only: torchtitan
borrows them from its FSDP2 shards)."""

from __future__ import annotations

import json
import shlex

import pytest

from stagesplit.cli import main


def _plan(tmp_path, cp: int = 2, dp: int = 4, zero: int = 3, tp: int = 1, reshard: bool = True):
    path = tmp_path / "plan.json"
    assert main(["solve", "profiles/llama-7b-layers.json", "--devices", "2", "--schedule", "1f1b",
                 "--micro-batches", "4", "--out", str(path)]) == 0
    document = json.loads(path.read_text())
    document["profile"]["context_parallel"] = cp
    if tp > 1:
        document["profile"].update({"tensor_parallel": tp, "sequence_parallel": True,
                                    "tensor_parallel_styles": [["h.0.mlp.fc", "colwise"]]})
    document["request"].update({"dp": dp, "zero": zero, "reshard_after_forward": reshard})
    path.write_text(json.dumps(document))
    return path


def _export(capsys, path, fmt) -> str:
    capsys.readouterr()
    assert main(["export", str(path), "--to", fmt]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _argument_line(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1
    return shlex.split(lines[0])


@pytest.mark.parametrize("cp, dp, reshard, words", [
    (2, 4, True, ["--parallelism.context_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "2",
                  "--parallelism.fsdp_reshard_after_forward", "always"]),
    (4, 4, False, ["--parallelism.context_parallel_degree", "4", "--parallelism.data_parallel_shard_degree", "1",
                   "--parallelism.fsdp_reshard_after_forward", "never"]),
])
def test_torchtitan_words_carry_context_parallelism(capsys, tmp_path, cp, dp, reshard, words):
    line = _argument_line(_export(capsys, _plan(tmp_path, cp, dp, 3, reshard=reshard), "torchtitan"))
    assert line[:len(words)] == words and line[len(words)] == "--parallelism.pipeline_parallel_degree"


def test_megatron_arguments_carry_context_parallelism(capsys, tmp_path):
    text = _export(capsys, _plan(tmp_path, cp=2, dp=4, zero=1, tp=2), "megatron")
    line = _argument_line(text)
    words = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--context-parallel-size", "2",
             "--use-distributed-optimizer"]
    assert line[:len(words)] == words and line[len(words)] == "--num-layers"
    assert ("# launch 2 x 2 x 2 x 2 = 16 processes (pipeline x tensor x context x data parallel): Megatron's "
            "data-parallel size is the world size over TP x PP x CP") in text


def test_torchtitan_refuses_context_parallelism_without_fsdp(capsys, tmp_path):
    path = _plan(tmp_path, cp=2, dp=2, zero=0)
    capsys.readouterr()
    assert main(["export", str(path), "--to", "torchtitan"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert ("torchtitan shards the parameters over the context-parallel ranks (FSDP2 over data x context parallel); "
            "the plan was priced under ZeRO 0: solve it with ZeRO 3 for torchtitan") in err


def test_plan_file_round_trip(tmp_path):
    """Read and written again, the degree stays; a plan without context parallelism writes no key."""
    from stagesplit.plan.files import read_plan, write_plan
    plan = read_plan(_plan(tmp_path, cp=4))
    assert plan.profile.context_parallel == 4
    again = tmp_path / "again.json"
    write_plan(plan, again)
    assert json.loads(again.read_text())["profile"]["context_parallel"] == 4
    assert read_plan(again).profile.context_parallel == 4
    document = json.loads(again.read_text())
    del document["profile"]["context_parallel"]
    again.write_text(json.dumps(document))
    write_plan(read_plan(again), again)
    assert "context_parallel" not in json.loads(again.read_text())["profile"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_torchtitan_s_config_manager_reads_context_parallelism(monkeypatch, capsys, tmp_path):
    from test_export_torchtitan import torchtitan_config
    text = _export(capsys, _plan(tmp_path, cp=2, dp=4, zero=3), "torchtitan")
    words = shlex.split(text, comments=True)
    p = torchtitan_config(monkeypatch, words).parallelism
    assert (p.context_parallel_degree, p.data_parallel_shard_degree, p.fsdp_reshard_after_forward,
            p.pipeline_parallel_degree) == (2, 2, "always", 2)


@pytest.mark.filterwarnings("ignore")
def test_megatron_core_s_config_takes_context_parallelism(capsys, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    line = _argument_line(_export(capsys, _plan(tmp_path, cp=2, dp=4, zero=1, tp=2), "megatron"))
    config = TransformerConfig(num_layers=int(line[line.index("--num-layers") + 1]), hidden_size=16,
                               num_attention_heads=2, pipeline_dtype=torch.float32, use_cpu_initialization=True,
                               tensor_model_parallel_size=int(line[line.index("--tensor-model-parallel-size") + 1]),
                               context_parallel_size=int(line[line.index("--context-parallel-size") + 1]),
                               sequence_parallel="--sequence-parallel" in line,
                               pipeline_model_parallel_size=int(line[line.index("--pipeline-model-parallel-size") + 1]))
    assert (config.tensor_model_parallel_size, config.context_parallel_size, config.pipeline_model_parallel_size) == \
        (2, 2, 2)


# ---- expert parallelism: --expert-model-parallel-size, --parallelism.expert_parallel_degree --------------


def _ep_plan(tmp_path, ep: int = 2, dp: int = 4, zero: int = 0):
    path = _plan(tmp_path, cp=1, dp=dp, zero=zero)
    document = json.loads(path.read_text())
    document["profile"]["expert_parallel"] = ep
    path.write_text(json.dumps(document))
    return path


def test_megatron_arguments_carry_expert_parallelism(capsys, tmp_path):
    """Megatron carves its expert groups from the data-parallel ranks: the launch is still pipeline x
    tensor x data."""
    text = _export(capsys, _ep_plan(tmp_path, ep=2, dp=4, zero=1), "megatron")
    line = _argument_line(text)
    words = ["--expert-model-parallel-size", "2", "--use-distributed-optimizer"]
    assert line[:len(words)] == words and line[len(words)] == "--num-layers"
    assert "# launch 2 x 1 x 4 = 8 processes (pipeline x tensor x data parallel)" in text


def test_torchtitan_words_carry_expert_parallelism(capsys, tmp_path):
    line = _argument_line(_export(capsys, _ep_plan(tmp_path, ep=2, dp=4, zero=3), "torchtitan"))
    words = ["--parallelism.data_parallel_shard_degree", "4", "--parallelism.fsdp_reshard_after_forward", "always",
             "--parallelism.expert_parallel_degree", "2"]
    assert line[:len(words)] == words and line[len(words)] == "--parallelism.pipeline_parallel_degree"


def test_torchtitan_refuses_expert_parallelism_without_fsdp(capsys, tmp_path):
    path = _ep_plan(tmp_path, ep=2, dp=4, zero=0)
    capsys.readouterr()
    assert main(["export", str(path), "--to", "torchtitan"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "torchtitan takes its expert-parallel ranks from its FSDP2 shards" in err


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_torchtitan_s_config_manager_reads_expert_parallelism(monkeypatch, capsys, tmp_path):
    from test_export_torchtitan import torchtitan_config
    words = shlex.split(_export(capsys, _ep_plan(tmp_path, ep=2, dp=4, zero=3), "torchtitan"), comments=True)
    p = torchtitan_config(monkeypatch, words).parallelism
    assert (p.expert_parallel_degree, p.data_parallel_shard_degree, p.pipeline_parallel_degree) == (2, 4, 2)


@pytest.mark.filterwarnings("ignore")
def test_megatron_core_s_config_takes_expert_parallelism(capsys, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    line = _argument_line(_export(capsys, _ep_plan(tmp_path, ep=2, dp=4, zero=1), "megatron"))
    config = TransformerConfig(num_layers=int(line[line.index("--num-layers") + 1]), hidden_size=16,
                               num_attention_heads=2, pipeline_dtype=torch.float32, use_cpu_initialization=True,
                               num_moe_experts=4,
                               expert_model_parallel_size=int(line[line.index("--expert-model-parallel-size") + 1]),
                               pipeline_model_parallel_size=int(line[line.index("--pipeline-model-parallel-size") + 1]))
    assert (config.expert_model_parallel_size, config.pipeline_model_parallel_size) == (2, 2)
