"""The exports carry the precision a plan was priced in, as a capture records it (a profile's
``precision``, a plan's ``profile.parameter_dtype``, ``autocast_dtype`` and ``master_weights``), in
each framework's own words, read back by its own parser or config class:

* Megatron: ``--bf16`` for bfloat16 parameters with float32 gradients and master weights, nothing for
  float32; autocast and bfloat16 without master weights are refused (Megatron has no mode for them);
* DeepSpeed: ``PRECISION_CONFIG``, the ds_config keys (``bf16``, with ``data_types.grad_accum_dtype``
  fp32 under ZeRO 1; ``torch_autocast``), read by DeepSpeed's own config functions;
* torchtitan: ``--training.dtype`` and FSDP2's ``mixed_precision_param``/``reduce``, read by its
  ConfigManager; mixed precision without FSDP2 (torchtitan would train it in float32) and float16 refused.

A profile without a recorded precision (every profile before it was recorded) exports as before."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest

from stagesplit.cli import main

PRECISIONS = {
    "float32": {"parameters": "float32"},
    "bfloat16": {"parameters": "bfloat16"},
    "master": {"parameters": "bfloat16", "master_weights": True},
    "master16": {"parameters": "float16", "master_weights": True},
    "amp": {"parameters": "float32", "autocast": "bfloat16"},
}


def _plan(tmp_path: Path, precision: str | None, dp: int = 1, zero: int = 0) -> Path:
    """The shipped 7B per-layer profile with ``precision`` recorded, its 1F1B plan for 2 devices, and the
    data-parallel layout written into the plan's request."""
    document = json.loads(Path("profiles/llama-7b-layers.json").read_text())
    if precision is not None:
        document["precision"] = PRECISIONS[precision]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(document))
    path = tmp_path / "plan.json"
    assert main(["solve", str(profile), "--devices", "2", "--schedule", "1f1b", "--micro-batches", "4",
                 "--out", str(path)]) == 0
    plan = json.loads(path.read_text())
    plan["request"].update({"dp": dp, "zero": zero})
    path.write_text(json.dumps(plan))
    return path


