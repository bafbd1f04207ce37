"""The command line end to end (breakdown, convert, synth, targets) on the shipped samples:
real numbers, machine-readable formats, atomic --out, and one-line errors with exit status 2."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, assert_profiles_equal, load_sample, sample_path, tiny_profile
from stagesplit.cli import main
from stagesplit.cli.naming import flags_in
from stagesplit.io import load_profile, save_profile
from stagesplit.io.synth import synthesize
from stagesplit.io.targets import known_targets
from stagesplit.model.analysis import Analysis
from stagesplit.reporting.breakdown import Breakdown
from stagesplit.reporting.table import render

BERT = str(sample_path("bert-base"))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, out, err, *fragments):
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("stagesplit: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def bert():
    return Analysis.load(BERT)


# --------------------------------------------------------------------------------------------------
# breakdown

def test_breakdown_text_is_the_librarys(capsys, bert):
    """The command line prints the library's tables, their parameters named by its flags."""
    code, out, err = run(capsys, "breakdown", BERT)
    assert code == 0 and err == ""
    assert out == render(Breakdown.of(bert.model).tables(), "text", naming=flags_in)
    assert "(--shared every)" in out and "`shared" not in out


def test_breakdown_totals_carry_the_real_numbers(capsys, bert):
    code, out, err = run(capsys, "breakdown", BERT, "--sections", "totals")
    assert code == 0
    gt = bert.profile.ground_truth
    modelled = gt.tile_total() - gt.categories["constant"] - gt.categories["vector_list_descriptor"]
    lines = out.splitlines()
    assert lines[0] == "Memory totals by category (whole profile as one stage; summed over tiles)"
    assert lines[2].split()[:3] == ["category", "modelled", "(MiB)"]
    total = next(line for line in lines if line.startswith("total "))
    assert total.split()[1] == f"{modelled.sum() / 2**20:,.2f}"            # about 1,400 MiB over all tiles
    assert total.split()[3] == f"{modelled.max() / 2**20:,.2f}"            # the worst tile, in MiB
    assert f"worst tile needs {modelled.max() / 638976:.0%} of a tile" in out
    assert f"worst tile {int(gt.tile_total().max()):,} bytes" in out


@pytest.mark.parametrize("fmt, delimiter", [("csv", ","), ("tsv", "\t")])
def test_breakdown_csv_and_tsv_parse_back(capsys, bert, fmt, delimiter):
    code, out, _ = run(capsys, "breakdown", BERT, "--sections", "layers,totals", "--format", fmt)
    assert code == 0
    blocks = out.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [
        "# Layers (each layer as a stage of its own; bytes summed over tiles)",
        "# Memory totals by category (whole profile as one stage; summed over tiles)"]
    layers = list(csv.DictReader(io.StringIO(blocks[0].split("\n", 1)[1]), delimiter=delimiter))
    m = bert.model
    assert [r["layer"] for r in layers] == m.layers.names
    for l, r in enumerate(layers):
        sm = m.stage_memory(l, l)
        assert int(r["total_bytes"]) == int(sm.total().sum())
        assert int(r["worst tile"]) == sm.worst_tile()
        assert int(r["worst tile bytes_bytes"]) == sm.worst_bytes()
        assert float(r["compute (cycles)"]) == m.layer_compute[l]
    totals = {r["category"]: r for r in csv.DictReader(io.StringIO(blocks[1].split("\n", 1)[1]), delimiter=delimiter)}
    gt = bert.profile.ground_truth
    assert int(totals["always-live variables"]["modelled_bytes"]) == int(gt.always_live.sum())
    assert int(totals["vertex state"]["modelled_bytes"]) == int(gt.categories["vertex_instance_state"].sum())


def test_breakdown_json_parses_back(capsys, bert):
    code, out, _ = run(capsys, "breakdown", BERT, "--format", "json", "--sections", "tiles,affinity",
                       "--top-tiles", "3")
    assert code == 0
    tiles, affinity = json.loads(out)
    whole = bert.model.stage_memory(0, bert.model.num_layers - 1)
    worst = np.argsort(-whole.total(), kind="stable")[:3]
    assert [r["tile"] for r in tiles["rows"]] == worst.tolist()
    assert [r["total"] for r in tiles["rows"]] == whole.total()[worst].tolist()
    assert affinity["columns"] == ["layer"] + bert.model.layers.names
    from stagesplit.model.traffic import layer_traffic
    expected = layer_traffic(bert.model).affinity
    assert [[r[n] for n in bert.model.layers.names] for r in affinity["rows"]] == expected.tolist()


