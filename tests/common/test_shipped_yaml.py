"""configs/parsed.json: the shipped YAML settings' parsed twin (common/shippedyaml.py).

The twin must be what its command writes from the YAML beside it, must give the document the
strict YAML reader gives, and must be ignored the moment the YAML differs from what it was
built from (a user editing configs/targets.yaml in a checkout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stagesplit.common.safeinput import read_yaml_file
from stagesplit.common.shippedyaml import TWIN_NAME, TWINNED, read_shipped_yaml, twin_document, twin_text
from stagesplit.io.targets import config_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_twin_is_what_its_command_writes():
    folder = ROOT / "configs"
    assert (folder / TWIN_NAME).read_text() == twin_text(folder), (
        "configs/parsed.json is stale: run `python -m stagesplit.common.shippedyaml configs`")
    assert sorted(json.loads((folder / TWIN_NAME).read_text())["files"]) == sorted(TWINNED)


def test_the_command_writes_the_twin(tmp_path):
    folder = _copy(tmp_path)
    (folder / TWIN_NAME).unlink()
    out = subprocess.run([sys.executable, "-m", "stagesplit.common.shippedyaml", str(folder)], capture_output=True,
                         text=True, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout == f"wrote {folder / TWIN_NAME}\n"
    assert (folder / TWIN_NAME).read_text() == (ROOT / "configs" / TWIN_NAME).read_text()


@pytest.mark.parametrize("name", TWINNED)
def test_the_twin_gives_the_strict_readers_document(name):
    path = config_dir() / name
    found, document = twin_document(path, path.read_bytes())
    assert found
    assert document == read_yaml_file(path) == read_shipped_yaml(path)


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", folder)
    return folder


def test_an_edited_yaml_is_parsed_not_read_from_its_twin(tmp_path):
    folder = _copy(tmp_path)
    path = folder / "solver.yaml"
    text = path.read_text()
    assert "time_limit: 60" in text
    path.write_text(text.replace("time_limit: 60", "time_limit: 7", 1))
    assert twin_document(path, path.read_bytes()) == (False, None)
    assert read_shipped_yaml(path)["time_limit"] == 7
    # a change that keeps the length (the digest is of the bytes, not their size)
    path.write_text(text.replace("time_limit: 60", "time_limit: 61", 1))
    assert read_shipped_yaml(path)["time_limit"] == 61


@pytest.mark.parametrize("twin", ["", "{", "[]", '{"files": {"solver.yaml": []}}',
                                  '{"files": {"solver.yaml": {"blake2b": 1}}}', "\udcff"])
def test_a_broken_twin_is_passed_over(tmp_path, twin):
    folder = _copy(tmp_path)
    (folder / TWIN_NAME).write_text(twin, errors="surrogateescape")
    path = folder / "solver.yaml"
    assert twin_document(path, path.read_bytes()) == (False, None)
    assert read_shipped_yaml(path) == read_yaml_file(ROOT / "configs" / "solver.yaml")


def test_a_twin_larger_than_a_settings_file_may_be_is_not_read(tmp_path):
    from stagesplit.common.limits import MAX_CONFIG_BYTES
    folder = _copy(tmp_path)
    twin = json.loads((folder / TWIN_NAME).read_text())
    twin["padding"] = " " * MAX_CONFIG_BYTES                    # still a valid twin, but too large to be read
    (folder / TWIN_NAME).write_text(json.dumps(twin))
    path = folder / "solver.yaml"
    assert twin_document(path, path.read_bytes()) == (False, None)
    assert read_shipped_yaml(path) == read_yaml_file(ROOT / "configs" / "solver.yaml")


def test_no_twin_no_change(tmp_path):
    folder = _copy(tmp_path)
    (folder / TWIN_NAME).unlink()
    for name in TWINNED:
        assert read_shipped_yaml(folder / name) == read_yaml_file(ROOT / "configs" / name)


def test_a_document_json_would_change_is_not_twinned(tmp_path):
    folder = _copy(tmp_path)
    (folder / "solver.yaml").write_text("time_limit: .inf\n")          # no JSON number is infinite
    (folder / "targets.yaml").write_text("{1: a}\n")                    # an integer key JSON makes a string
    assert json.loads(twin_text(folder))["files"] == {}


def test_a_solve_from_the_shipped_settings_does_not_import_pyyaml(tmp_path):
    """Issue 31: PyYAML's import was a tenth of a small solve's CPU time."""
    code = ("import sys\nfrom stagesplit.cli import main\n"
            f"rc = main(['solve', 'profiles/llama-7b-layers.json', '--devices', '4', '--out', {str(tmp_path / 'p.json')!r}])\n"
            "print(rc, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split()[-2:] == ["0", "False"]
    assert json.loads((tmp_path / "p.json").read_text())["status"] == "optimal"
