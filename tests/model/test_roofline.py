"""Roofline compute time (stagesplit/roofline.py): hand-computed compute- and memory-bound
operations, --target overriding the profile's device (issue 9 item 7), --efficiency."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagesplit.cli import main
from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.compact import read_compact, write_compact
from stagesplit.io.jsonprofile import profile_from_document, profile_to_document
from stagesplit.io.profile import Target
from stagesplit.io.targets import load_target
from stagesplit.model.analysis import Analysis
from stagesplit.model.roofline import apply_roofline, roofline

GPU = Target("gpu", tiles=1, bytes_per_tile=10**9, kind="gpu", flops_per_s=1e12, memory_bytes_per_s=1e11)


def two_layer_profile(target: Target = GPU, with_bytes: bool = True):
    """layers.0/mm: 4e9 FLOPs, 1e8 bytes  -> compute 4e9/1e12 = 4 ms, memory 1e8/1e11 = 1 ms: compute-bound
    layers.1/add: 1e6 FLOPs, 6e8 bytes  -> compute 1e6/1e12 = 1 us, memory 6e8/1e11 = 6 ms: memory-bound
    layers.1/gelu: 2e9 FLOPs, bytes unknown -> compute 2 ms only."""
    b = ProfileBuilder(target, 3, compute_unit="flops")
    v = [b.variable(1000, 0, [(i, i + 1)], name=f"t{i}") for i in range(3)]
    b.operation("layers.0/mm", 0, 0, vars=[v[0]], compute=4e9, bytes_accessed=1e8 if with_bytes else np.nan)
    b.operation("layers.1/add", 1, 1, vars=[v[1]], compute=1e6, bytes_accessed=6e8 if with_bytes else np.nan)
    b.operation("layers.1/gelu", 2, 2, vars=[v[2]], compute=2e9)
    return b.build()


def test_hand_computed_compute_and_memory_bound():
    model = Analysis.of(two_layer_profile()).model
    r = roofline(model)
    assert r.op_compute_s == pytest.approx([4e9 / 1e12, 1e6 / 1e12, 2e9 / 1e12])
    assert r.op_memory_s == pytest.approx([1e8 / 1e11, 6e8 / 1e11, 0.0])
    assert r.op_seconds == pytest.approx([4e-3, 6e-3, 2e-3])
    assert r.op_memory_bound.tolist() == [False, True, False]
    assert r.layer_seconds == pytest.approx([4e-3, 6e-3 + 2e-3])
    # layer 1: 6 of its 8 ms are in a memory-bound operation
    assert r.layer_bound == ["compute", "memory"]
    assert r.range_seconds(0, 1) == pytest.approx(12e-3)


def test_efficiency_doubles_compute_bound_time_only():
    model = Analysis.of(two_layer_profile()).model
    r = roofline(model, efficiency=0.5)
    # mm: 8 ms of arithmetic beats 1 ms of memory; add stays 6 ms memory-bound; gelu 4 ms
    assert r.op_seconds == pytest.approx([8e-3, 6e-3, 4e-3])
    with pytest.raises(Exception, match="efficiency"):
        roofline(model, efficiency=0.0)


def test_without_bytes_time_is_flops_over_rate_and_plain_path_kept():
    model = Analysis.of(two_layer_profile(with_bytes=False)).model
    r = apply_roofline(model)
    assert r.layer_seconds == pytest.approx([4e9 / 1e12, (1e6 + 2e9) / 1e12])
    assert model.layer_time_s is None        # same as compute x 1/flops_per_s: the solver's plain path
    apply_roofline(model, efficiency=0.5)
    assert model.layer_time_s == pytest.approx([8e-3, 2 * (1e6 + 2e9) / 1e12])


def test_bytes_accessed_round_trips(tmp_path):
    p = two_layer_profile()
    q = profile_from_document(json.loads(json.dumps(profile_to_document(p))), "mem.json")
    assert np.array_equal(q.operations.bytes_accessed, p.operations.bytes_accessed, equal_nan=True)
    assert q.target.memory_bytes_per_s == 1e11
    write_compact(p, tmp_path / "p.stagesplit")
    c = read_compact(tmp_path / "p.stagesplit")
    assert np.array_equal(c.operations.bytes_accessed, [1e8, 6e8, np.nan], equal_nan=True)
    assert c.target.memory_bytes_per_s == 1e11


def test_compact_without_bytes_loads_as_unknown(tmp_path):
    write_compact(two_layer_profile(with_bytes=False), tmp_path / "old.stagesplit")
    c = read_compact(tmp_path / "old.stagesplit")
    assert np.isnan(c.operations.bytes_accessed).all() and len(c.operations.bytes_accessed) == 3


def test_targets_have_memory_bandwidth():
    assert load_target("a100-80gb").memory_bytes_per_s == 2.039e12
    assert load_target("a100-40gb").memory_bytes_per_s == 1.555e12
    assert load_target("h100-80gb").memory_bytes_per_s == 3.35e12


def _stage_times(capsys, path, *extra):
    code = main(["solve", str(path), "--devices", "2", "--format", "json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [s["time_s"] for s in json.loads(out)["plan"]["stages"]] if "plan" in json.loads(out) else \
        [s["time_s"] for s in json.loads(out)["stages"]]


def test_target_overrides_profile_device_for_flops(tmp_path, capsys):
    """Issue 9 item 7: a FLOP profile captured on an A100 must report H100 times for an H100 target."""
    a100 = load_target("a100-80gb")
    path = tmp_path / "a100.stagesplit"
    write_compact(two_layer_profile(a100, with_bytes=False), path)
    on_a100 = _stage_times(capsys, path)
    on_h100 = _stage_times(capsys, path, "--target", "h100-80gb")
    assert on_a100 == pytest.approx([4e9 / 312e12, (1e6 + 2e9) / 312e12])
    ratio = load_target("h100-80gb").flops_per_s / a100.flops_per_s
    assert np.array(on_a100) / np.array(on_h100) == pytest.approx([ratio, ratio])
    half = _stage_times(capsys, path, "--target", "h100-80gb", "--efficiency", "0.5")
    assert half == pytest.approx([2 * t for t in on_h100])


def test_breakdown_shows_bound(tmp_path, capsys):
    path = tmp_path / "p.stagesplit"
    write_compact(two_layer_profile(), path)
    assert main(["breakdown", str(path), "--sections", "layers", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert "memory" in out and "time (ms)" in out
