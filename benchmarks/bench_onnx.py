"""ONNX import benchmark (issue 12): import a generated 10,000-node transformer-like ONNX model
(training mode, Adam) and write its compact profile. Targets on a 2-core machine: under 10 s
and under 1 GB peak RSS, measured in a fresh interpreter.

Run from the repository root:  python benchmarks/bench_onnx.py [--tiny]
(``--tiny``: 100 nodes, in seconds.)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from _common import TINY_FLAG, peak_rss_mb, print_table, run_measurement, tiny_mode

TINY = tiny_mode()
# 10 nodes per block: LayerNormalization, MatMul, Add, Relu, MatMul, Add, Mul, Softmax, Add, Identity
BLOCKS = 10 if TINY else 1000
WIDTH = 256
TOKENS = 128


def generate(path: Path) -> int:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TOKENS, WIDTH])
    nodes, inits = [], []
    prev = "x"
    rng = np.random.default_rng(0)
    for i in range(BLOCKS):
        p = f"/model/layers.{i}"
        w1 = numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH), np.float32), f"layers.{i}.w1")
        w2 = numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH), np.float32), f"layers.{i}.w2")
        g = numpy_helper.from_array(np.ones(WIDTH, np.float32) + i, f"layers.{i}.ln.g")
        inits += [w1, w2, g]
        nodes += [helper.make_node("LayerNormalization", [prev, g.name], [f"{p}/ln"], name=f"{p}/ln/LayerNorm", axis=-1),
                  helper.make_node("MatMul", [f"{p}/ln", w1.name], [f"{p}/h1"], name=f"{p}/mlp/MatMul"),
                  helper.make_node("Add", [f"{p}/h1", prev], [f"{p}/a1"], name=f"{p}/mlp/Add"),
                  helper.make_node("Relu", [f"{p}/a1"], [f"{p}/r"], name=f"{p}/mlp/Relu"),
                  helper.make_node("MatMul", [f"{p}/r", w2.name], [f"{p}/h2"], name=f"{p}/mlp/MatMul_1"),
                  helper.make_node("Add", [f"{p}/h2", f"{p}/a1"], [f"{p}/a2"], name=f"{p}/mlp/Add_1"),
                  helper.make_node("Mul", [f"{p}/a2", f"{p}/a2"], [f"{p}/sq"], name=f"{p}/mlp/Mul"),
                  helper.make_node("Softmax", [f"{p}/sq"], [f"{p}/s"], name=f"{p}/attn/Softmax", axis=-1),
                  helper.make_node("Add", [f"{p}/s", f"{p}/a2"], [f"{p}/o"], name=f"{p}/Add"),
                  helper.make_node("Identity", [f"{p}/o"], [f"{p}/out"], name=f"{p}/Identity")]
        prev = f"{p}/out"
    y = helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(nodes, "bench", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    return len(nodes)


def measure(path: str) -> None:
    from stagesplit.io import save_profile
    from stagesplit.io.onnximport import import_onnx
    from stagesplit.io.targets import load_target
    t0 = time.perf_counter()
    result = import_onnx(path, load_target("a100-80gb"), batch=4, training="adam")
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        save_profile(result.profile, Path(folder) / "bench.stagesplit")
        t2 = time.perf_counter()
    print(json.dumps({"nodes": len(result.nodes), "import_s": t1 - t0, "write_s": t2 - t1, "rss_mb": peak_rss_mb(),
                      "params": result.param_bytes, "variables": len(result.profile.variables)}))


def run_generation(path: Path) -> int:
    import os
    import subprocess

    from _common import ROOT
    proc = subprocess.run([sys.executable, __file__, "--generate", str(path), *([TINY_FLAG] if TINY else [])],
                          capture_output=True, text=True,
                          cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])["nodes"]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        measure(sys.argv[2])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--generate":
        print(json.dumps({"nodes": generate(Path(sys.argv[2]))}))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "bench.onnx")


def run(path: Path) -> None:
    start = time.perf_counter()
    # generated in another process: Linux carries a process's peak RSS over into the children it
    # starts, so the 0.5 GB of weights built here would show in the measurement's figure
    nodes = run_generation(path)
    print(f"generated {nodes:,}-node model ({path.stat().st_size:,} bytes + external data) in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    m = run_measurement(__file__, str(path))
    total = m["import_s"] + m["write_s"]
    print_table(f"ONNX import: {m['nodes']:,} nodes, training (Adam), batch 4", [
        ("nodes", f"{m['nodes']:,}", ""),
        ("variables", f"{m['variables']:,}", ""),
        ("import (read, infer shapes, build)", f"{m['import_s']:.2f} s", ""),
        ("write compact profile", f"{m['write_s']:.2f} s", ""),
        ("total", f"{total:.2f} s", "< 10 s " + ("(met)" if total < 10 else "(MISSED)")),
        ("peak RSS", f"{m['rss_mb']:.0f} MB", "< 1 GB " + ("(met)" if m["rss_mb"] < 1024 else "(MISSED)")),
    ])


if __name__ == "__main__":
    main()
