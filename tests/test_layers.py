"""Layer grouping: every rule of layers.py on hand-made operations, the default regexes on real
naming schemes, layer order, warnings and bad options."""

import re

import pytest

from helpers import load_sample
from stagesplit.cli.naming import error_text, flags_in
from stagesplit.errors import StagesplitError
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.profile import Target
from stagesplit.layers import (
    DEFAULT_FIRST_LAYER_REGEX,
    DEFAULT_LAST_LAYER_REGEX,
    DEFAULT_LAYER_REGEX,
    LayerOptions,
    Rule,
    group_layers,
)


def profile(*ops, steps=None):
    """Operations as names or (name, inputs[, layer[, first_step]]) tuples; one step each by default."""
    b = ProfileBuilder(Target("t", 1, 1000), max([len(ops), 1] + [s + 1 for s in steps or []]))
    for i, op in enumerate(ops):
        op = (op,) if isinstance(op, str) else op
        name, inputs = op[0], (op[1] if len(op) > 1 else ())
        layer = op[2] if len(op) > 2 else None
        step = op[3] if len(op) > 3 else (i if steps is None else steps[i])
        b.operation(name, step, step, inputs=inputs, layer=layer)
    return b.build()


def group(*ops, **options):
    return group_layers(profile(*ops), LayerOptions(**options))


def assigned(la):
    """(layer name or None, rule) for every operation."""
    return [(la.names[l] if l >= 0 else None, Rule(r)) for l, r in zip(la.op_layer.tolist(), la.op_rule.tolist())]


# --------------------------------------------------------------------------------------------------
# The rules, one by one

def test_explicit_layer_wins_over_the_name():
    la = group(("layer7/x", (), "enc"), "layer1/y")
    assert assigned(la) == [("enc", Rule.EXPLICIT), ("1", Rule.NAME)]


def test_layer_from_the_name():
    la = group("bert/encoder/layer3/attention", "bert/encoder/layer4/output")
    assert assigned(la) == [("3", Rule.NAME), ("4", Rule.NAME)]
    assert la.names == ["3", "4"]


def test_layer_from_inputs_with_exactly_one_layer():
    la = group("layer1/a", ("Add", ("layer2/out", "layer2/bias", "x")), "layer3/b")
    assert assigned(la) == [("1", Rule.NAME), ("2", Rule.INPUTS), ("3", Rule.NAME)]


def test_inputs_from_several_layers_give_no_layer():
    la = group("layer1/a", ("Add", ("layer1/out", "layer2/out")), "layer2/b")
    assert assigned(la) == [("1", Rule.NAME), (None, Rule.MULTIPLE_INPUT_LAYERS), ("2", Rule.NAME)]
    assert la.warnings == []                 # not a call: no outliner warning
    assert la.calls_with_multiple_input_layers(profile("layer1/a", ("Add", ("layer1/out", "layer2/out")),
                                                       "layer2/b")) == []


def test_call_with_inputs_from_several_layers_warns_about_the_outliner():
    p = profile("layer1/a", ("call_7", ("layer1/out", "layer2/out")), "layer2/b")
    la = group_layers(p)
    assert assigned(la) == [("1", Rule.NAME), (None, Rule.MULTIPLE_INPUT_LAYERS), ("2", Rule.NAME)]
    assert la.calls_with_multiple_input_layers(p) == [1]
    assert len(la.warnings) == 1
    assert "outlining has merged layers" in la.warnings[0]
    assert f"POPART_POPLINER_OUTLINER_REGEX='{DEFAULT_LAYER_REGEX}'" in la.warnings[0]


def test_call_joins_the_following_layer():
    la = group("layer1/a", "call", "layer2/b")
    assert assigned(la) == [("1", Rule.NAME), ("2", Rule.FOLLOWING_CALL), ("2", Rule.NAME)]


def test_chain_of_calls_and_anonymous_ops_join_the_following_layer():
    la = group("layer1/a", "call_1", "", "Function(sub)", "layer2/b")
    assert assigned(la) == [("1", Rule.NAME)] + [("2", Rule.FOLLOWING_CALL)] * 3 + [("2", Rule.NAME)]


def test_call_before_an_embedding_op_joins_the_first_layer():
    la = group("call", "embeddings/Gather", "layer1/a", "layer2/b")
    assert assigned(la) == [("1", Rule.FIRST_LAYER), ("1", Rule.FIRST_LAYER), ("1", Rule.NAME), ("2", Rule.NAME)]


