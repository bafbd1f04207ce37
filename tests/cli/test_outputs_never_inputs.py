"""No output replaces a file the command reads: ``report -o``, ``solve --out``, ``export -o`` and
``capture -o`` go through one check (``io.variants.input_files`` then ``guards.check_outputs``),
which counts the profiles a variants file lists as inputs too. Each refusal is one line, exit 2,
and leaves every file as it was. And a report drawn over a profile whose bytes differ from the
ones its plan records says so, in one line naming both files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import stagesplit
from stagesplit.cli import main
from stagesplit.io.variants import input_files

TARGET = {"name": "toy-ipu", "kind": "ipu", "tiles": 1, "bytes_per_tile": 100_000, "clock_hz": 1e9}
WEIGHTS = [40_000, 40_000, 50_000]


def profile_document(workspace, compute) -> dict:
    return {"format": "stagesplit-profile", "version": 1, "kind": "layers", "name": "toy", "target": TARGET,
            "training": False, "compute_unit": "cycles",
            "layers": [{"name": f"layer{i}", "weights": WEIGHTS[i], "workspace": workspace[i], "compute": compute[i]}
                       for i in range(3)]}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """fast.json and slow.json (two compiles of one 3-layer model), variants.yaml listing both,
    and plan.json solved on them for 2 IPUs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fast.json").write_text(json.dumps(profile_document([30_000, 30_000, 40_000], [100, 100, 120])))
    (tmp_path / "slow.json").write_text(json.dumps(profile_document([10_000, 10_000, 10_000], [150, 150, 320])))
    (tmp_path / "variants.yaml").write_text("variants:\n  - {profile: fast.json, proportion: 0.6}\n"
                                            "  - {profile: slow.json, proportion: 0.2}\n")
    assert main(["solve", "variants.yaml", "--devices", "2", "--out", "plan.json"]) == 0
    return tmp_path


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def refused(capsys, folder: Path, *argv) -> str:
    """The one error line of ``argv``, after checking that it exits 2 and changes no file."""
    capsys.readouterr()
    before = digests(folder)
    assert main([str(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("stagesplit: error: "), err
    assert digests(folder) == before                   # nothing written, nothing replaced
    return err.strip().removeprefix("stagesplit: error: ")


def test_report_never_replaces_a_profile_its_variants_file_lists(toy, capsys):
    message = refused(capsys, toy, "report", "plan.json", "variants.yaml", "-o", "fast.json")
    assert message == ("--output fast.json: is also an input (fast.json); writing it would destroy that input: "
                       "choose another file name")
    # through another spelling of the same file too
    assert refused(capsys, toy, "report", "plan.json", "variants.yaml", "-o", "./slow.json").startswith(
        "--output ./slow.json: is also an input (slow.json)")
    # and the plan, the variants file itself
    assert "is also an input (plan.json)" in refused(capsys, toy, "report", "plan.json", "variants.yaml", "-o",
                                                     "plan.json")
    assert "is also an input (variants.yaml)" in refused(capsys, toy, "report", "plan.json", "variants.yaml", "-o",
                                                         "variants.yaml")
    # a name no input has is written
    assert main(["report", "plan.json", "variants.yaml", "-o", "r.html"]) == 0 and (toy / "r.html").exists()


def test_the_python_report_never_replaces_a_variant(toy):
    before = (toy / "slow.json").read_bytes()
    with pytest.raises(stagesplit.StagesplitError, match=r"is also an input \(slow.json\)"):
        stagesplit.report("plan.json", "slow.json", ["fast.json=0.6", "slow.json=0.2"])
    with pytest.raises(stagesplit.StagesplitError, match=r"is also an input \(fast.json\)"):
        stagesplit.report("plan.json", "fast.json", [("fast.json", 0.6), ("slow.json", 0.2)])
    with pytest.raises(stagesplit.StagesplitError, match=r"is also an input \(slow.json\)"):
        stagesplit.report("plan.json", "slow.json", "variants.yaml")
    assert (toy / "slow.json").read_bytes() == before


def test_solve_out_and_plot_never_replace_a_listed_variant(toy, capsys):
    assert "--out slow.json: is also an input (slow.json)" in refused(capsys, toy, "solve", "variants.yaml",
                                                                      "--devices", "2", "--out", "slow.json")
    assert "--out fast.json: is also an input (fast.json)" in refused(capsys, toy, "solve", "fast.json=0.6",
                                                                      "slow.json=0.2", "--devices", "2", "--out",
                                                                      "fast.json")


def test_export_never_replaces_its_plan(toy, capsys):
    assert refused(capsys, toy, "export", "plan.json", "--to", "poptorch", "-o", "plan.json") == (
        "--output plan.json: is also an input (plan.json); writing it would destroy that input: choose another "
        "file name")


def test_capture_never_replaces_its_model_file(toy, capsys):
    (toy / "model.py").write_text("def build():\n    raise SystemExit('never run')\n")
    assert refused(capsys, toy, "capture", "model.py:build", "-o", "model.py").startswith(
        "--output model.py: is also an input (model.py)")


def test_input_files_lists_a_variants_files_profiles_and_debug_files(tmp_path):
    (tmp_path / "v.yaml").write_text("variants:\n  - {profile: a/p.pop, proportion: 0.2, debug: a/d.cbor}\n"
                                     "  - {profile: q.json, proportion: 0.4}\n")
    assert input_files([str(tmp_path / "v.yaml"), None, "x.json"]) == [
        str(tmp_path / "v.yaml"), str(tmp_path / "a/p.pop"), str(tmp_path / "a/d.cbor"), str(tmp_path / "q.json"),
        "x.json"]
    (tmp_path / "bad.yaml").write_text("variants: 3\n")               # unreadable: its own read says why, later
    assert input_files([str(tmp_path / "bad.yaml")]) == [str(tmp_path / "bad.yaml")]


# -- a plan drawn over another profile --------------------------------------------------------------

def test_a_report_over_a_profile_with_other_bytes_warns_naming_both(toy, capsys):
    assert main(["solve", "slow.json", "--devices", "2", "--out", "one.json"]) == 0
    other = profile_document([10_000, 10_000, 10_000], [150, 150, 330])        # the same layers, one figure more
    (toy / "other.json").write_text(json.dumps(other))
    recorded = hashlib.sha256((toy / "slow.json").read_bytes()).hexdigest()
    now = hashlib.sha256((toy / "other.json").read_bytes()).hexdigest()
    capsys.readouterr()
    assert main(["report", "one.json", "other.json", "-o", "r.html"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"stagesplit: warning: other.json is not the profile one.json was solved on: its SHA-256 is "
                   f"{now[:12]}..., the plan records {recorded[:12]}...; the page mixes the plan's figures with this "
                   "profile's", "wrote r.html"]
    # the profile it was solved on: no warning
    assert main(["report", "one.json", "slow.json", "-o", "r.html"]) == 0
    assert capsys.readouterr().err.splitlines() == ["wrote r.html"]


def test_a_variants_report_over_other_bytes_names_the_variant(toy, capsys):
    doc = json.loads((toy / "fast.json").read_text())
    doc["layers"][0]["compute"] = 101
    (toy / "fast.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["report", "plan.json", "variants.yaml", "-o", "r.html"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith(
        "stagesplit: warning: fast.json is not the profile plan.json was solved on: its SHA-256 is ")
