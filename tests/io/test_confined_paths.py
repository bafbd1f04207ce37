"""Issue 34: a path that a file names (an ONNX model's external data, a variants file's profiles
and debug.cbor, a plan's recorded profile, variants and layer-compute file) is checked before
anything opens it, by one function (common/safeinput.py's ``confined_path``): it must stay in
the folder of the file that names it, ``..`` and symbolic links resolved. A variants file's
paths are relative to it; a plan records paths as they were given to solve (relative to the
folder solve ran in, or absolute), so they must lead inside the current folder or the plan's.

Every refusal is one line naming the file, the field and what was expected; the file that the
path leads to is never opened (a spy on the one reader of input files, ``InputFile``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import refused_line, run_cli
from stagesplit.common import safeinput
from stagesplit.common.safeinput import confined_path
from stagesplit.common.text import short_repr
from stagesplit.errors import ProfileError
from stagesplit.io.variants import read_variants_file

VARIANTS_WITHIN = "the variants file's folder"


def profile_doc(scale: float = 1.0) -> dict:
    """A valid 4-layer profile on a one-tile device (layers 0..3, 10/20/30/40 cycles, times ``scale``)."""
    return {"format": "stagesplit-profile", "version": 1, "kind": "full", "name": "base",
            "target": {"name": "hand", "tiles": 1, "bytes_per_tile": 1000, "clock_hz": 1e9, "link_bytes_per_s": 1e9},
            "steps": 4, "variables": [{"name": f"w{i}", "bytes": 100, "live": "always"} for i in range(4)],
            "operations": [{"name": f"layer{i}/op", "layer": str(i), "first_step": i, "last_step": i, "vars": [i],
                            "compute": scale * 10.0 * (i + 1)} for i in range(4)]}


run, refused = run_cli, refused_line


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Every path opened through the one reader of input files, resolved."""
    paths: list[str] = []
    real = safeinput.InputFile.__init__

    def spy(self, path, what="file"):
        paths.append(os.path.realpath(path))
        real(self, path, what)

    monkeypatch.setattr(safeinput.InputFile, "__init__", spy)
    return paths


@pytest.fixture
def outside(tmp_path) -> Path:
    """A profile outside every folder the tests name (what a hostile path would lead to)."""
    (tmp_path / "outside").mkdir()
    path = tmp_path / "outside" / "secret.json"
    path.write_text(json.dumps(profile_doc()))
    return path


# -- the shared check ------------------------------------------------------------------------------------

def test_confined_path_accepts_what_stays_inside(tmp_path):
    folder = tmp_path / "models"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "w.bin").write_bytes(b"x")
    (folder / "alias.bin").symlink_to(folder / "data" / "w.bin")         # a link that stays inside

    def check(location, **kw):
        return confined_path(location, folder, "m.onnx", "f", "a file", within="its folder", **kw)

    assert check("data/w.bin") == str(folder / "data" / "w.bin")
    assert check("./data/w.bin") == str(folder / "data" / "w.bin")
    assert check("alias.bin") == str(folder / "alias.bin")                # as written: the link kept
    assert check("not-there-yet.bin") == str(folder / "not-there-yet.bin")   # inside: its absence is another check
    assert check(str(folder / "data" / "w.bin"), absolute=True) == str(folder / "data" / "w.bin")
    assert check("data/../alias.bin", absolute=True) == str(folder / "data" / ".." / "alias.bin")
    # a second folder, as a plan's: an absolute path into it
    other = tmp_path / "other"
    other.mkdir()
    assert confined_path(str(other / "p.json"), folder, "plan.json", "profile.path", "a file", within="here",
                         absolute=True, also=((other, "there"),)) == str(other / "p.json")


@pytest.mark.parametrize("location, setup, got", [
    ("../secret.bin", None, "'../secret.bin'"),
    ("sub/../../secret.bin", None, "'sub/../../secret.bin'"),
    ("sub/../w.bin", None, "'sub/../w.bin'"),                      # '..' is refused even where it stays inside
    ("/etc/passwd", None, "'/etc/passwd'"),
    ("C:/w.bin", None, "'C:/w.bin'"),
    ("\\\\server\\w.bin", None, "'\\\\\\\\server\\\\w.bin'"),
    ("", None, "''"),
    ("w.bin\0.txt", None, "'w.bin\\x00.txt'"),
    (7, None, "7"),
    ("link.bin", "link", "'link.bin', which leads outside it"),
    ("linkdir/w.bin", "linkdir", "'linkdir/w.bin', which leads outside it"),
])
def test_confined_path_refuses_what_leaves(tmp_path, location, setup, got):
    folder = tmp_path / "models"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"x")
    if setup == "link":
        (folder / "link.bin").symlink_to(tmp_path / "secret.bin")
    elif setup == "linkdir":
        (folder / "linkdir").symlink_to(tmp_path)
    with pytest.raises(ProfileError) as excinfo:
        confined_path(location, folder, "m.onnx", "graph.initializer[w].external_data.location", "a file",
                      within="the model's folder")
    assert str(excinfo.value) == (f"m.onnx: graph.initializer[w].external_data.location: expected a relative path "
                                  f"to a file inside the model's folder ('{folder}'), got {got}")


