"""The compact columnar form (.stagesplit: numpy arrays in a zip): exact round trips, size, and
damaged or foreign files rejected with one line, without ever unpickling anything."""

import io
import json
import pickle
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import (
    assert_profiles_equal,
    error_line,
    load_sample,
    random_block_profile,
    random_profile,
    sample_path,
    tiny_profile,
)
from stagesplit.errors import ProfileError, StagesplitError
from stagesplit.io import load_profile, save_profile
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.compact import profile_to_arrays, read_compact, write_compact
from stagesplit.io.profile import GroundTruth, ProfileInfo, Target


def round_trip(profile, tmp_path, name="p.stagesplit"):
    path = tmp_path / name
    write_compact(profile, path)
    return read_compact(path)


def write_arrays(path, arrays):
    buffer = io.BytesIO()                   # (np.savez would add ".npz" to any other suffix)
    np.savez_compressed(buffer, **arrays)
    path.write_bytes(buffer.getvalue())
    return path


def header_of(arrays) -> dict:
    return json.loads(arrays["header"].tobytes().decode())


def with_header(arrays, header) -> dict:
    out = dict(arrays)
    out["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    return out


def rich_profile():
    """Every optional part set: unicode names, warnings, a mix of explicit and regex layers,
    an explicit empty-string layer, unknown steps, NaN and set compute, big byte counts,
    ground truth with a step trace."""
    info = ProfileInfo(name="modèle ünïcode", source="test", description="línea 1\nline 2", synthetic=True,
                       compute_source="mesuré", warnings=["ⓦ first", "second \u2192 third"])
    b = ProfileBuilder(Target("dev \u03bc", tiles=3, bytes_per_tile=2**40, clock_hz=1.5e9, kind="gpu",
                              link_bytes_per_s=1e11, flops_per_s=3e14, description="μ-device"),
                       ["前向", "step 1", "", "⏹"], compute_unit="flops", info=info)
    w = b.variable(3 * 2**33, 2, "always", name="权重")
    x = b.variable(70000, 1, [(0, 2), (3, 4)], name="激活/x")
    y = b.variable(5, 0, [(1, 3)], name=None)
    never = b.variable(9, 0, [], name="never live")
    p0 = b.program("程序", "DoExchange", cycles=4.5, vertices=12, vertex_code=[(0, "Vértex<half>", 300)],
                   vertex_state=[(1, 2**31 + 5)], exchange_code=[(2, 17)], control_code=[(0, 1), (2, 2)])
    p1 = b.program("empty")
    b.operation("layer0/ä", 0, 1, vars=[w, x], programs=[p0], inputs=["输入", "w"], layer=None, debug_id=7,
                compute=2.5)
    b.operation("explicit", 2, 3, vars=[x, y], programs=[p0, p1], layer="Ω layer", debug_id=2**40)
    b.operation("empty layer name", vars=[never], layer="")
    b.operation("", 3, 3, inputs=("a", "b", "c"))
    b.ground_truth = GroundTruth(always_live=np.array([0, 0, 3 * 2**33]), not_always_live=np.array([5, 70000, 0]),
                                 categories={"vertex_code": np.array([300, 0, 0]), "ünmodelled": np.array([1, 2, 3])},
                                 step_tiles=np.array([1, 0]), step_bytes=np.array([[70000, 70000, 0, 70000],
                                                                                    [0, 5, 5, 0]]))
    return b.build()


# --------------------------------------------------------------------------------------------------
# Round trips

@pytest.mark.parametrize("ground_truth", [False, True])
def test_tiny_round_trip(tmp_path, ground_truth):
    p = tiny_profile(ground_truth)
    back = round_trip(p, tmp_path)
    assert_profiles_equal(p, back)
    assert (back.ground_truth is None) == (not ground_truth)


def test_round_trip_of_every_field(tmp_path):
    p = rich_profile()
    back = round_trip(p, tmp_path)
    assert_profiles_equal(p, back)
    # spelled out, the parts most likely to go wrong
    assert back.operations.layer == [None, "Ω layer", "", None]
    assert back.operations.inputs == [("输入", "w"), (), (), ("a", "b", "c")]
    assert back.info.warnings == ["ⓦ first", "second \u2192 third"]
    assert back.info.description == "línea 1\nline 2"
    assert back.steps == ["前向", "step 1", "", "⏹"]
    assert back.names == ["权重", "激活/x", "never live"]
    assert back.variables.bytes.tolist() == [3 * 2**33, 70000, 5, 9]
    assert back.variables.bytes.dtype == np.int64
    assert back.programs.vertex_state.bytes.tolist() == [2**31 + 5]
    assert back.operations.debug_id.tolist() == [7, 2**40, -1, -1]
    assert list(back.ground_truth.categories) == ["vertex_code", "ünmodelled"]
    assert back.target == p.target


def test_save_and_load_pick_the_compact_form_by_suffix(tmp_path):
    p = tiny_profile(True)
    for name in ("a.stagesplit", "a.npz"):
        save_profile(p, tmp_path / name)
        assert (tmp_path / name).read_bytes()[:2] == b"PK"
        assert_profiles_equal(p, load_profile(tmp_path / name))


def test_sample_round_trip(tmp_path):
    p = load_sample("gpt")
    back = round_trip(p, tmp_path)
    assert_profiles_equal(p, back)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), layers=st.integers(1, 5), block=st.booleans(), tiles=st.integers(1, 4))