def test_call_before_the_head_joins_the_last_layer():
    la = group("layer1/a", "layer2/b", "call", "cls/predictions")
    assert assigned(la)[2:] == [("2", Rule.LAST_LAYER), ("2", Rule.LAST_LAYER)]


def test_trailing_call_and_call_before_an_unlayered_op_get_no_layer():
    la = group("layer1/a", "call", "optimizer/step", "function")
    assert assigned(la) == [("1", Rule.NAME), (None, Rule.NO_LAYER), (None, Rule.NO_LAYER), (None, Rule.NO_LAYER)]


def test_call_with_layered_input_takes_the_input_layer():
    la = group("layer1/a", ("call", ("layer1/out",)), "layer2/b")
    assert assigned(la)[1] == ("1", Rule.INPUTS)


def test_first_layer_rule_by_name_and_by_inputs():
    la = group("wte", ("Gather", ("embeddings.word.weight",)), "stem/conv", "layer1/a", "layer2/b")
    assert assigned(la) == [("1", Rule.FIRST_LAYER)] * 3 + [("1", Rule.NAME), ("2", Rule.NAME)]


def test_last_layer_rule_by_name_and_by_inputs():
    la = group("layer1/a", "layer2/b", "lm_head/MatMul", ("Softmax", ("logits",)), "loss")
    assert assigned(la) == [("1", Rule.NAME), ("2", Rule.NAME)] + [("2", Rule.LAST_LAYER)] * 3


def test_last_layer_name_beats_first_layer_input():
    """A tied head reads the embedding matrix but still goes last; an op named like an embedding
    that reads the logits still goes first."""
    la = group(("embed/Gather", ("logits",)), "layer1/a", "layer2/b",
               ("head/decoder", ("bert.embeddings.word.weight",)))
    assert assigned(la) == [("1", Rule.FIRST_LAYER), ("1", Rule.NAME), ("2", Rule.NAME), ("2", Rule.LAST_LAYER)]


def test_operation_matching_nothing_has_no_layer():
    la = group("layer1/a", ("optimizer/update", ("lr",)), "layer2/b")
    assert assigned(la)[1] == (None, Rule.NO_LAYER)
    assert la.ops_in(0).tolist() == [0] and la.ops_in(1).tolist() == [2]


def test_name_with_two_layers_falls_back_to_inputs():
    la = group("layer1/a", ("layer1/layer2/mix", ("layer2/out",)), "layer2/b")
    assert assigned(la)[1] == ("2", Rule.INPUTS)


def test_rule_labels():
    assert Rule.FOLLOWING_CALL.label == "following call"
    assert Rule.MULTIPLE_INPUT_LAYERS.label == "multiple input layers"


# --------------------------------------------------------------------------------------------------
# The default regexes on real naming schemes

@pytest.mark.parametrize("name, layer", [
    ("layer3", "3"), ("Layer/3", "3"), ("blocks_3", "3"), ("encoder.3", "3"), ("bert/encoder/layer_3/x", "3"),
    ("model.layers.12.mlp", "12"), ("transformer.h.3.attn", "3"), ("decoder-5/ffn", "5"), ("BLOCK:9", "9"),
    ("transformer/h.15/attn/c_attn", "15"), ("bert.encoder.layer.11.output.dense.weight", "11"),
    ("model.decoder.layers.0.self_attn", "0"), ("Encoder 2/layer_7/attention", "7"),
])
def test_default_layer_regex(name, layer):
    la = group(name)
    assert assigned(la) == [(layer, Rule.NAME)]


@pytest.mark.parametrize("name", ["graph.3", "player3", "conv2d_1", "hidden/12", "Shape", "layer/x"])
def test_default_layer_regex_ignores(name):
    assert not re.findall(DEFAULT_LAYER_REGEX, name)


@pytest.mark.parametrize("name", ["bert/embeddings/LayerNorm", "transformer/wte", "wpe", "stem", "Embedding_0"])
def test_default_first_layer_regex(name):
    assert re.search(DEFAULT_FIRST_LAYER_REGEX, name)


@pytest.mark.parametrize("name", ["head", "lm_head", "classifier/fc", "bert/pooler", "loss", "logits", "cls/pred"])
def test_default_last_layer_regex(name):
    assert re.search(DEFAULT_LAST_LAYER_REGEX, name)