def _export(capsys, path: Path, fmt: str) -> str:
    capsys.readouterr()
    assert main(["export", str(path), "--to", fmt]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _refused(capsys, tmp_path: Path, path: Path, fmt: str) -> str:
    capsys.readouterr()
    out = tmp_path / "export.txt"
    assert main(["export", str(path), "--to", fmt, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists(), err
    return err


def _argument_line(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1
    return shlex.split(lines[0])


def test_the_plan_file_records_the_profile_s_precision(capsys, tmp_path):
    """Written only where the profile records it, read back as written; none where it records none."""
    recorded = json.loads(_plan(tmp_path, "master").read_text())["profile"]
    assert (recorded["parameter_dtype"], recorded["master_weights"]) == ("bfloat16", True)
    assert "autocast_dtype" not in recorded
    amp = json.loads(_plan(tmp_path, "amp").read_text())["profile"]
    assert (amp["parameter_dtype"], amp["autocast_dtype"]) == ("float32", "bfloat16") and "master_weights" not in amp
    bare = json.loads(_plan(tmp_path, None).read_text())["profile"]
    assert not {"parameter_dtype", "autocast_dtype", "master_weights"} & set(bare)


@pytest.mark.parametrize("precision, flags", [("master", ["--bf16"]), ("master16", ["--fp16"]), ("float32", []),
                                              (None, [])])
def test_megatron_takes_master_weights_as_its_bf16(capsys, tmp_path, precision, flags):
    for fmt in ("megatron", "megatron-uneven"):
        line = _argument_line(_export(capsys, _plan(tmp_path, precision, dp=2, zero=1), fmt))
        assert line[:1 + len(flags)] == ["--use-distributed-optimizer", *flags]
        assert line[1 + len(flags)] == "--num-layers"


@pytest.mark.filterwarnings("ignore")
def test_megatron_core_s_config_takes_the_precision(capsys, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    line = _argument_line(_export(capsys, _plan(tmp_path, "master"), "megatron"))
    config = TransformerConfig(num_layers=int(line[line.index("--num-layers") + 1]), hidden_size=16,
                               num_attention_heads=2, use_cpu_initialization=True,
                               pipeline_model_parallel_size=int(line[line.index("--pipeline-model-parallel-size") + 1]),
                               pipeline_dtype=torch.bfloat16, bf16="--bf16" in line, fp16="--fp16" in line)
    assert (config.bf16, config.fp16) == (True, False)


@pytest.mark.parametrize("fmt", ["megatron", "megatron-uneven"])
@pytest.mark.parametrize("precision, words", [("amp", "amp (bfloat16 autocast, float32 parameters)"),
                                              ("bfloat16", "in bfloat16, which Megatron has no mode for")])
def test_megatron_refuses_a_precision_it_has_no_mode_for(capsys, tmp_path, fmt, precision, words):
    err = _refused(capsys, tmp_path, _plan(tmp_path, precision), fmt)
    assert words in err and "capture with `master_weights` to price Megatron's --bf16" in err


def _deepspeed_config(text: str):
    tree = ast.parse(text)
    found = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
             and getattr(node.targets[0], "id", None) == "PRECISION_CONFIG"]
    return found[0] if found else None


@pytest.mark.parametrize("precision, dp, zero, config", [
    ("master", 1, 0, {"bf16": {"enabled": True}}),
    ("master", 4, 1, {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}),
    ("master16", 1, 0, {"fp16": {"enabled": True}}),
    ("amp", 1, 0, {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}),
    ("float32", 1, 0, {}),
    (None, 1, 0, None),
])
def test_deepspeed_config_carries_the_precision(capsys, tmp_path, precision, dp, zero, config):
    text = _export(capsys, _plan(tmp_path, precision, dp, zero), "deepspeed")
    assert _deepspeed_config(text) == config
    if precision == "master":
        assert "the keys that run the plan's precision, bfloat16 parameters with float32 gradients and master " \
            "weights" in text


def test_deepspeed_s_own_config_reads_the_precision(capsys, tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed here")
    import torch
    from deepspeed.runtime.config import get_data_types_params, get_torch_autocast_dtype, get_torch_autocast_enabled
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
    master = _deepspeed_config(_export(capsys, _plan(tmp_path, "master", dp=4, zero=1), "deepspeed"))
    assert get_bfloat16_config(master).enabled and not get_float16_config(master).enabled
    assert get_data_types_params(master) == {"grad_accum_dtype": "fp32"}
    amp = _deepspeed_config(_export(capsys, _plan(tmp_path, "amp"), "deepspeed"))
    assert get_torch_autocast_enabled(amp) and get_torch_autocast_dtype(amp) == torch.bfloat16
    assert not get_bfloat16_config(amp).enabled


def test_deepspeed_refuses_bfloat16_without_master_weights(capsys, tmp_path):
    err = _refused(capsys, tmp_path, _plan(tmp_path, "bfloat16"), "deepspeed")
    assert "priced in bfloat16, which DeepSpeed has no mode for" in err


_DTYPE, _PARAM, _REDUCE = "--training.dtype", "--training.mixed_precision_param", "--training.mixed_precision_reduce"


@pytest.mark.parametrize("precision, dp, zero, words", [
    ("float32", 1, 0, [_DTYPE, "float32", _PARAM, "float32"]),
    ("bfloat16", 2, 0, [_DTYPE, "bfloat16"]),
    ("master", 4, 3, [_DTYPE, "float32", _PARAM, "bfloat16", _REDUCE, "float32"]),
    ("amp", 2, 3, [_DTYPE, "float32", _PARAM, "bfloat16", _REDUCE, "float32"]),
    (None, 1, 0, []),
])
def test_torchtitan_words_carry_the_precision(capsys, tmp_path, precision, dp, zero, words):
    text = _export(capsys, _plan(tmp_path, precision, dp, zero), "torchtitan")
    line = _argument_line(text)
    at = line.index("--parallelism.pipeline_parallel_degree")
    assert line[at - len(words):at] == words
    assert not {_DTYPE, _PARAM, _REDUCE} & set(line[:at - len(words)] + line[at:])
    if precision == "master":        # priced as FSDP2's mixed precision: nothing to say
        assert "FSDP2" not in text
    if precision == "amp":
        assert "the plan counted autocast's bfloat16 weight copies kept for the backward, more than runs" in text


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_torchtitan_s_config_manager_reads_the_precision(monkeypatch, capsys, tmp_path):
    from test_export_torchtitan import torchtitan_config
    for precision, dp, zero, expected in (("master", 2, 3, ("float32", "bfloat16", "float32")),
                                          ("bfloat16", 1, 0, ("bfloat16", "bfloat16", "float32")),
                                          ("float32", 1, 0, ("float32", "float32", "float32"))):
        words = shlex.split(_export(capsys, _plan(tmp_path, precision, dp, zero), "torchtitan"), comments=True)
        training = torchtitan_config(monkeypatch, words).training
        assert (training.dtype, training.mixed_precision_param, training.mixed_precision_reduce) == expected


@pytest.mark.parametrize("precision, dp, zero, words", [
    ("master", 1, 0, "priced in bfloat16 parameters with float32 gradients and master weights without FSDP2: it "
                     "would train in float32"),
    ("amp", 2, 0, "priced in amp (bfloat16 autocast, float32 parameters) without FSDP2"),
    ("master16", 2, 3, "torchtitan trains in bfloat16 or float32"),
])
def test_torchtitan_refuses_mixed_precision_it_would_not_run(capsys, tmp_path, precision, dp, zero, words):
    assert words in _refused(capsys, tmp_path, _plan(tmp_path, precision, dp, zero), "torchtitan")


@pytest.mark.parametrize("field, value, expected", [
    ("parameters", "int8", "one of float32, bfloat16, float16"),
    ("autocast", "float32", "one of"),
    ("master_weights", "yes", "true or false"),
])
def test_a_bad_precision_in_a_profile_is_one_line(capsys, tmp_path, field, value, expected):
    document = json.loads(Path("profiles/llama-7b-layers.json").read_text())
    document["precision"] = {"parameters": "bfloat16", field: value}
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(document))
    out = tmp_path / "plan.json"
    capsys.readouterr()
    assert main(["solve", str(profile), "--devices", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"precision.{field}" in err and expected in err and str(profile) in err, err
    assert not out.exists()


def test_master_weights_on_float32_parameters_are_refused(capsys, tmp_path):
    document = json.loads(Path("profiles/llama-7b-layers.json").read_text())
    document["precision"] = {"parameters": "float32", "master_weights": True}
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(document))
    capsys.readouterr()
    assert main(["solve", str(profile), "--devices", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "precision.master_weights" in err and "false with float32 parameters or autocast" in err, err


@pytest.mark.parametrize("field, value, expected", [
    ("parameter_dtype", "int8", "profile.parameter_dtype"),
    ("master_weights", 1, "profile.master_weights"),
    ("autocast_dtype", "bfloat16", "profile.parameter_dtype"),
])
def test_a_bad_precision_in_a_plan_file_is_one_line(capsys, tmp_path, field, value, expected):
    path = _plan(tmp_path, None)
    plan = json.loads(path.read_text())
    plan["profile"][field] = value
    path.write_text(json.dumps(plan))
    err = _refused(capsys, tmp_path, path, "megatron")
    assert expected in err and str(path) in err, err


@pytest.mark.parametrize("precision, constants", [
    ("master", ["PARAMETER_DTYPE = torch.bfloat16", "MASTER_WEIGHTS = True"]),
    ("amp", ["PARAMETER_DTYPE = torch.float32", "AUTOCAST_DTYPE = torch.bfloat16"]),
    ("bfloat16", ["PARAMETER_DTYPE = torch.bfloat16"]),
    ("float32", []),
    (None, []),
])
def test_the_torch_program_sets_the_precision(capsys, tmp_path, precision, constants):
    """The constants, the helpers that use them, and the step the usage lines give (run for real by
    test_export_hf_pipelines.py's test_exported_precisions_run_as_priced)."""
    path = _plan(tmp_path, precision)
    plan = json.loads(path.read_text())          # the module paths a capture records (model.layers.K)
    plan["module_paths"] = [f"model.{name}" for name in plan["layers"]]
    path.write_text(json.dumps(plan))
    text = _export(capsys, path, "torch-pipelining")
    tree = ast.parse(text)
    assigned = {node.targets[0].id: ast.unparse(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)}
    written = [f"{k} = {v}" for k, v in assigned.items() if k in ("PARAMETER_DTYPE", "AUTOCAST_DTYPE", "MASTER_WEIGHTS")]
    assert written == constants
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert ({"master_weights", "copy_masters"} <= functions) == (precision == "master")
    assert ("autocast_forwards" in functions) == (precision == "amp")
    assert ("    model.to(PARAMETER_DTYPE)   # the parameters in the precision the plan was priced in" in text) == \
        bool(constants)
    if constants:                     # the comment names the plan's precision, as the profile describes it
        described = {"master": "bfloat16 parameters with float32 gradients and master weights",
                     "amp": "amp (bfloat16 autocast, float32 parameters)", "bfloat16": "bfloat16"}[precision]
        assert f"{constants[0]}   # the precision the plan was priced in, {described}: build_pipeline casts" in text
    if precision == "master":
        assert "#   pairs = master_weights([stage])" in text and "optimizer.step(); copy_masters(pairs)" in text
    else:
        assert "optimizer.zero_grad(set_to_none=GRADIENTS_SET_TO_NONE)" in text and "main_grad" not in text


@pytest.mark.parametrize("fmt", ["json", "megatron", "torchtitan", "deepspeed"])
def test_every_export_s_header_names_the_precision(capsys, tmp_path, fmt):
    text = _export(capsys, _plan(tmp_path, "master", dp=2, zero=3 if fmt == "torchtitan" else 1), fmt)
    assert "precision: bfloat16 parameters with float32 gradients and master weights, as captured and priced" in text
    assert "precision:" not in _export(capsys, _plan(tmp_path, None), fmt)