def test_breakdown_sections_choose_and_order_tables(capsys):
    code, out, _ = run(capsys, "breakdown", BERT, "--sections", "communication,grouping")
    assert code == 0
    lines = out.splitlines()
    titles = [lines[i] for i in range(len(lines) - 1) if lines[i] and lines[i + 1] == "=" * len(lines[i])]
    assert titles == ["Inter-layer communication (bytes created in the row layer, used in the column layer)",
                      "Layer grouping"]


def test_breakdown_of_a_json_profile_with_options(capsys, tmp_path):
    path = tmp_path / "tiny.json"
    save_profile(tiny_profile(True), path)
    code, out, err = run(capsys, "breakdown", path, "--sections", "layers", "--shared", "none", "--format", "csv")
    assert code == 0 and err == ""
    assert out.splitlines()[1:] == ["0,2,100,70,140,20,12,4,346,0,278,0,110.0",
                                    "1,1,50,60,120,16,6,3,255,1,155,0,200.0"]


def test_breakdown_layer_order_and_regex(capsys, tmp_path):
    path = tmp_path / "tiny.json"
    save_profile(tiny_profile(), path)
    code, out, err = run(capsys, "breakdown", path, "--sections", "grouping", "--layer-regex", r"(matmul|add)",
                         "--layer-order", "natural")
    assert code == 0
    assert "2 layers in natural order: add, matmul" in out


def test_breakdown_warns_on_stderr(capsys, tmp_path):
    path = tmp_path / "tiny.json"
    save_profile(tiny_profile(), path)
    code, out, err = run(capsys, "breakdown", path, "--sections", "grouping", "--layer-regex", r"layer1/(matmul)")
    assert code == 0
    assert err.splitlines() == [
        "stagesplit: warning: only 25% of operations got a layer: the model may lack layer names, or "
        "--layer-regex ('layer1/(matmul)') does not fit them"]


# --------------------------------------------------------------------------------------------------
# --out

def test_out_writes_the_same_text(capsys, tmp_path):
    _, expected, _ = run(capsys, "breakdown", BERT, "--sections", "totals,layers", "--format", "csv")
    target = tmp_path / "report.csv"
    code, out, err = run(capsys, "breakdown", BERT, "--sections", "totals,layers", "--format", "csv",
                         "--out", target)
    assert code == 0 and out == ""
    assert err == f"wrote {target}\n"
    assert target.read_text() == expected
    assert os.listdir(tmp_path) == ["report.csv"]                       # no temporary files left


