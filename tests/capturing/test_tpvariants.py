"""stagesplit capture --tp 1,2: one rank at each tensor-parallel degree, in one profile file.

The oracle is the single-degree capture: each variant of the file is, byte for byte in the JSON
form, the profile ``capture --tp N`` writes alone; the layout search given the one file finds what
it finds given the separate files (``--tp-profile``); breakdown's table per degree is each single
profile's figures. Then the file's two forms round trip, and bad input is one line."""

from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the Llama cases build a Hugging Face model from a config")

import tp_harness  # noqa: E402
from stagesplit import api  # noqa: E402
from stagesplit.cli import main  # noqa: E402
from stagesplit.errors import StagesplitError  # noqa: E402
from stagesplit.io import load_profile, load_variants, save_profile  # noqa: E402
from stagesplit.io.jsonprofile import dumps_profile  # noqa: E402
from stagesplit.model.analysis import Analysis  # noqa: E402
from stagesplit.model.datasharding import role_bytes  # noqa: E402


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The tiny Llama captured by the command line at --tp 1,2 --sp into one file (both forms),
    and alone at --tp 1 and at --tp 2 --sp (JSON)."""
    folder = tmp_path_factory.mktemp("tpvariants")
    factory = folder / "tiny_llama_variants.py"
    factory.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tp_harness.ROOT / "tests")!r})
        import tp_harness

        def build():
            return tp_harness.build("llama", "meta"), tp_harness.inputs("llama", "meta")
    """))
    spec = f"{factory}:build"
    files = {"both.json": ["--tp", "1,2", "--sp"], "both.stagesplit": ["--tp", "2,1", "--sp"],
             "tp1.json": ["--tp", "1"], "tp2.json": ["--tp", "2", "--sp"]}
    for name, options in files.items():
        assert main(["capture", spec, *options, "--allocator-round", "1", "-o", str(folder / name)]) == 0
    return folder, spec


def test_each_variant_is_the_single_degree_capture(captured):
    """The file's variants, in either form, are exactly what the captures alone write."""
    folder, _ = captured
    alone = {1: (folder / "tp1.json").read_text(), 2: (folder / "tp2.json").read_text()}
    for name in ("both.json", "both.stagesplit"):
        variants = load_variants(folder / name)
        assert variants.degrees == (1, 2)
        for degree, profile in zip(variants.degrees, variants.profiles):
            assert dumps_profile(profile) == alone[degree], (name, degree)
            assert profile.info.path == str(folder / name)
            assert profile.info.batch_size == 2             # tp_harness's ids: 2 sequences of 32
    # the JSON file is each single document, in a list
    doc = json.loads((folder / "both.json").read_text())
    assert (doc["format"], doc["version"], doc["kind"]) == ("stagesplit-profile", 1, "variants")
    assert [json.dumps(v, sort_keys=True) for v in doc["variants"]] == \
        [json.dumps(json.loads(alone[d]), sort_keys=True) for d in (1, 2)]
    # and save_profile writes the same file again
    again = folder / "again.json"
    save_profile(load_variants(folder / "both.json"), again)
    assert again.read_text() == (folder / "both.json").read_text()


