"""Synthetic profiles: labelled, reproducible, internally consistent, with realistic magnitudes."""

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import SAMPLE_NAMES, assert_profiles_equal, load_sample, sample_path
from stagesplit.cli import main
from stagesplit.cli.naming import flags_in
from stagesplit.errors import StagesplitError
from stagesplit.io import load_profile, synth
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.compact import read_compact, write_compact
from stagesplit.io.profile import Target
from stagesplit.io.synth import FAMILIES, ground_truth, synthesize, write_synthetic
from stagesplit.io.targets import load_target
from stagesplit.layers import group_layers
from stagesplit.model.costmodel import StageCostModel

SMALL = Target("small", tiles=16, bytes_per_tile=10**7, clock_hz=1e9)


def small(family="gpt", seed=0, **kw):
    params = {"layers": 2} if family in ("gpt", "bert-base") else {}
    params.update(kw)
    return synthesize(family, SMALL, seed=seed, **params)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_samples_are_labelled_synthetic(name):
    info = load_sample(name).info
    assert info.synthetic is True
    assert info.source == "synthetic"
    assert "(synthetic)" in info.description
    assert info.compute_source == "compile-time cycle estimates (synthetic)"


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_shipped_samples_are_reproducible(name):
    """Each shipped sample is exactly what the generator makes for that family on an IPU Mk2."""
    assert_profiles_equal(load_sample(name), synthesize(name, load_target("ipu-mk2")))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_deterministic_for_a_seed(family):
    target = SMALL if family != "cnn" else Target("small", 64, 10**8)
    a = synthesize(family, target, seed=11)
    b = synthesize(family, target, seed=11)
    assert_profiles_equal(a, b)
    c = synthesize(family, target, seed=12)
    assert not np.array_equal(a.variables.tile, c.variables.tile)      # the seed places tensors
    assert len(a.variables) == len(c.variables)                         # but the model is the same


def test_unknown_family():
    with pytest.raises(KeyError):
        synthesize("resnet", SMALL)


@pytest.mark.parametrize("kw, message", [
    ({"piece_bytes": 0}, "invalid --piece-bytes 0: expected an integer >= 1"),
    ({"piece_bytes": -5}, "invalid --piece-bytes -5: expected an integer >= 1"),
    ({"programs_per_op": 0}, "invalid --programs-per-op 0: expected an integer >= 1"),
    ({"layers": 0}, "invalid --layers 0: expected an integer >= 1"),
    ({"seed": -1}, "invalid --seed -1: expected an integer >= 0"),
])
def test_bad_parameters(kw, message):
    with pytest.raises(StagesplitError) as excinfo:
        small(**kw)
    parameter = next(iter(kw))
    assert str(excinfo.value).startswith(f"invalid `{parameter}` ")      # the Python API's name
    assert flags_in(str(excinfo.value)) == message                     # the command line's words


def _first_start(p):
    """Each not-always-live variable's first live step (-1 for the others)."""
    v = p.variables
    start = np.full(len(v), -1, np.int64)
    nal = np.flatnonzero(~v.always_live & (v.live_class >= 0))
    iv = p.liveness.intervals
    firsts = np.array([iv[c][:, 0].min() for c in range(len(iv))], np.int64)
    start[nal] = firsts[v.live_class[nal]]
    return start


def check_liveness(p):
    v = p.variables
    ops = p.operations
    nal = ~v.always_live & (v.live_class >= 0)
    assert (v.always_live | nal).all()                   # every variable is live some time
    start = _first_start(p)
    op_of = ops.vars.row_ids()
    var = ops.vars.values
    # every not-always-live variable goes live at a step of an operation that uses it ...
    goes_live_in_user = (ops.first_step[op_of] <= start[var]) & (start[var] <= ops.last_step[op_of])
    born = np.zeros(len(v), bool)
    born[var[goes_live_in_user]] = True
    assert born[nal].all(), f"{int((nal & ~born).sum())} variables go live outside their operations"
    # ... and is live during every operation that lists it
    iv = p.liveness.intervals
    for o, x in zip(op_of.tolist(), var.tolist()):
        if not nal[x]:
            continue
        spans = iv[v.live_class[x]]
        assert ((spans[:, 0] <= ops.last_step[o]) & (spans[:, 1] > ops.first_step[o])).any(), \
            (ops.name[o], p.variable_name(x))
    # variables no operation uses are always live (stream buffers)
    used = np.zeros(len(v), bool)
    used[var] = True
    assert v.always_live[~used].all()


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_liveness_is_consistent(name):
    check_liveness(load_sample(name))