@pytest.mark.parametrize("name", ["headroom", "stem_cell_loss_scale", "reclassify", "clsx"])
def test_first_and_last_regexes_need_whole_words(name):
    assert not re.search(DEFAULT_LAST_LAYER_REGEX, name)
    assert not re.search(DEFAULT_FIRST_LAYER_REGEX, name)


def test_samples_group_as_documented():
    bert = group_layers(load_sample("bert-base"))
    assert bert.names == [str(i) for i in range(12)]
    ops = load_sample("bert-base").operations
    first = ops.name.index("bert/embeddings/word_embeddings/Gather")
    head = ops.name.index("cls/predictions/decoder/MatMul")
    assert (bert.op_layer[first], Rule(bert.op_rule[first])) == (0, Rule.FIRST_LAYER)
    assert (bert.op_layer[head], Rule(bert.op_rule[head])) == (11, Rule.LAST_LAYER)
    assert bert.op_layer[ops.name.index("host/StreamCopy")] == -1
    gpt = group_layers(load_sample("gpt"))
    assert gpt.names == [str(i) for i in range(16)]
    cnn = group_layers(load_sample("cnn"))
    assert cnn.names == [str(i) for i in range(26)]


# --------------------------------------------------------------------------------------------------
# Order, capture groups, warnings, bad options

def test_layer_order_by_steps_or_natural():
    ops = [("layer10/x", (), None, 0), ("layer9/x", (), None, 1), ("layer2/x", (), None, 2)]
    assert group(*ops).names == ["10", "9", "2"]
    assert group(*ops, order="natural").names == ["2", "9", "10"]


def test_steps_order_uses_first_step_not_list_position():
    la = group_layers(profile("layer1/a", "layer2/b", "layer1/c", steps=[5, 1, 0]))
    assert la.names == ["1", "2"]           # layer1 runs first (step 0), though listed first anyway
    la = group_layers(profile("layer1/a", "layer2/b", steps=[5, 1]))
    assert la.names == ["2", "1"]
    assert la.op_layer.tolist() == [1, 0]


def test_natural_order_sorts_mixed_names():
    la = group("enc_b2", "enc_a10", "enc_a2", layer_regex=r"enc_(\w+)", order="natural")
    assert la.names == ["a2", "a10", "b2"]


def test_several_capture_groups_are_joined():
    la = group("a1/x", "b2/y", "a1/z", layer_regex=r"([a-z])(\d)/")
    assert la.names == ["a1", "b2"]
    assert la.op_layer.tolist() == [0, 1, 0]


def test_regex_without_groups_uses_the_whole_match():
    la = group("stage_A/x", "stage_B/y", layer_regex=r"stage_[A-Z]")
    assert la.names == ["stage_A", "stage_B"]


def test_optional_group_that_did_not_match_is_ignored():
    la = group("blk/x", "blk3/y", layer_regex=r"blk(\d)?/")
    assert assigned(la) == [(None, Rule.NO_LAYER), ("3", Rule.NAME)]


def test_low_share_warning_names_the_option():
    la = group("layer1/a", "optimizer/a", "optimizer/b", "optimizer/c")
    assert la.share_assigned == 0.25
    assert len(la.warnings) == 1
    assert "only 25% of operations got a layer" in la.warnings[0]
    assert f"`layer_regex` ('{DEFAULT_LAYER_REGEX}')" in la.warnings[0]
    assert f"--layer-regex ('{DEFAULT_LAYER_REGEX}')" in flags_in(la.warnings[0])


def test_half_the_operations_is_enough():
    la = group("layer1/a", "optimizer/a")
    assert la.share_assigned == 0.5 and la.warnings == []


@pytest.mark.parametrize("option, flag", [("layer_regex", "--layer-regex"),
                                          ("first_layer_regex", "--first-layer-regex"),
                                          ("last_layer_regex", "--last-layer-regex"), ("call_regex", "--call-regex")])
def test_invalid_regex(option, flag):
    with pytest.raises(StagesplitError) as excinfo:
        group("layer1/a", **{option: "(unclosed"})
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"invalid {option} '(unclosed': missing )")       # the Python API's name
    assert error_text(excinfo.value).startswith(f"invalid {flag} '(unclosed': missing )")   # the command line's


def test_regex_that_matches_nothing():
    with pytest.raises(StagesplitError) as excinfo:
        group("conv/a", "relu/b", ("add", ("conv/out",)), layer_regex=r"stage(\d+)")
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith("the layer regex 'stage(\\d+)' matched no operation or input name")
    assert "'conv/a', 'relu/b', 'add'" in message and "--layer-regex" in flags_in(message)