def test_capture_lines_per_degree(captured, capsys):
    """The command line says one line per degree, with the TP rank's layout line."""
    folder, spec = captured
    out = folder / "lines.stagesplit"
    assert main(["capture", spec, "--tp", "1,2", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    variants = load_variants(out)
    assert f"wrote {out}: tiny_llama_variants, one rank at each of 2 tensor-parallel degrees (1, 2)" in err
    for degree, p in zip(variants.degrees, variants.profiles):
        v = p.variables
        assert (f"TP {degree}, {len(p.operations):,} operations (program steps), {len(v):,} tensor storages; "
                f"parameters, gradients and optimizer state {v.bytes[v.always_live].sum() / 2**30:.3f} GiB") in err


def test_one_profile_commands_refuse_the_file(captured, capsys):
    folder, _ = captured
    path = folder / "both.stagesplit"
    with pytest.raises(StagesplitError, match=r"holds one rank's profile at each of 2 tensor-parallel degrees "
                                              r"\(1, 2\); this command takes one profile"):
        load_profile(path)
    assert main(["solve", str(path), "--devices", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensor-parallel degrees (1, 2)" in err


def _rows(lp):
    return [(r.layout, r.status, r.step_s, r.rank_peaks, r.tp_comm_s, r.dp_comm_s) for r in lp.rows]


def test_layout_search_on_the_file_equals_the_separate_files(captured):
    folder, _ = captured
    options = dict(gpus=4, global_batch=8, target="h100-80gb", time_limit=60)
    one = api.layouts(str(folder / "both.stagesplit"), **options)
    separate = api.layouts(str(folder / "tp1.json"), tp_profiles={2: str(folder / "tp2.json")}, **options)
    assert one.proven and separate.proven
    assert {r.layout.tp for r in one.rows} == {1, 2}
    assert _rows(one) == _rows(separate)
    assert one.best == separate.best
    assert one.plan.profile.tensor_parallel == separate.plan.profile.tensor_parallel
    # a degree given twice (in the file and by tp_profiles) is refused
    with pytest.raises(StagesplitError, match="degree 2 is given twice"):
        api.layouts(str(folder / "both.json"), tp_profiles={2: str(folder / "tp2.json")}, **options)
    sweep = api.layout_sweep(str(folder / "both.json"), gpus=[4], global_batch=8, target="h100-80gb",
                             time_limit=60)
    assert _rows(sweep.rows[0].plan) == _rows(separate)


def test_layout_commands_take_the_file(captured, capsys):
    """solve --layout auto and sweep --gpus take the file as their PROFILE (no --tp-profile)."""
    folder, _ = captured
    path = str(folder / "both.stagesplit")
    common = ["--global-batch", "8", "--target", "h100-80gb", "--time-limit", "60"]
    plan = folder / "layout-plan.json"
    assert main(["solve", path, "--layout", "auto", "--gpus", "4", "--tp", "2", *common, "--out", str(plan)]) == 0
    text = capsys.readouterr().out
    best = api.layouts(path, gpus=4, global_batch=8, target="h100-80gb", time_limit=60, tp=2).best
    assert f"best: {best.layout.describe()}" in text
    # the plan names the file; solved again from it, the rank of the plan's degree is taken
    recorded = json.loads(plan.read_text())["profile"]
    assert recorded["path"] == path and recorded["tensor_parallel"] == best.layout.tp == 2
    again = api.reproduce(str(plan))
    assert again.identical and again.profile_matches
    assert main(["sweep", path, "--gpus", "2,4", *common]) == 0
    capsys.readouterr()


def test_breakdown_per_degree(captured):
    """breakdown's table per degree: each degree's rank's bytes by role, its activations at the
    peak and its peak, as the single profile of that degree gives them."""
    folder, _ = captured
    result = api.breakdown(str(folder / "both.json"))
    rows = result.tensor_parallel_rows()
    assert [r[0] for r in rows] == [1, 2]
    for degree, roles, transient, peak, moved in rows:
        single = load_profile(folder / f"tp{degree}.json")
        model = Analysis.of(single).model
        whole = model.stage_memory(0, model.num_layers - 1)
        assert roles == role_bytes(single)
        assert peak == whole.worst_bytes()
        assert transient == int(whole.not_always_live[0])
        layout = single.info.parallel_layout
        assert moved == (sum(c.bytes for c in layout.collectives) if layout is not None else 0)
    # the TP 2 rank holds half the planned Linear weights: fewer parameter bytes, some collectives
    assert rows[1][1]["param"] < rows[0][1]["param"] and rows[0][4] == 0 < rows[1][4]
    table = result.tensor_parallel_table()
    assert table.title == "One rank at each tensor-parallel degree (whole profile as one stage)"
    assert [row[0] for row in table.rows] == [1, 2]
    assert table.rows[1][6] == rows[1][3]
    # the other tables are the lowest degree's
    assert result.model.profile.info.parallel_layout is None


def test_degree_lists_refused_in_one_line(captured, capsys):
    folder, spec = captured
    out = folder / "refused.stagesplit"
    cases = {"1,2,3": "--tp: model.layers.0.self_attn has 4 attention heads, not divisible by 3 ranks",
             "1,4": "--tp: model.layers.0.self_attn has 2 key/value heads, not divisible by 4 ranks",
             "2,2": "--tp: the degree 2 is given twice",
             "1,0": "--tp: expected a whole number in 1..4,096, got '0'"}
    for degrees, message in cases.items():
        assert main(["capture", spec, "--tp", degrees, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, (degrees, err)
        assert not out.exists()


def test_variants_files_read_strictly(captured, tmp_path):
    """A bad field of a variant is named under variants[i]; two variants of one degree are refused."""
    from stagesplit.errors import ProfileError
    folder, _ = captured
    doc = json.loads((folder / "both.json").read_text())
    doc["variants"][1]["operations"][0]["phase"] = "sideways"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=r"bad\.json: variants\[1\]: operations\[0\]\.phase"):
        load_variants(bad)
    doc = json.loads((folder / "both.json").read_text())
    doc["variants"][0] = doc["variants"][1]
    bad.write_text(json.dumps(doc))
    with pytest.raises(StagesplitError, match="two variants are rank profiles of tensor-parallel degree 2"):
        load_variants(bad)
    doc["variants"] = []
    bad.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="variants"):
        load_variants(bad)
    # a plain file reads as one variant
    plain = load_variants(folder / "tp2.json")
    assert plain.degrees == (2,) and dumps_profile(plain.profiles[0]) == (folder / "tp2.json").read_text()


def test_compact_variants_container_read_strictly(captured, tmp_path):
    """The compact container's manifest is checked: its format, and each member it names."""
    import zipfile

    from stagesplit.errors import ProfileError
    folder, _ = captured
    with zipfile.ZipFile(folder / "both.stagesplit") as zf:
        manifest = json.loads(zf.read("variants.json"))
        members = {n: zf.read(n) for n in zf.namelist()}
    assert manifest == {"format": "stagesplit-variants", "version": 1, "variants": ["tp1.stagesplit", "tp2.stagesplit"]}
    for change, field in (({"variants": ["tp1.stagesplit", "nope.stagesplit"]}, r"variants\[1\]"),
                          ({"format": "other"}, "format"), ({"version": 2}, "version")):
        bad = tmp_path / "bad.stagesplit"
        with zipfile.ZipFile(bad, "w") as zf:
            zf.writestr("variants.json", json.dumps({**manifest, **change}))
            for name, data in members.items():
                if name != "variants.json":
                    zf.writestr(name, data)
        with pytest.raises(ProfileError, match=rf"bad\.stagesplit: variants\.json: {field}") as caught:
            load_variants(bad)
        assert "\n" not in str(caught.value)