def test_property_round_trip_random_profiles(tmp_path, seed, layers, block, tiles):
    rng = np.random.default_rng(seed)
    p = random_block_profile(rng, layers=layers, training=True, tiles=tiles) if block else \
        random_profile(rng, layers=layers, tiles=tiles)
    assert_profiles_equal(p, round_trip(p, tmp_path))


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(text, min_size=1, max_size=3), names=st.lists(st.none() | text, min_size=1, max_size=3),
       layers=st.lists(st.none() | text, min_size=1, max_size=3), inputs=st.lists(st.lists(text, max_size=2),
                                                                                  min_size=3, max_size=3),
       warnings=st.lists(text, max_size=2), nbytes=st.integers(0, 2**62))
def test_property_round_trip_any_strings(tmp_path, steps, names, layers, inputs, warnings, nbytes):
    b = ProfileBuilder(Target("t", 1, 10), steps, info=ProfileInfo(warnings=warnings))
    ids = [b.variable(nbytes, 0, "always", name=n) for n in names]
    for k, layer in enumerate(layers):
        b.operation(f"op{k}", vars=ids, layer=layer, inputs=inputs[k])
    p = b.build()
    assert_profiles_equal(p, round_trip(p, tmp_path))


@pytest.mark.slow
def test_narrow_integer_storage_is_widened_on_load(tmp_path):
    arrays = profile_to_arrays(tiny_profile())
    assert arrays["var_bytes"].dtype == np.int8        # stored narrow ...
    assert arrays["var_tile"].dtype == np.int8
    back = round_trip(tiny_profile(), tmp_path)
    for a in (back.variables.bytes, back.variables.tile, back.operations.first_step, back.operations.vars.values):
        assert a.dtype == np.int64                      # ... read wide


# --------------------------------------------------------------------------------------------------
# Bad files

@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.stagesplit"
    write_compact(tiny_profile(True), path)
    return path


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.999])
def test_truncated_file(tmp_path, good_file, keep):
    data = good_file.read_bytes()
    path = tmp_path / "cut.stagesplit"
    path.write_bytes(data[: max(2, int(len(data) * keep))])
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, expected="a stagesplit compact profile (a zip of numpy arrays)")


def test_damaged_member_data(tmp_path, good_file):
    """Flipping bytes inside a compressed member gives a clean error naming that array."""
    data = bytearray(good_file.read_bytes())
    with zipfile.ZipFile(good_file) as z:
        offset = z.getinfo("header.npy").header_offset
    # the member's data follows its local header: 30 bytes, then its name and extra field
    name_len, extra_len = int.from_bytes(data[offset + 26:offset + 28], "little"), \
        int.from_bytes(data[offset + 28:offset + 30], "little")
    start = offset + 30 + name_len + extra_len
    for k in range(start + 5, start + 25):
        data[k] ^= 0x55
    path = tmp_path / "damaged.stagesplit"
    path.write_bytes(bytes(data))
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field="header", expected="a readable numpy array")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=4),
       cut=st.none() | st.floats(0, 1))
def test_property_damaged_files_read_or_fail_cleanly(tmp_path, flips, cut):
    data = bytearray(_good_bytes())
    for where, xor in flips:
        data[int(where * len(data))] ^= xor
    if cut is not None:
        data = data[: int(cut * len(data))]
    path = tmp_path / "fuzz.stagesplit"
    path.write_bytes(bytes(data))
    try:
        load_profile(path)
    except StagesplitError as exc:     # a ProfileError, or "not a profile" when the zip signature is hit
        assert "\n" not in str(exc) and str(exc).startswith(f"{path}: ")


_GOOD: list[bytes] = []