def test_out_replaces_an_existing_file_atomically(capsys, tmp_path, monkeypatch):
    target = tmp_path / "targets.txt"
    target.write_text("old contents\n" * 1000)
    real_replace = os.replace
    seen = []

    def checking_replace(src, dst):
        # at the moment of the rename the new text is complete beside the old, untouched file
        seen.append((Path(src).read_text(), Path(dst).read_text()))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", checking_replace)
    code, _, _ = run(capsys, "targets", "--out", target)
    assert code == 0
    new = target.read_text()
    assert new.startswith("Device targets\n") and "ipu-mk2" in new
    assert seen == [(new, "old contents\n" * 1000)]
    assert os.listdir(tmp_path) == ["targets.txt"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


def test_out_into_a_missing_folder(capsys, tmp_path):
    target = tmp_path / "no" / "such" / "report.txt"
    code, out, err = run(capsys, "targets", "--out", target)
    assert_one_line_error(code, out, err, f"{target}: cannot write: folder {target.parent} does not exist")


def test_out_below_a_file(capsys, tmp_path):
    (tmp_path / "plain").write_text("x")
    target = tmp_path / "plain" / "report.txt"
    code, out, err = run(capsys, "targets", "--out", target)
    assert_one_line_error(code, out, err, f"{target}: cannot write: folder {target.parent} is not a folder")


def test_out_into_an_unwritable_folder(capsys, tmp_path, monkeypatch):
    """The OS refuses the temporary file (as in a read-only folder; simulated, since root may
    write anywhere): one line, nothing left behind, the old file kept."""
    from stagesplit.common import fileio

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    target = tmp_path / "report.txt"
    target.write_text("old")
    monkeypatch.setattr(fileio, "_temporary_beside", refuse)
    code, out, err = run(capsys, "targets", "--out", target)
    assert_one_line_error(code, out, err, f"{target}: cannot write: Permission denied")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["report.txt"]


def test_failed_rename_leaves_no_temporary_file(capsys, tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    target = tmp_path / "report.txt"
    monkeypatch.setattr(os, "replace", refuse)
    code, out, err = run(capsys, "targets", "--out", target)
    assert_one_line_error(code, out, err, f"{target}: cannot write: No space left on device")
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------------
# convert, synth, targets

def test_convert_json_and_compact_round_trip(capsys, tmp_path):
    original = tiny_profile(True)
    source = tmp_path / "tiny.json"
    save_profile(original, source)
    compact = tmp_path / "tiny.stagesplit"
    code, out, err = run(capsys, "convert", source, "-o", compact)
    assert code == 0 and out == ""
    assert err == f"wrote {compact}: 7 variables, 4 operations, 4 programs, 6 steps\n"
    assert compact.read_bytes()[:2] == b"PK"
    back = tmp_path / "back.json"
    assert run(capsys, "convert", compact, "--output", back)[0] == 0
    assert_profiles_equal(original, load_profile(compact))
    assert_profiles_equal(original, load_profile(back))
    assert back.read_text() == source.read_text()


def test_convert_a_sample(capsys, tmp_path):
    out_path = tmp_path / "copy.npz"
    code, _, err = run(capsys, "convert", sample_path("cnn"), "-o", out_path)
    assert code == 0
    p = load_sample("cnn")
    assert err == (f"wrote {out_path}: {len(p.variables):,} variables, {len(p.operations):,} operations, "
                   f"{len(p.programs):,} programs, {p.num_steps:,} steps\n")
    assert_profiles_equal(p, load_profile(out_path))


def test_synth(capsys, tmp_path):
    target = tmp_path / "small.yaml"
    target.write_text("tiles: 16\nbytes_per_tile: 10000000\nclock_hz: 1.0e9\n")
    out_path = tmp_path / "gpt.stagesplit"
    code, out, err = run(capsys, "synth", "gpt", "-o", out_path, "--target", target, "--seed", "3", "--layers", "2",
                         "--programs-per-op", "2", "--piece-bytes", "65536")
    assert code == 0 and out == ""
    expected = synthesize("gpt", load_profile(out_path).target, seed=3, layers=2, programs_per_op=2,
                          piece_bytes=65536)
    got = load_profile(out_path)
    assert_profiles_equal(expected, got)
    assert got.info.synthetic and got.target.tiles == 16 and got.target.name == "small"
    assert err == (f"wrote {out_path}: gpt-2x1024 (synthetic), {len(got.variables):,} variables, "
                   f"{len(got.operations):,} operations, {got.num_steps:,} steps\n")


def test_synth_rejects_layers_for_cnn(capsys, tmp_path):
    code, out, err = run(capsys, "synth", "cnn", "--layers", "3", "-o", tmp_path / "x.stagesplit")
    assert_one_line_error(code, out, err, "--layers: applies to bert-base and gpt, not cnn")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("option, value", [("--piece-bytes", "0"), ("--programs-per-op", "-1"), ("--layers", "0"),
                                           ("--seed", "-3")])
def test_synth_rejects_bad_numbers(capsys, tmp_path, option, value):
    code, out, err = run(capsys, "synth", "gpt", "-o", tmp_path / "x.stagesplit", option, value)
    assert_one_line_error(code, out, err, f"{option}: expected an integer >= ")
    assert os.listdir(tmp_path) == []


def test_targets(capsys):
    code, out, err = run(capsys, "targets")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "Device targets"
    assert lines[2].split()[:6] == ["name", "kind", "tiles", "bytes", "per", "tile"]
    mk2 = next(line for line in lines if line.startswith("ipu-mk2 "))
    assert mk2.split()[:5] == ["ipu-mk2", "ipu", "1,472", "638,976", "0.88"]     # 940,572,672 / 2**30 GiB
    a100 = next(line for line in lines if line.startswith("a100-80gb "))
    assert a100.split()[:5] == ["a100-80gb", "gpu", "1", "85,899,345,920", "80.00"]  # as solve says: 80.00 GiB
    assert lines[2].split()[-3:] == ["memory", "(GiB)", "description"]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "json"])
def test_targets_machine_readable(capsys, fmt):
    code, out, _ = run(capsys, "targets", "--format", fmt)
    assert code == 0
    if fmt == "json":
        rows = json.loads(out)[0]["rows"]
        memory = "device memory"
    else:
        rows = list(csv.DictReader(io.StringIO(out), delimiter="," if fmt == "csv" else "\t"))
        memory = "device memory_bytes"
    targets = known_targets()
    assert [r["name"] for r in rows] == list(targets)
    for r in rows:
        t = targets[r["name"]]
        assert (int(r["tiles"]), int(r["bytes per tile"]), int(r[memory])) == (t.tiles, t.bytes_per_tile,
                                                                               t.device_bytes)
        assert r["kind"] == t.kind and r["description"] == t.description


# --------------------------------------------------------------------------------------------------
# Bad input

def test_missing_file(capsys, tmp_path):
    missing = tmp_path / "nothing.json"
    assert_one_line_error(*run(capsys, "breakdown", missing), f"stagesplit: error: {missing}: no such file")


def test_a_folder(capsys, tmp_path):
    assert_one_line_error(*run(capsys, "breakdown", tmp_path), f"{tmp_path}: is a folder, expected a profile file")


