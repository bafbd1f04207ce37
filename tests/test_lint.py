"""The linters as tests: ruff (the rules in pyproject.toml's [tool.ruff]) on the package, the tests, the
benchmarks and the examples, and mypy (pyproject.toml's [tool.mypy]: strict on solver/, model/ and
plan/) on the package, so that the README's test command runs them. Each runs as its own process,
from the repository root, and writes no cache into the tree."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _installed(module: str) -> None:
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{module} is not installed (it comes with the test extra: pip install '.[test]')")


def test_ruff_is_clean():
    _installed("ruff")
    proc = _run("ruff", "check", "--no-cache", "stagesplit", "tests", "benchmarks", "examples", timeout=300)
    assert proc.returncode == 0, f"ruff check found problems:\n{proc.stdout}{proc.stderr}"


@pytest.mark.slow          # a cold mypy run over the package: about 30 s on 2 cores
def test_mypy_is_clean(tmp_path):
    _installed("mypy")
    cache = tmp_path / "mypy_cache"
    try:
        proc = _run("mypy", "--cache-dir", str(cache), timeout=900)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    assert proc.returncode == 0, f"mypy found problems:\n{proc.stdout}{proc.stderr}"
    assert "Success" in proc.stdout, proc.stdout