def _good_bytes() -> bytes:
    if not _GOOD:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **profile_to_arrays(tiny_profile(True)))
        _GOOD.append(buffer.getvalue())
    return _GOOD[0]


def test_zip_that_is_not_a_profile(tmp_path):
    path = tmp_path / "notes.stagesplit"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field="header", expected="this array in a stagesplit compact profile")


def test_npz_of_other_arrays(tmp_path):
    path = write_arrays(tmp_path / "other.npz", {"weights": np.arange(4)})
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field="header", expected="this array in a stagesplit compact profile")


@pytest.mark.parametrize("missing", ["var_tile", "op_vars", "steps_blob", "gt_category_1", "live_intervals"])
def test_missing_array(tmp_path, missing):
    arrays = profile_to_arrays(tiny_profile(True))
    del arrays[missing]
    path = write_arrays(tmp_path / "missing.npz", arrays)
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field=missing, expected="file incomplete")


@pytest.mark.parametrize("change, field, expected", [
    (lambda h: h.update(version=2), "header.version", "1 (this stagesplit reads compact version 1)"),
    (lambda h: h.update(format="stagesplit-profile"), "header.format", '"stagesplit-compact"'),
    (lambda h: h.update(target="ipu-mk2"), "header.target", "an object"),
    (lambda h: h["target"].update(tiles=0), "header.target.tiles", "an integer >= 1"),
    (lambda h: h.update(info=["x"]), "header.info", "an object"),
    (lambda h: h["info"].update(synthetic="no"), "header.info.synthetic", "true or false"),
    (lambda h: h["info"].update(owner="me"), "header.info.owner", "a known field"),
    (lambda h: h["info"].update(warnings="w"), "header.info.warnings", "a list"),
    (lambda h: h.update(compute_unit=3), "header.compute_unit", "a string"),
    (lambda h: h.update(compute_unit="joules"), "compute_unit", "one of cycles, flops, seconds, none"),
    (lambda h: h.update(ground_truth_categories="vc"), "header.ground_truth_categories", "a list"),
    (lambda h: h["info"].update(batch_size=0), "header.info.batch_size", "an integer >= 1"),
    (lambda h: h["info"].update(batch_size="2"), "header.info.batch_size", "an integer >= 1"),
    (lambda h: h["info"].update(batch_size=True), "header.info.batch_size", "an integer >= 1"),
], ids=["version", "format", "target name", "target tiles", "info list", "info synthetic", "info field",
        "info warnings", "compute unit type", "compute unit", "categories", "batch zero", "batch text",
        "batch boolean"])
def test_bad_header(tmp_path, change, field, expected):
    arrays = profile_to_arrays(tiny_profile(True))
    header = header_of(arrays)
    change(header)
    path = write_arrays(tmp_path / "header.npz", with_header(arrays, header))
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field=field, expected=expected)


def test_header_that_is_not_json(tmp_path):
    arrays = profile_to_arrays(tiny_profile())
    arrays["header"] = np.frombuffer(b"\x00{not json", np.uint8)
    path = write_arrays(tmp_path / "h.npz", arrays)
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field="header", expected="a JSON header")


@pytest.mark.parametrize("intervals, field", [
    ([[0, 3], [2, 5], [3, 4], [5, 6]], "liveness[0].intervals[1]"),      # overlapping: [0, 3) and [2, 5)
    ([[2, 5], [0, 1], [3, 4], [5, 6]], "liveness[0].intervals[1]"),      # not sorted
])
def test_overlapping_or_unsorted_intervals(tmp_path, intervals, field):
    arrays = profile_to_arrays(tiny_profile())
    arrays["live_offsets"] = np.array([0, 2, 2, 3, 4])                  # class 0 gets two intervals
    arrays["live_intervals"] = np.array(intervals)
    path = write_arrays(tmp_path / "overlap.npz", arrays)
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field=field, expected="intervals sorted by start, each starting at or after")