@pytest.mark.parametrize("content, name, fragment", [
    (bytes(range(256)), "junk.bin", "not a profile"),
    (b"", "empty.json", "not a profile"),
    (b'{"format": "stagesplit-profile", "version": 1, "steps": [', "cut.json", "expected valid JSON"),
    (b"PK\x03\x04 not really a zip", "fake.stagesplit", "expected a stagesplit compact profile"),
    (b'{"format": "stagesplit-profile", "version": 1, "target": "ipu-mk2", "steps": 1, "operations": [], "x": 1}',
     "fields.json", "x: expected a known field"),
], ids=["garbage", "empty", "truncated json", "fake zip", "unknown field"])
def test_garbage_files(capsys, tmp_path, content, name, fragment):
    path = tmp_path / name
    path.write_bytes(content)
    for command in (["breakdown", path], ["convert", path, "-o", tmp_path / "out.json"]):
        line = assert_one_line_error(*run(capsys, *command), fragment)
        assert line.startswith(f"stagesplit: error: {path}: ")
    assert sorted(os.listdir(tmp_path)) == [name]


def test_bad_regex(capsys):
    assert_one_line_error(*run(capsys, "breakdown", BERT, "--layer-regex", "("),
                          "invalid --layer-regex '(': missing ), unterminated subpattern")


def test_regex_matching_nothing(capsys):
    assert_one_line_error(*run(capsys, "breakdown", BERT, "--layer-regex", r"stage(\d+)"),
                          r"the layer regex 'stage(\d+)' matched no operation or input name")


@pytest.mark.parametrize("argv, fragment", [
    (["breakdown", BERT, "--bogus"], "unrecognized arguments: --bogus"),
    (["breakdown", BERT, "--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["breakdown", BERT, "--sections", "totals,peaks"], "--sections: unknown section 'peaks'"),
    (["breakdown", BERT, "--top-tiles", "many"], "argument --top-tiles: expected a whole number >= 0, got 'many'"),
    (["breakdown"], "the following arguments are required: profile"),
    (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
    (["convert", BERT], "the following arguments are required: -o/--output"),
    (["synth", "gpt", "-o", "x.stagesplit", "--target", "ipu-mk9"], "unknown target 'ipu-mk9'"),
    (["breakdown", BERT, "extra.cbor"], "extra.cbor: a debug.cbor file only goes with a PopVision profile.pop"),
], ids=["unknown option", "bad format", "bad section", "bad int", "no profile", "no command", "no output",
        "bad target", "debug with compact"])
def test_bad_arguments(capsys, argv, fragment):
    assert_one_line_error(*run(capsys, *argv), fragment)


def test_no_command_prints_help(capsys):
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    assert err.startswith("usage: stagesplit")


def test_debug_shows_the_traceback(capsys, tmp_path):
    missing = tmp_path / "nothing.json"
    code, out, err = run(capsys, "--debug", "breakdown", missing)
    assert code == 2 and out == ""
    assert "Traceback (most recent call last):" in err
    assert "StagesplitError" in err
    assert err.splitlines()[-1] == f"stagesplit: error: {missing}: no such file"


def console_script() -> str:
    """The installed ``stagesplit`` script: the checkout's .venv, else beside this interpreter."""
    script = ROOT / ".venv" / "bin" / "stagesplit"
    if not script.exists():
        script = Path(sys.executable).parent / "stagesplit"
    assert script.exists(), "the stagesplit console script is not installed"
    return str(script)


def test_console_script():
    done = subprocess.run([console_script(), "breakdown", "profiles/bert-base.stagesplit", "--sections", "totals"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("Memory totals by category (whole profile as one stage; summed over tiles)\n")
    assert done.stdout == render(Breakdown.of(Analysis.load(BERT).model).tables(("totals",)), "text")


def test_console_script_error_status():
    done = subprocess.run([console_script(), "breakdown", "no-such-profile.json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "stagesplit: error: no-such-profile.json: no such file\n"


def test_a_run_declares_its_own_command_as_the_whole_parser_does():
    """The command line declares only the arguments of the command it runs (cli/parser.py
    ``build_parser(only=...)``): each command's help, hence every argument, equals the whole
    parser's, and the list of commands is the same."""
    from stagesplit.cli.parser import build_parser, command_word

    def subparsers(parser):
        return parser._subparsers._group_actions[0].choices           # argparse's own table
    whole = subparsers(build_parser())
    for name, full in whole.items():
        alone = build_parser(only=name)
        assert list(subparsers(alone)) == list(whole)
        assert subparsers(alone)[name].format_help() == full.format_help(), name
    assert command_word(["--debug", "solve", "x.json", "--devices", "4"]) == "solve"
    assert command_word(["--version"]) is None