def test_absolute_paths_outside_every_folder_are_refused(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    with pytest.raises(ProfileError) as excinfo:
        confined_path("/etc/passwd", here, "plan.json", "profile.path", "a file", within="the current folder",
                      absolute=True, also=((there, "the plan's folder"), (here / ".", "the same folder again")))
    assert str(excinfo.value) == (f"plan.json: profile.path: expected a path to a file inside the current folder "
                                  f"('{here}') or the plan's folder ('{there}'), got '/etc/passwd', which leads "
                                  "outside them")


# -- variants files ---------------------------------------------------------------------------------------

def _variants_file(tmp_path: Path, second: str, extra: str = "") -> Path:
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "a.json").write_text(json.dumps(profile_doc()))
    (folder / "b.json").write_text(json.dumps(profile_doc(2.0)))
    path = folder / "variants.yaml"
    path.write_text(f"variants:\n  - {{profile: a.json, proportion: 0.2}}\n"
                    f"  - {{profile: {json.dumps(second)}, proportion: 0.6{extra}}}\n")
    return path


@pytest.mark.parametrize("location, setup", [
    ("../../../../etc/passwd", None), ("/etc/passwd", None), ("../outside/secret.json", None),
    ("{outside}", None), ("link.json", "link"), ("linkdir/secret.json", "linkdir"),
    ("sub/../../outside/secret.json", None),
])
def test_variants_file_paths_leaving_its_folder_are_refused_unopened(capsys, tmp_path, opened, outside, location,
                                                                      setup):
    location = location.format(outside=outside)
    path = _variants_file(tmp_path, location)
    if setup == "link":
        (path.parent / "link.json").symlink_to(outside)
    elif setup == "linkdir":
        (path.parent / "linkdir").symlink_to(outside.parent)
    got = f"'{location}', which leads outside it" if setup else short_repr(location, 60)   # as ProfileError bounds it
    assert refused(capsys, "solve", path, "--devices", 2, "--out", tmp_path / "plan.json") == (
        f"{path}: variants[1].profile: expected a relative path to a profile inside {VARIANTS_WITHIN} "
        f"('{path.parent}'), got {got}")
    assert str(outside) not in opened and "/etc/passwd" not in opened
    assert opened and set(opened) == {str(path.resolve())}            # the variants file alone
    assert not (tmp_path / "plan.json").exists()


def test_variants_debug_leaving_its_folder_is_refused(tmp_path):
    path = _variants_file(tmp_path, "b.pop", extra=", debug: ../debug.cbor")
    with pytest.raises(ProfileError) as excinfo:
        read_variants_file(path)
    assert str(excinfo.value) == (f"{path}: variants[1].debug: expected a relative path to a debug.cbor inside "
                                  f"{VARIANTS_WITHIN} ('{path.parent}'), got '../debug.cbor'")


def test_variants_file_paths_inside_its_folder_still_solve(capsys, tmp_path):
    path = _variants_file(tmp_path, "alias.json")
    (path.parent / "alias.json").symlink_to(path.parent / "b.json")       # a link that stays inside
    assert [v.path for v in read_variants_file(path)] == [str(path.parent / "a.json"), str(path.parent / "alias.json")]
    code, out, err = run(capsys, "solve", path, "--devices", 2)
    assert code == 0, err
    assert "profile variants (memory proportion): a.json (0.2), alias.json (0.6)" in out


# -- plans ----------------------------------------------------------------------------------------------

