"""The command asks numpy's OpenBLAS for one thread (cli/__init__.py ``_one_blas_thread``): OpenBLAS
starts a thread per core at numpy's import, each spinning about a tenth of a second, and the
command's arrays never need them. Checked in fresh interpreters, where numpy is not yet imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from stagesplit.cli import main
before = len(os.listdir("/proc/self/task"))
try:
    code = main(sys.argv[1:])
except SystemExit as exc:                     # --version: argparse prints it and exits
    code = exc.code
import numpy                                  # imported by the command, or now
print(json.dumps({"code": code, "setting": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "threads": len(os.listdir("/proc/self/task")) - before}))
"""


def _probe(env_extra: dict[str, str], *argv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                             "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], env={**env, **env_extra}, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")


def test_the_command_runs_numpy_on_one_blas_thread(tmp_path):
    from helpers import sample_path
    plan = tmp_path / "plan.json"
    got = _probe({}, "solve", str(sample_path("bert-base")), "--devices", "4", "--out", str(plan))
    assert got["code"] == 0 and plan.exists()
    assert got["setting"] == "1"
    assert got["threads"] == 0                     # no BLAS thread was started


def test_the_users_own_thread_setting_is_left_alone(tmp_path):
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        got = _probe({name: "2"}, "--version")
        assert got["code"] == 0
        assert got["setting"] == ("2" if name == "OPENBLAS_NUM_THREADS" else None)
    if (os.cpu_count() or 1) > 1:                  # OpenBLAS's own threads where the user asks for them
        assert _probe({"OPENBLAS_NUM_THREADS": "2"}, "--version")["threads"] >= 1
