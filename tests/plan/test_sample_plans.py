"""The shipped samples' plans do not change when the pricing and the solvers are made faster.

``tests/data/plans/sample-splits.json`` was recorded by the code before the banded pricing, the
closed-form per-layer costs and the reorganised DP (commit 29004b5, ``python
tests/plan/test_sample_plans.py --record``): for each sample (the shipped profiles, two
reproducers and two generated per-layer profiles) and each of several option sets, the split, the
status and every objective phase's value and bound. The test solves them again and compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / "data" / "plans" / "sample-splits.json"

#: (profile, devices): the shipped samples, two one-tile reproducers, two generated per-layer profiles
PROFILES = (("profiles/bert-base.stagesplit", 4), ("profiles/gpt.stagesplit", 8), ("profiles/cnn.stagesplit", 4),
            ("profiles/llama-7b-layers.json", 4), ("profiles/tiny.json", 2),
            ("tests/data/reproducers/stash-overlap-a.json", 2), ("tests/data/reproducers/comm-stall.json", 3),
            ("layers:40:3", 6), ("layers:90:11", 12))


def option_sets(path: str, n: int) -> dict[str, dict]:
    """Named option sets for a profile solved on ``n`` devices."""
    sets = {
        "default": {"devices": n},
        "memory": {"devices": n, "objective": "memory"},
        "devices": {"devices": 2 * n, "objective": "devices"},
        "1f1b": {"devices": n, "schedule": "1f1b", "micro_batches": 2 * n},
        "gpipe": {"devices": n, "schedule": "gpipe", "micro_batches": 3},
        "exact": {"devices": n, "exact": True},
        "limits": {"devices": n, "min_layers": 2, "headroom": 0.1},
        "communication": {"devices": n, "communication": True, "link_bandwidth": 2e9},
    }
    if path.endswith(".json") and "llama" in path or path.startswith("layers:"):
        sets["mixed"] = {"devices": n, "targets": tuple("a100-80gb" if i % 3 else "a100-40gb" for i in range(n))}
        sets["mixed-1f1b"] = {**sets["mixed"], "schedule": "1f1b", "micro_batches": n + 2}
        sets["mixed-devices"] = {**sets["mixed"], "objective": "devices"}
        sets["mixed-memory"] = {"devices": n + 3, "objective": "memory",
                                "targets": tuple("a100-40gb" if i % 2 else "a100-80gb" for i in range(n + 3))}
        sets["pins"] = {"devices": n, "pin_layers": (("middle", n // 2),), "schedule": "1f1b", "micro_batches": n}
    return sets


def load(path: str):
    """A profile (a file, or ``layers:L:seed``: a random per-layer profile of L layers on an 80 GB GPU)."""
    from stagesplit import api
    if not path.startswith("layers:"):
        return api.analyze(ROOT / path)
    from stagesplit.io.layerform import LayerSpec, build_layer_profile
    from stagesplit.io.targets import load_target
    _, layers, seed = path.split(":")
    rng = np.random.default_rng(int(seed))
    specs = [LayerSpec(f"block{i}", weights=int(rng.integers(500, 3000)) * 2**20,
                       activations=int(rng.integers(100, 1000)) * 2**20, output=int(rng.integers(40, 160)) * 2**20,
                       workspace=int(rng.integers(0, 300)) * 2**20, compute=float(rng.integers(50, 400)) * 1e12)
             for i in range(int(layers))]
    return api.analyze(build_layer_profile(specs, load_target("a100-80gb"), training=True))


def solve_all() -> dict[str, dict]:
    from stagesplit import api
    out = {}
    for path, n in PROFILES:
        analysis = load(path)
        for name, opts in option_sets(path, n).items():
            opts = dict(opts)
            if "pin_layers" in opts:
                names = analysis.model.layers.names
                opts["pin_layers"] = tuple((names[len(names) // 2], d) for _, d in opts["pin_layers"])
            try:
                plan = api.solve(analysis, time_limit=30, **opts)
            except Exception as exc:                       # an option the profile cannot take: recorded as such
                out[f"{path} {name}"] = {"error": type(exc).__name__}
                continue
            out[f"{path} {name}"] = {
                "status": plan.status, "feasible": plan.feasible,
                "stages": [[s.device, s.first_layer, s.last_layer] for s in plan.stages],
                "phases": [[p.quantity, p.status, p.solver_value, p.solver_bound] for p in plan.phases]}
    return out


@pytest.mark.slow
def test_sample_plans_are_unchanged():
    recorded = json.loads(RECORD.read_text())
    now = solve_all()
    assert now.keys() == recorded.keys()
    differences = [f"{key}: {recorded[key]} -> {now[key]}" for key in recorded if now[key] != recorded[key]]
    assert not differences, "\n".join(differences)


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORD.write_text(json.dumps(solve_all(), indent=1) + "\n")