@pytest.fixture
def workdir(tmp_path, monkeypatch, capsys) -> Path:
    """A folder to run in, with a profile and a plan solved on it (recording 'base.json')."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    (folder / "base.json").write_text(json.dumps(profile_doc()))
    assert run(capsys, "solve", "base.json", "--devices", 2, "--out", "plan.json")[0] == 0
    assert json.loads((folder / "plan.json").read_text())["profile"]["path"] == "base.json"
    return folder


def _edited(folder: Path, **changes) -> Path:
    doc = json.loads((folder / "plan.json").read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        doc[section][field] = value
    path = folder / "edited.json"
    path.write_text(json.dumps(doc))
    return path


HINT = "; give the profile after the plan (stagesplit solve --from-plan PLAN PROFILE) if it is the one you mean"


@pytest.mark.parametrize("location, setup", [
    ("../../../../etc/passwd", None), ("/etc/passwd", None), ("{outside}", None), ("../outside/secret.json", None),
    ("link.json", "link"), ("linkdir/secret.json", "linkdir"),
])
def test_plan_profile_path_leaving_is_refused_unopened(capsys, workdir, opened, outside, location, setup):
    location = location.format(outside=outside)
    if setup == "link":
        (workdir / "link.json").symlink_to(outside)
    elif setup == "linkdir":
        (workdir / "linkdir").symlink_to(outside.parent)
    plan = _edited(workdir, profile__path=location)
    opened.clear()
    assert refused(capsys, "solve", "--from-plan", plan, "--out", workdir / "again.json") == (
        f"{plan}: profile.path: expected a path to a file inside the current folder ('.'), got '{location}', "
        f"which leads outside it{HINT}")
    assert set(opened) == {str(plan)}                                  # the plan alone
    assert not (workdir / "again.json").exists()
    # the profile given after the plan is used instead: the same split again
    code, out, err = run(capsys, "solve", "--from-plan", plan, "base.json")
    assert code == 0, err
    assert out.rstrip().splitlines()[-1] == f"reproduced: the split is identical to {plan}'s [ 0 1 2 | 3 ]"


def test_plan_in_another_folder_may_name_a_profile_there(capsys, workdir, tmp_path):
    """A plan records a path as given to solve: one into the plan's own folder is read from
    anywhere; the message of one that leads out names both folders."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "base.json").write_text((workdir / "base.json").read_text())
    plan = _edited(workdir, profile__path=str(elsewhere / "base.json"))
    moved = elsewhere / "plan.json"
    plan.rename(moved)
    code, out, err = run(capsys, "solve", "--from-plan", moved)
    assert code == 0, err
    assert out.rstrip().splitlines()[-1] == f"reproduced: the split is identical to {moved}'s [ 0 1 2 | 3 ]"
    doc = json.loads(moved.read_text())
    doc["profile"]["path"] = str(tmp_path / "base.json")
    moved.write_text(json.dumps(doc))
    assert refused(capsys, "solve", "--from-plan", moved) == (
        f"{moved}: profile.path: expected a path to a file inside the current folder ('.') or the plan's folder "
        f"('{elsewhere}'), got '{tmp_path / 'base.json'}', which leads outside them{HINT}")


def test_plan_variant_paths_leaving_are_refused(capsys, workdir, opened):
    (workdir / "b.json").write_text(json.dumps(profile_doc(2.0)))
    assert run(capsys, "solve", "base.json=0.2", "b.json=0.6", "--devices", 2, "--out", "plan.json")[0] == 0
    doc = json.loads((workdir / "plan.json").read_text())
    assert [v["path"] for v in doc["variants"]] == ["base.json", "b.json"]
    doc["variants"][1]["path"] = "../../../../etc/passwd"
    (workdir / "plan.json").write_text(json.dumps(doc))
    opened.clear()
    assert refused(capsys, "solve", "--from-plan", "plan.json") == (
        "plan.json: variants[1].path: expected a path to a file inside the current folder ('.'), got "
        f"'../../../../etc/passwd', which leads outside it{HINT}")
    assert set(opened) == {str(workdir / "plan.json")}


def test_plan_layer_compute_source_leaving_is_not_read(capsys, workdir, monkeypatch, outside):
    """The layer compute figures are in the plan; the file they came from is only hashed for the
    new plan's record: one that leads out is not read, and the user is told."""
    from stagesplit.common import fileio
    hashed: list[str] = []
    real = fileio.file_sha256
    monkeypatch.setattr(fileio, "file_sha256", lambda path: hashed.append(str(path)) or real(path))
    (workdir / "lc.yaml").write_text("'0': 10\n")
    plan = _edited(workdir, request__layer_compute_source="lc.yaml")
    code, out, err = run(capsys, "solve", "--from-plan", plan, "--out", "again.json")
    assert code == 0 and "warning" not in err, err
    assert hashed == ["lc.yaml"]                                         # inside: hashed for the record
    record = json.loads((workdir / "again.json").read_text())
    assert record["request"]["layer_compute_source"] == "lc.yaml" and record["resolved"]["layer_compute_sha256"]
    hashed.clear()
    plan = _edited(workdir, request__layer_compute_source=str(outside))
    code, out, err = run(capsys, "solve", "--from-plan", plan, "--out", "again.json")
    assert code == 0, err
    assert f"stagesplit: warning: {plan}: request.layer_compute_source '{outside}' leads outside the current " \
           "folder and the plan's: not read" in err
    assert hashed == []
    assert json.loads((workdir / "again.json").read_text())["request"]["layer_compute_source"] is None
