"""The ONNX recipe as documented (docs/commands.md, ``import``): examples/make_gpt_onnx.py writes
gpt.onnx from examples/gpt.py with the pinned torch (``dynamo=False``: no onnxscript needed),
and stagesplit imports and solves it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stagesplit.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_script_makes_gpt_onnx_that_stagesplit_imports(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "make_gpt_onnx.py"), "-o", "gpt.onnx",
                           "--layers", "3"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "wrote gpt.onnx"
    capsys.readouterr()
    assert main(["import", str(tmp_path / "gpt.onnx"), "-o", str(tmp_path / "gpt.stagesplit"), "--batch", "4"]) == 0
    err = capsys.readouterr().err
    assert ", 3 layers, " in err and "training: adam" in err
    assert main(["solve", str(tmp_path / "gpt.stagesplit"), "--devices", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("kept back per device: CUDA context") and lines[3] == "split: [ 0 | 1 | 2 ]"