@pytest.mark.parametrize("family, kw", [("gpt", {"programs_per_op": 1}), ("gpt", {"programs_per_op": 2}),
                                        ("bert-base", {"piece_bytes": 4096}), ("cnn", {"piece_bytes": 2**20}),
                                        ("gpt", {"programs_per_op": 6, "seed": 9}), ("bert-large", {})])
def test_generated_liveness_is_consistent(family, kw):
    check_liveness(small(family, **kw))


def test_every_step_has_an_operation_and_operations_do_not_overlap():
    p = load_sample("bert-base")
    ops = p.operations
    covered = np.zeros(p.num_steps, int)
    for f, l in zip(ops.first_step.tolist(), ops.last_step.tolist()):
        covered[f:l + 1] += 1
    assert (covered == 1).all()


# --------------------------------------------------------------------------------------------------
# Magnitudes

@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_magnitudes(name):
    p = load_sample(name)
    m = StageCostModel(p, group_layers(p))
    assert 1000 <= p.num_steps <= 10000                                      # thousands of steps
    assert p.target == load_target("ipu-mk2")
    per_layer = [m.stage_memory(l, l) for l in range(m.num_layers)]
    variables = np.array([sm.variables.sum() for sm in per_layer])
    # tens to hundreds of MB of variables per layer
    assert 10e6 <= np.median(variables) <= 300e6 and variables.max() <= 1e9
    for category in ("vertex_code", "vertex_state", "exchange_code", "control_code"):
        code = np.array([sm.category(category).sum() for sm in per_layer])
        assert 1e6 <= np.median(code) <= 20e6, category                     # a few MB per category
    # and the whole model does not fit on one device: that is what the samples are for
    whole = m.stage_memory(0, m.num_layers - 1)
    assert whole.worst_bytes() > p.target.bytes_per_tile


def test_bert_encoder_layer_weights_by_hand():
    """A BERT-base encoder layer: q, k, v, attention output (768 x 768 + 768 each), two
    LayerNorms (2 x 768 each), intermediate (768 x 3072 + 3072) and output (3072 x 768 + 768):
    7,087,872 parameters at 8 bytes (weight, gradient and optimizer state)."""
    params = 4 * (768 * 768 + 768) + 2 * (2 * 768) + (768 * 3072 + 3072) + (3072 * 768 + 768)
    assert params == 7_087_872
    p = load_sample("bert-base")
    m = StageCostModel(p, group_layers(p), shared="none")
    for layer in range(1, 11):                          # encoder layers without embeddings or head
        assert m.stage_memory(layer, layer).always_live.sum() == params * 8
    shared = StageCostModel(p, group_layers(p)).shared_memory()
    assert shared.always_live.sum() == 1472 * (768 + 16)      # stream buffers and the step counter


def test_activation_sizes_by_hand():
    """The output of every BERT encoder layer is batch 8 x sequence 128 x hidden 768 halves."""
    p = load_sample("bert-base")
    idx = p.names.index("bert/encoder/layer3/output/LayerNorm/output")
    sizes = p.variables.bytes[p.variables.name == idx]
    assert sizes.sum() == 8 * 128 * 768 * 2
    # lowered into pieces of piece_bytes (16 KiB): 1,572,864 / 16,384 = 96, one per tile
    assert sizes.tolist() == [16384] * 96
    assert len(np.unique(p.variables.tile[p.variables.name == idx])) == 96


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_shipped_sample_files_are_small(name):
    assert sample_path(name).stat().st_size < 5 * 2**20


def test_ground_truth_is_independent_of_the_cost_model():
    """synth.ground_truth on a generated profile adds the two unmodelled categories and traces
    the most loaded tiles step by step."""
    p = small("gpt")
    gt = ground_truth(p, np.random.default_rng(3), trace_tiles=4)
    assert list(gt.categories) == ["vertex_code", "vertex_instance_state", "internal_exchange_code", "control_code",
                                   "constant", "vector_list_descriptor"]
    assert ((64 <= gt.categories["constant"]) & (gt.categories["constant"] < 512)).all()
    assert ((0 <= gt.categories["vector_list_descriptor"]) & (gt.categories["vector_list_descriptor"] < 256)).all()
    assert gt.step_bytes.shape == (4, p.num_steps)
    assert np.array_equal(gt.step_bytes.max(axis=1), gt.not_always_live[gt.step_tiles])
    total = gt.tile_total()
    assert (total[gt.step_tiles] >= np.delete(total, gt.step_tiles).max()).all()
    v = p.variables
    assert np.array_equal(gt.always_live, np.bincount(v.tile[v.always_live], weights=v.bytes[v.always_live],
                                                      minlength=p.target.tiles).astype(np.int64))