@pytest.mark.parametrize("key, value, field, expected", [
    ("var_bytes", np.full(7, 1.5), "var_bytes", "a 1-d array of kind 'i'"),
    ("var_bytes", np.ones((1, 7), np.int64), "var_bytes", "a 1-d array of kind 'i'"),
    ("var_always_live", np.ones(7, np.int64), "var_always_live", "a 1-d array of kind 'b'"),
    ("var_tile", np.zeros(6, np.int64), "var_*", "7 entries in every variable array"),
    ("var_tile", np.full(7, 5), "variables[0].tile", "a tile index in 0..1"),
    ("var_bytes", np.array([1, 1, 1, -1, 1, 1, 1]), "variables[3].bytes", "an integer >= 0"),
    ("op_vars_offsets", np.array([0, 2, 4, 7, 99]), "op_vars_offsets", "5 non-decreasing offsets ending at 8"),
    ("op_vars", np.array([0, 2, 2, 3, 1, 3, 4, 70]), "operations[3].vars[0]", "a variable index in 0..6"),
    ("steps_blob", np.frombuffer(b"\xff\xfe\xfd\xfc\xfb\xfa", np.uint8), "steps_offsets",
     "non-decreasing offsets from 0 to the blob's length"),
    ("names_blob", np.frombuffer(b"\xff" * 70, np.uint8), "names_blob", "UTF-8 text"),   # 70: same length
    ("gt_always_live", np.array([1]), "ground_truth.always_live", "2 values (one per tile)"),
    ("live_intervals", np.array([[0, 3], [2, 9], [3, 4], [5, 6]]), "liveness[1].intervals[0]",
     "an interval end >= its start and <= 6"),
], ids=["float bytes", "2-d bytes", "int always_live", "short tiles", "tile out of range", "negative bytes",
        "offsets", "missing variable", "string offsets", "not utf-8", "ground truth", "interval"])
def test_bad_arrays(tmp_path, key, value, field, expected):
    arrays = profile_to_arrays(tiny_profile(True))
    assert key in arrays
    arrays[key] = value
    path = write_arrays(tmp_path / "bad.npz", arrays)
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field=field, expected=expected)


# --------------------------------------------------------------------------------------------------
# No pickle, ever

TRIPPED: list[str] = []


def _tripwire(tag):
    TRIPPED.append(tag)
    return 42


class Tripwire:
    """Unpickling an instance calls ``_tripwire``: proof that a file's pickle was executed."""

    def __reduce__(self):
        return (_tripwire, ("unpickled",))


@pytest.mark.parametrize("key", ["header", "var_bytes", "op_name_blob", "gt_step_bytes"])
def test_object_array_is_rejected_not_unpickled(tmp_path, key):
    arrays = profile_to_arrays(tiny_profile(True))
    arrays[key] = np.array([Tripwire(), Tripwire()], dtype=object)
    path = write_arrays(tmp_path / "evil.stagesplit", arrays)
    TRIPPED.clear()
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    error_line(excinfo, file=path, field=key, expected="a readable numpy array")
    assert TRIPPED == []
    # the file really does carry a pickle that would run if it were loaded with pickling on
    with np.load(path, allow_pickle=True) as data:
        data[key]
    assert TRIPPED == ["unpickled", "unpickled"]
    TRIPPED.clear()


def test_loading_never_calls_pickle(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used while loading a compact profile")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    assert_profiles_equal(rich_profile(), round_trip(rich_profile(), tmp_path))
    p = read_compact(sample_path("cnn"))
    assert len(p.variables) == len(load_sample("cnn").variables)


def test_saved_arrays_hold_no_objects():
    arrays = profile_to_arrays(rich_profile())
    assert all(a.dtype != object for a in arrays.values())
    assert all(a.dtype.kind in "biuf" for a in arrays.values())


def _profile_with_roles():
    """One variable of every role (and one whose role is unknown) on a two-step timeline."""
    b = ProfileBuilder(Target("t", 1, 1000), 2)
    ids = [b.variable(10 * (k + 1), 0, "always" if role != "other" else [(0, 1)], f"v{k}", role=role)
           for k, role in enumerate(("param", "grad", "state", "buffer", "other", "unknown"))]
    ids.append(b.variable(3, 0, "always", "no role given"))
    b.operation("op", 0, 1, vars=ids)
    return b.build()


def test_roles_round_trip_and_old_files_read_without_roles(tmp_path):
    p = _profile_with_roles()
    assert p.variables.role.tolist() == [1, 2, 3, 4, 5, 0, 0]
    back = round_trip(p, tmp_path)
    assert_profiles_equal(p, back)
    assert back.variables.role_of("grad").tolist() == [False, True, False, False, False, False, False]
    old = tiny_profile(False)                          # a profile that records no roles writes no var_role
    assert old.variables.role is None
    assert "var_role" not in profile_to_arrays(old)
    assert round_trip(old, tmp_path, "old.stagesplit").variables.role is None


def test_a_bad_role_is_named(tmp_path):
    arrays = profile_to_arrays(_profile_with_roles())
    arrays["var_role"] = np.array([1, 2, 3, 4, 5, 0, 9], np.int8)
    path = tmp_path / "bad.stagesplit"
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(ProfileError, match=r"var_role\[6\]: expected a role in 0\.\.5, got 9"):
        read_compact(path)