def test_names_with_newlines_keep_the_message_on_one_line():
    with pytest.raises(StagesplitError) as excinfo:
        group("line\nbreak", layer_regex=r"stage(\d+)")
    assert "\n" not in str(excinfo.value)


def test_bad_order():
    with pytest.raises(StagesplitError) as excinfo:
        group("layer1/a", order="alphabetical")
    assert str(excinfo.value) == "layer_order: expected one of steps, natural, got 'alphabetical'"


# --------------------------------------------------------------------------------------------------
# A grouping recorded in the profile (captures record theirs)

def recorded(grouping_regex=r"^((?:enc|dec)\.block\.\d+)[./]", paths=None):
    """Encoder and decoder blocks named by path; the final norm carries its layer explicitly (as
    a capture stores the ones its regexes do not place) and is named after no block."""
    from stagesplit.io.profile import LayerGrouping
    p = profile("enc.block.0.attn/mm", "enc.block.1.attn/mm", ("final_norm/mul", (), "enc.block.1"),
                "dec.block.0.attn/mm", "dec.block.1.attn/mm", "lm_head/mm")
    layers = ("enc.block.0", "enc.block.1", "dec.block.0", "dec.block.1")
    p.info.layer_grouping = LayerGrouping(
        method="module-tree", layer_regex=grouping_regex, first_layer_regex=DEFAULT_FIRST_LAYER_REGEX,
        last_layer_regex=DEFAULT_LAST_LAYER_REGEX, call_regex=LayerOptions().call_regex, layers=layers,
        module_paths=tuple(paths or (f"model.{name}" for name in layers)))
    return p.validate()


def test_recorded_grouping_is_used_without_options_and_its_module_paths_are_kept():
    p = recorded()
    for options in (None, LayerOptions(), LayerOptions(layer_regex=p.info.layer_grouping.layer_regex)):
        la = group_layers(p, options)
        assert la.names == ["enc.block.0", "enc.block.1", "dec.block.0", "dec.block.1"]
        assert assigned(la) == [("enc.block.0", Rule.NAME), ("enc.block.1", Rule.NAME),
                                ("enc.block.1", Rule.EXPLICIT), ("dec.block.0", Rule.NAME),
                                ("dec.block.1", Rule.NAME), ("dec.block.1", Rule.LAST_LAYER)]
        # the recorded paths (here with a model. prefix no operation name shows), not re-derived ones
        assert la.module_paths == ["model.enc.block.0", "model.enc.block.1", "model.dec.block.0", "model.dec.block.1"]
        assert la.options.layer_regex == p.info.layer_grouping.layer_regex


def test_other_grouping_options_regroup_from_the_names_without_the_recorded_layers():
    """The default regex reads only the block numbers: encoder and decoder block k become one
    layer, as the user asked; the explicit layer the recorded grouping stored is set aside."""
    p = recorded()
    la = group_layers(p, LayerOptions(layer_regex=r"block\.(\d+)"))
    assert la.names == ["0", "1"]
    assert assigned(la) == [("0", Rule.NAME), ("1", Rule.NAME), (None, Rule.NO_LAYER), ("0", Rule.NAME),
                            ("1", Rule.NAME), ("1", Rule.LAST_LAYER)]
    assert la.module_paths == [None, None]          # two paths each: none is the layer's


def test_a_layer_the_record_does_not_name_gets_a_derived_path():
    p = recorded(paths=("model.enc.block.0", None, "model.dec.block.0", "model.dec.block.1"))
    la = group_layers(p)
    assert la.module_paths == ["model.enc.block.0", None, "model.dec.block.0", "model.dec.block.1"]


def test_module_path_of_a_regex_that_matches_the_separator_after_the_block():
    la = group(("0/aten.t"), ("0/aten.addmm"), ("1/aten.relu"), ("2/aten.addmm"), layer_regex=r"^(\d+)[./]")
    assert la.names == ["0", "1", "2"] and la.module_paths == ["0", "1", "2"]
    la = group("layer1.0.conv1/conv", "layer1.0.bn1/bn", "layer1.1.conv1/conv", layer_regex=r"layer(\d+)\.(\d+)")
    assert la.names == ["10", "11"] and la.module_paths == ["layer1.0", "layer1.1"]
