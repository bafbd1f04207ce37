"""The exports carry the layout a plan was priced under (issue #32): the tensor-parallel degree of the
profile's rank (with or without sequence parallelism) and the data-parallel sharding of the request, in
each framework's own words, read back by its own parser or config class where it is installed:

* torchtitan: ``--parallelism.tensor_parallel_degree`` (and ``no-enable-sequence-parallel``, torchtitan's
  default being with), ``data_parallel_shard_degree`` with ``fsdp_reshard_after_forward`` (ZeRO 3) or
  ``data_parallel_replicate_degree`` (ZeRO 0): its ConfigManager;
* Megatron: ``--tensor-model-parallel-size`` (``--sequence-parallel``), ``--use-distributed-optimizer``
  (ZeRO 1), ``--use-torch-fsdp2`` (ZeRO 3): megatron-core's TransformerConfig for the degrees;
* DeepSpeed: ``ZERO_STAGE`` for ds_config's ``zero_optimization``: DeepSpeed's own ZeRO config class.

And each refuses, in one line, what its framework cannot run: ZeRO 2 (torchtitan, Megatron), tensor
parallelism and ZeRO 2/3 with a pipeline (DeepSpeed)."""

from __future__ import annotations

import json
import shlex

import pytest

from stagesplit.cli import main


def _plan(tmp_path, tp: int = 1, sp: bool = False, dp: int = 1, zero: int = 0, reshard: bool = True):
    """The shipped 7B per-layer profile's plan for 2 devices (1F1B, 4 micro-batches; it ties nothing), with
    the layout written in as a tensor-parallel capture and a data-parallel solve record it."""
    path = tmp_path / "plan.json"
    assert main(["solve", "profiles/llama-7b-layers.json", "--devices", "2", "--schedule", "1f1b",
                 "--micro-batches", "4", "--out", str(path)]) == 0
    document = json.loads(path.read_text())
    if tp > 1:
        document["profile"].update({"tensor_parallel": tp, "sequence_parallel": sp,
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


@pytest.mark.parametrize("tp, sp, dp, zero, reshard, words", [
    (2, False, 2, 3, True, ["--parallelism.tensor_parallel_degree", "2", "--parallelism.no-enable-sequence-parallel",
                            "--parallelism.data_parallel_shard_degree", "2",
                            "--parallelism.fsdp_reshard_after_forward", "always"]),
    (4, True, 1, 0, True, ["--parallelism.tensor_parallel_degree", "4"]),
    (1, False, 4, 0, True, ["--parallelism.data_parallel_replicate_degree", "4",
                            "--parallelism.data_parallel_shard_degree", "1"]),
    (1, False, 8, 3, False, ["--parallelism.data_parallel_shard_degree", "8",
                             "--parallelism.fsdp_reshard_after_forward", "never"]),
])
def test_torchtitan_words_carry_the_layout(capsys, tmp_path, tp, sp, dp, zero, reshard, words):
    text = _export(capsys, _plan(tmp_path, tp, sp, dp, zero, reshard), "torchtitan")
    line = _argument_line(text)
    assert line[:len(words)] == words and line[len(words)] == "--parallelism.pipeline_parallel_degree"


@pytest.mark.parametrize("tp, sp, dp, zero, words", [
    (2, True, 2, 1, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"]),
    (2, False, 4, 3, ["--tensor-model-parallel-size", "2", "--use-torch-fsdp2"]),
    (1, False, 4, 0, []),
])
def test_megatron_arguments_carry_the_layout(capsys, tmp_path, tp, sp, dp, zero, words):
    text = _export(capsys, _plan(tmp_path, tp, sp, dp, zero), "megatron")
    line = _argument_line(text)
    assert line[:len(words)] == words and line[len(words)] == "--num-layers"
    if tp > 1 or dp > 1:
        assert f"# launch 2 x {tp} x {dp} = {2 * tp * dp} processes (pipeline x tensor x data parallel)" in text


@pytest.mark.parametrize("dp, zero, stage", [(1, 0, 0), (4, 0, 0), (4, 1, 1)])
def test_deepspeed_zero_stage_carries_the_layout(capsys, tmp_path, dp, zero, stage):
    text = _export(capsys, _plan(tmp_path, dp=dp, zero=zero), "deepspeed")
    assert f"ZERO_STAGE = {stage}   #" in text


@pytest.mark.parametrize("fmt, layout, message", [
    ("torchtitan", dict(dp=2, zero=2), "torchtitan shards data parallelism with FSDP2 (ZeRO 3) or replicates it"),
    ("torchtitan", dict(dp=2, zero=1), "the plan was priced under ZeRO 1: solve it with ZeRO 3 or 0 for torchtitan"),
    ("megatron", dict(dp=2, zero=2), "the plan was priced under ZeRO 2: solve it with ZeRO 1 or 3 for Megatron"),
    ("megatron-uneven", dict(dp=2, zero=2), "the plan was priced under ZeRO 2: solve it with ZeRO 1 or 3"),
    ("deepspeed", dict(tp=2), "deepspeed: PipelineModule has no tensor parallelism of its own"),
    ("deepspeed", dict(dp=2, zero=3), "deepspeed refuses ZeRO 3 with pipeline parallelism"),
])
def test_what_a_framework_cannot_run_is_refused_in_one_line(capsys, tmp_path, fmt, layout, message):
    path = _plan(tmp_path, **layout)
    capsys.readouterr()
    out = tmp_path / "export.txt"
    assert main(["export", str(path), "--to", fmt, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_torchtitan_s_config_manager_reads_the_layout(monkeypatch, capsys, tmp_path):
    from test_export_torchtitan import torchtitan_config
    text = _export(capsys, _plan(tmp_path, tp=2, dp=2, zero=3, reshard=False), "torchtitan")
    words = [w for w in shlex.split(text, comments=True)]
    p = torchtitan_config(monkeypatch, words).parallelism
    assert (p.tensor_parallel_degree, p.enable_sequence_parallel, p.data_parallel_shard_degree,
            p.fsdp_reshard_after_forward, p.data_parallel_replicate_degree, p.pipeline_parallel_degree) == \
        (2, False, 2, "never", 1, 2)


@pytest.mark.filterwarnings("ignore")
def test_megatron_core_s_config_takes_the_degrees(capsys, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    line = _argument_line(_export(capsys, _plan(tmp_path, tp=2, sp=True, dp=2, zero=1), "megatron"))
    config = TransformerConfig(num_layers=int(line[line.index("--num-layers") + 1]), hidden_size=16,
                               num_attention_heads=2, pipeline_dtype=torch.float32, use_cpu_initialization=True,
                               tensor_model_parallel_size=int(line[line.index("--tensor-model-parallel-size") + 1]),
                               sequence_parallel="--sequence-parallel" in line,
                               pipeline_model_parallel_size=int(line[line.index("--pipeline-model-parallel-size") + 1]))
    assert (config.tensor_model_parallel_size, config.sequence_parallel, config.pipeline_model_parallel_size) == \
        (2, True, 2)


def test_deepspeed_s_zero_config_takes_the_stage(capsys, tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed here")
    import ast

    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    text = _export(capsys, _plan(tmp_path, dp=4, zero=1), "deepspeed")
    stage = next(node.value.value for node in ast.parse(text).body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "ZERO_STAGE")
    assert int(DeepSpeedZeroConfig(stage=stage).stage) == 1
