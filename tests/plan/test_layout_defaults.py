"""The layout search's default schedules (plan/layouts.py's ``DEFAULT_SCHEDULES``): 1F1B and interleaved
1F1B, each combination with a pipeline an item under each (interleaved at each chunk count the layers
allow), the answer the one the list given by name finds; the command line says so in its header, and
``sweep --gpus`` searches the same list."""

from __future__ import annotations

import pytest

from stagesplit import api

torch = pytest.importorskip("torch")


def test_the_default_is_1f1b_and_interleaved_1f1b(tmp_path, capsys):
    from linear_stack import linear_stack
    from stagesplit.io import save_profile
    from stagesplit.plan.layouts import DEFAULT_SCHEDULES
    from tests.helpers import run_cli
    assert DEFAULT_SCHEDULES == "1f1b,interleaved-1f1b"
    stack = linear_stack(layers=8)
    kw = dict(target="h100-80gb", gpus=4, global_batch=64, micro_batch_size=8, time_limit=60)
    default = api.layouts(stack, **kw)
    named = api.layouts(stack, schedule="1f1b,interleaved-1f1b", **kw)
    assert default.request.schedule == "1f1b,interleaved-1f1b"
    kinds = {(r.layout.schedule, r.layout.chunks_per_rank) for r in default.rows if r.layout.pp > 1}
    assert {("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4)} <= kinds
    assert [(r.layout, r.status) for r in default.rows] == [(r.layout, r.status) for r in named.rows]
    assert default.best.layout == named.best.layout and default.best.step_s == pytest.approx(named.best.step_s)
    assert default.proven
    path = tmp_path / "stack.json"
    save_profile(stack, path)
    code, out, _ = run_cli(capsys, "layouts", path, "--gpus", 4, "--global-batch", 64, "--micro-batch-size", 8,
                           "--target", "h100-80gb")
    assert code == 0 and out.splitlines()[0].endswith("schedule 1f1b,interleaved-1f1b")
    sweep = api.layout_sweep(stack, gpus="2,4", global_batch=64, micro_batch_size=8, target="h100-80gb",
                             time_limit=60)
    assert all(r.plan.request.schedule == "1f1b,interleaved-1f1b" for r in sweep.rows if r.plan is not None)