# --------------------------------------------------------------------------------------------------
# Streaming to disk (issue 26): the same bytes as before, in bounded memory

DATA = Path(__file__).resolve().parents[1] / "data" / "synth"
CNN_TARGET = Target("small", 64, 10**8)
#: files written by synthesize() + write_compact before the compact writer streamed (commit c80210d):
#: file name -> (family, target, parameters)
OLD_OUTPUT = {
    "bert-base-2-s3.stagesplit": ("bert-base", SMALL, {"layers": 2, "seed": 3}),
    "gpt-2-s0-p4096.stagesplit": ("gpt", SMALL, {"layers": 2, "piece_bytes": 4096}),
    "cnn-s7-ppo2.stagesplit": ("cnn", CNN_TARGET, {"seed": 7, "programs_per_op": 2}),
}


def members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(info.filename, z.read(info)) for info in z.infolist()]


@pytest.mark.parametrize("name", sorted(OLD_OUTPUT))
def test_streamed_file_is_the_old_output(tmp_path, name):
    family, target, params = OLD_OUTPUT[name]
    old = (DATA / name).read_bytes()
    streamed = tmp_path / "streamed.stagesplit"
    summary = write_synthetic(streamed, family, target, **params)
    assert members(streamed.read_bytes()) == members(old)         # every array, in order, byte for byte
    assert streamed.read_bytes() == old                             # and the zip around them
    in_memory = tmp_path / "memory.stagesplit"
    write_compact(synthesize(family, target, **params), in_memory)
    assert in_memory.read_bytes() == old
    assert len(summary.variables) == len(read_compact(streamed).variables)
    assert len(summary.programs.vertex_code) == 0                   # the costs went to the file only


def test_ground_truth_in_blocks_of_tiles_is_the_same(monkeypatch, tmp_path):
    """The per-step figures are computed a few tiles at a time on large profiles: blocks of 1,
    3 and all 16 tiles give the same file."""
    family, target, params = OLD_OUTPUT["bert-base-2-s3.stagesplit"]
    old = (DATA / "bert-base-2-s3.stagesplit").read_bytes()
    steps = synthesize(family, target, **params).num_steps
    for tiles in (1, 3):
        monkeypatch.setattr(synth, "STEP_BLOCK_CELLS", tiles * (steps + 1))
        write_synthetic(tmp_path / f"b{tiles}.stagesplit", family, target, **params)
        assert (tmp_path / f"b{tiles}.stagesplit").read_bytes() == old
        assert_profiles_equal(synthesize(family, target, **params).ground_truth,
                              read_compact(DATA / "bert-base-2-s3.stagesplit").ground_truth)


def test_cli_streams_compact_output_and_builds_json(tmp_path, capsys):
    (tmp_path / "small.yaml").write_text("tiles: 16\nbytes_per_tile: 10000000\nclock_hz: 1.0e+9\n")
    out = tmp_path / "b.stagesplit"
    assert main(["synth", "bert-base", "--layers", "2", "--seed", "3", "--target", str(tmp_path / "small.yaml"),
                 "-o", str(out)]) == 0
    assert out.read_bytes() == (DATA / "bert-base-2-s3.stagesplit").read_bytes()
    assert capsys.readouterr().err.startswith(f"wrote {out}: bert-2x768 (synthetic), 7,657 variables, 84 operations")
    as_json = tmp_path / "b.json"
    assert main(["synth", "bert-base", "--layers", "2", "--seed", "3", "--target", str(tmp_path / "small.yaml"),
                 "-o", str(as_json)]) == 0
    assert_profiles_equal(load_profile(as_json), read_compact(out))


def test_spilled_rows_outside_the_profile_are_caught():
    """The streamed rows are checked as Profile.validate checks rows a profile holds."""
    costs = synth._SpilledCosts(4)
    try:
        b = ProfileBuilder(Target("t", 4, 100), 2)
        b.program("p")
        costs.sink(b)("control_code", 1, np.array([0, 3]), 8)          # program 1 of a profile of one
        with pytest.raises(AssertionError, match="control_code_program values 1..1 outside 0..0"):
            costs.check(b.build())
    finally:
        costs.close()
