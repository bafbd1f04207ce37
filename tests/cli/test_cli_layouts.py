"""The layout search through ``solve --layout auto`` and ``sweep --gpus`` (issue #32): the same search
as ``stagesplit layouts`` (one engine: ``api.layouts``), its best layout's plan written as ``solve``
writes plans and exported with the layout, the JSON form, bad input in one line (exit 2, nothing
written), and the GPU-count sweep's rows and fewest-GPUs line read back against the searches."""

from __future__ import annotations

import json
import shlex

import pytest

from stagesplit import api
from tests.helpers import refused_line, run_cli

torch = pytest.importorskip("torch")

from linear_stack import linear_stack  # noqa: E402

TINY = ("kind: gpu\ntiles: 1\nbytes_per_tile: 200000\nflops_per_s: 1e14\nlink_bytes_per_s: 1e11\n"
        "node: {gpus_per_node: 8, intra_bytes_per_s: 1e11, intra_latency_s: 0.000003, "
        "inter_bytes_per_s: 1e10, inter_latency_s: 0.000005}\n")


#: the oracles here simulate 1F1B (conftest.py's ``search_under_1f1b``)
pytestmark = pytest.mark.usefixtures("search_under_1f1b")


def _stack(width: int):
    """Four Linear(width, width) layers captured on a micro-batch of 8 (tests/linear_stack.py)."""
    return linear_stack(width=width)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The stack at TP 1, a rank of half its width given as TP 2, and a target of 200,000 bytes."""
    from stagesplit.io import save_profile
    d = tmp_path_factory.mktemp("layouts")
    save_profile(_stack(64), d / "stack.json")
    save_profile(_stack(32), d / "half.json")
    (d / "tiny.yaml").write_text(TINY)
    return d


BASE = ["--global-batch", 32, "--micro-batch-size", 8, "--seq-len", 1, "--target", "h100-80gb"]


def _stages(plan) -> list[tuple[int, int]]:
    return [(s.first_layer, s.last_layer) for s in plan.stages]


def test_solve_layout_auto_is_the_layout_search(files, tmp_path, capsys):
    """solve --layout auto picks the layout and split that layouts picks, writes that plan (its
    request: pp devices, dp, ZeRO, the micro-batches), prints it as solve prints a plan and then
    exactly what layouts prints."""
    from stagesplit.plan.files import read_plan
    from stagesplit.reporting.summary import solve_text
    stack = str(files / "stack.json")
    out = tmp_path / "plan.json"
    code, text, err = run_cli(capsys, "solve", stack, "--layout", "auto", "--gpus", 4, *BASE, "--out", out)
    assert code == 0 and f"wrote {out}" in err
    lp = api.layouts(stack, gpus=4, global_batch=32, micro_batch_size=8, sequence_length=1, target="h100-80gb")
    best = lp.best
    assert best is not None and lp.plan is not None
    plan = read_plan(out)
    r = plan.inputs.request
    assert (plan.devices, r.dp, r.zero, r.micro_batches, r.schedule.value) == (
        best.layout.pp, best.layout.dp, best.layout.zero, best.layout.micro_batches, best.schedule)
    assert plan.profile.tensor_parallel == best.layout.tp == 1
    assert _stages(plan) == _stages(lp.plan)
    assert plan.schedule is not None and plan.schedule.step_time == pytest.approx(best.pipeline_s)
    code, layouts_out, _ = run_cli(capsys, "layouts", stack, "--gpus", 4, *BASE)
    assert code == 0
    head, sep, tail = text.partition("\nlayout search: ")
    assert sep and "layout search: " + tail == layouts_out          # the table: layouts' own, line for line
    # the plan's part: solve's text of that plan (the solver's seconds aside)
    mine = solve_text(lp.plan, stack, True).splitlines()
    got = head.splitlines()
    assert len(got) == len(mine)
    for a, b in zip(got, mine):
        if not a.startswith("status: "):
            assert a == b
    assert f"split: {plan.split_text}" in got


def test_the_export_carries_the_layout(files, tmp_path, capsys):
    """TP 2 (a rank's profile given for degree 2), 2 stages and 2 ZeRO-3 ranks: the plan solve
    --layout auto writes says so, and torchtitan's and Megatron's words carry each degree."""
    from stagesplit.plan.files import read_plan
    out = tmp_path / "plan.json"
    code, _, err = run_cli(capsys, "solve", files / "stack.json", "--layout", "auto", "--gpus", 8, *BASE,
                           "--tp-profile", f"2={files / 'half.json'}", "--tp", 2, "--pp", 2, "--zero", 3, "--out", out)
    assert code == 0, err
    plan = read_plan(out)
    r = plan.inputs.request
    assert (plan.profile.tensor_parallel, plan.devices, r.dp, r.zero) == (2, 2, 2, 3)
    first = [s.last_layer for s in plan.stages][0]
    code, text, _ = run_cli(capsys, "export", out, "--to", "torchtitan")
    assert code == 0
    words = shlex.split([line for line in text.splitlines() if line and not line.startswith("#")][0])
    # the layout, then the capture's precision (float32: torchtitan's default would cast to bfloat16 under FSDP2)
    assert words[:12] == ["--parallelism.tensor_parallel_degree", "2", "--parallelism.no-enable-sequence-parallel",
                          "--parallelism.data_parallel_shard_degree", "2", "--parallelism.fsdp_reshard_after_forward",
                          "always", "--training.dtype", "float32", "--training.mixed_precision_param", "float32",
                          "--parallelism.pipeline_parallel_degree"] and words[12] == "2"
    # global batch 32 = 2 replicas x 2 micro-batches x 8 samples: the export runs the layout's 2
    # micro-batches of 8 per replica (torchtitan's local batch over its micro-batch size, the plan's)
    assert plan.inputs.request.micro_batches == 2 and plan.inputs.micro_batch_size == 8
    assert words[words.index("--training.local_batch_size") + 1] == "16"
    assert words[words.index("--parallelism.pipeline_parallel_microbatch_size") + 1] == "8"
    assert words[words.index("--training.global_batch_size") + 1] == "32"
    assert first in (0, 1, 2)
    code, text, _ = run_cli(capsys, "export", out, "--to", "megatron")
    assert code == 0
    words = shlex.split([line for line in text.splitlines() if line and not line.startswith("#")][0])
    assert words[:3] == ["--tensor-model-parallel-size", "2", "--use-torch-fsdp2"]
    assert words[words.index("--pipeline-model-parallel-size") + 1] == "2"
    assert "# launch 2 x 2 x 2 = 8 processes (pipeline x tensor x data parallel)" in text
    code, _, err = run_cli(capsys, "report", out, "-o", tmp_path / "plan.html")
    assert code == 0 and (tmp_path / "plan.html").exists(), err


def test_json_gives_the_plan_and_every_row(files, tmp_path, capsys):
    from stagesplit.plan.files import read_plan
    from stagesplit.reporting.layouts import layouts_json
    stack = str(files / "stack.json")
    out = tmp_path / "plan.json"
    code, text, _ = run_cli(capsys, "solve", stack, "--layout", "auto", "--gpus", 4, *BASE, "--format", "json",
                            "--out", out)
    assert code == 0
    doc = json.loads(text)
    lp = api.layouts(stack, gpus=4, global_batch=32, micro_batch_size=8, sequence_length=1, target="h100-80gb")
    mine = layouts_json(lp)
    assert [(r["tp"], r["pp"], r["dp"], r["zero"], r["status"]) for r in doc["layouts"]["rows"]] == [
        (r["tp"], r["pp"], r["dp"], r["zero"], r["status"]) for r in mine["rows"]]
    assert doc["layouts"]["best"]["step_s"] == pytest.approx(mine["best"]["step_s"])
    assert doc["layouts"]["tokens_per_s_per_gpu"] == pytest.approx(32 / lp.best.step_s / 4)
    written = json.loads(out.read_text())
    assert doc["plan"]["stages"] == written["stages"] and doc["plan"]["request"] == written["request"]
    assert len(read_plan(out).stages) == lp.best.layout.pp


def test_nothing_fits_writes_no_plan_and_exits_1(files, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, text, err = run_cli(capsys, "solve", files / "stack.json", "--layout", "auto", "--gpus", 1,
                              "--global-batch", 8, "--micro-batch-size", 8, "--target", files / "tiny.yaml",
                              "--out", out)
    assert code == 1 and not out.exists()
    assert f"no plan written to {out}: no layout fits" in err
    assert text.splitlines()[1] == "no layout fits every rank"


@pytest.mark.parametrize("command, flags, line", [
    ("solve", ["--global-batch", 32], "--layout auto: expected the cluster's GPUs (--gpus G) and the samples per step"),
    ("solve", ["--gpus", 4], "--global-batch: --layout auto needs the samples per step (--global-batch B)"),
    ("solve", ["--gpus", 8, "--global-batch", 64, "--tp", 1, "--pp", 3],
     "--tp: tp 1 x pp 3 = 3 does not divide 8 GPUs"),
    ("solve", ["--gpus", 8, "--global-batch", 12], "--global-batch: no layout of 8 GPUs forms a global batch of 12"),
    ("solve", ["--gpus", 12, "--global-batch", 96, "--gpus-per-node", 8],
     "--gpus-per-node: 8 GPUs per node does not divide 12 GPUs"),
    ("solve", ["--gpus", 4, "--global-batch", 32, "--devices", 2],
     "--devices: the layout search chooses the pipeline stages (--pp fixes them)"),
    ("solve", ["--gpus", 4, "--global-batch", 32, "--micro-batches", 4], "--micro-batches: not used by --layout auto"),
    ("solve", ["--gpus", 4, "--global-batch", 32, "--dp", 3], "--dp: dp 3 does not divide 4 GPUs"),
    ("solve", ["--gpus", 4, "--global-batch", 32, "--zero", 5], "--zero: expected"),
    ("sweep", ["--gpus", "3..3", "--global-batch", 32], "--gpus: no power of two lies in 3..3"),
    ("sweep", ["--gpus", "8..64"], "--global-batch: sweep --gpus needs the samples per step"),
    ("sweep", ["--gpus", "8,16", "--global-batch", 12],
     "--global-batch: no layout of 8 GPUs forms a global batch of 12"),
    ("sweep", ["--gpus", "8", "--devices", "2", "--global-batch", 32],
     "--devices: give --devices (pipeline stages) or"),
    ("sweep", [], "--devices: expected device counts like 1..16 (or --gpus 8..64 with --global-batch for layouts)"),
    ("solve-plain", ["--devices", 2, "--global-batch", 32], "--global-batch: an option of the layout search (solve "
     "--layout auto --gpus G)"),
    ("solve-plain", ["--devices", 2, "--gpus", 8], "--gpus: the cluster of the layout search"),
    ("sweep-plain", ["--devices", "1..2", "--tp", 2], "--tp: an option of the layout search (sweep --gpus RANGE)"),
])
def test_bad_input_one_line_exit_2_nothing_written(files, tmp_path, capsys, command, flags, line):
    out = tmp_path / "out.json"
    layout = ["--layout", "auto"] if command == "solve" else []
    batch = [] if command.endswith("-plain") else ["--micro-batch-size", 8]
    got = refused_line(capsys, command.removesuffix("-plain"), files / "stack.json", *layout, *batch, "--target",
                       "h100-80gb", *flags, "--out", out)
    assert got.startswith(line), got
    assert not out.exists()


def test_sweep_rows_are_each_counts_search_and_the_fewest_that_fit(files, capsys):
    """On a 200,000-byte GPU one GPU holds no layout, two do; 8 GPUs form only layouts of more
    stages than micro-batches (refused). Each row is that count's own search (api.layouts), and
    the fewest-GPUs line is the smallest count whose row fits."""
    stack, tiny = files / "stack.json", files / "tiny.yaml"
    base = ["sweep", stack, "--gpus", "1..8", "--global-batch", 32, "--micro-batch-size", 8, "--seq-len", 4,
            "--target", tiny]
    # on a GPU target each solve keeps back the CUDA context (512 MiB by default) and NCCL's buffers,
    # which a 200,000-byte device cannot hold: nothing fits unless they are left out
    code, text, _ = run_cli(capsys, *base, "--format", "json")
    assert code == 0 and [r["fits"] for r in json.loads(text)["rows"]] == [False] * 4
    args = [*base, "--runtime-reserve", "off"]
    code, text, _ = run_cli(capsys, *args, "--format", "json")
    assert code == 0
    doc = json.loads(text)
    assert [r["gpus"] for r in doc["rows"]] == [1, 2, 4, 8]
    code, text, _ = run_cli(capsys, *args, "--wide")
    assert code == 0
    lines = text.splitlines()
    rows = lines[4:-1]
    assert len(rows) == 4
    for g, row, line in zip((1, 2, 4, 8), doc["rows"], rows):
        lp = api.layouts(str(stack), gpus=g, global_batch=32, micro_batch_size=8, sequence_length=4, target=str(tiny),
                         runtime_reserve="off")
        cells = line.split()
        assert cells[0] == str(g) and row["fits"] == (lp.best is not None)
        if lp.best is None:
            statuses = [r.status for r in lp.rows]
            counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
            assert cells[1] == "no" and line.endswith(f"no layout: {counts}")
            continue
        b, lay = lp.best, lp.best.layout
        assert row["layouts"]["best"]["step_s"] == pytest.approx(b.step_s)
        assert cells[1:9] == ["yes", str(lay.tp), str(lay.pp), str(lay.dp), str(lay.zero), str(lay.micro_batches),
                              str(lay.micro_batch_size), b.schedule]
        assert b.chunks_per_rank == 1 and lay.micro_batch_size == 8
        assert cells[9] == f"{b.step_s * 1e3:.3g}"
        assert cells[10] == f"{32 / b.step_s / g:,.3f}"
        assert cells[11] == f"{round(32 * 4 / b.step_s / g):,}"
        assert cells[12] == f"{100 * lp.mfu:.1f}%"
        assert cells[13:] == [("yes" if lp.proven else "no"), "-"]
    assert [r["fits"] for r in doc["rows"]] == [False, True, True, False]
    assert doc["fewest_gpus"] == 2
    assert lines[-1] == "fewest GPUs that fit: 2"


def test_a_count_the_time_limit_stopped_is_unknown_and_the_last_line_says_fewer_may_fit(files, capsys, monkeypatch):
    """The sweep above with the searches of 2 (then 2 and 4) GPUs stopped by the time limit before any
    split was found, as a short limit over many counts does: such a count may fit, so its row says
    unknown (not no), and the last line gives the fewest found with the fewer it could not settle, or
    that none was found to fit; the JSON says the same."""
    from dataclasses import replace

    from stagesplit.plan import layouts
    real = layouts.search
    stopped: set[int] = set()

    def search(analyze, degrees, req, deadline, events):
        lp = real(analyze, degrees, req, deadline, events)
        if req.gpus not in stopped:
            return lp
        return replace(lp, best=None, rows=tuple(replace(r, status="unknown", step_s=None, reason="the time limit "
                                                         "was reached before it was searched") for r in lp.rows))
    monkeypatch.setattr(layouts, "search", search)
    args = ["sweep", files / "stack.json", "--gpus", "1..8", "--global-batch", 32, "--micro-batch-size", 8,
            "--seq-len", 4, "--target", files / "tiny.yaml", "--runtime-reserve", "off"]
    stopped.add(2)
    code, text, _ = run_cli(capsys, *args, "--wide")
    assert code == 0
    lines = text.splitlines()
    by_count = {int(line.split()[0]): line.split() for line in lines[4:-1]}
    assert by_count[2][1] == "unknown" and by_count[1][1] == "no" and by_count[4][1] == "yes"
    assert by_count[8][1] == "no"                      # refused, settled: no
    assert lines[-1] == "fewest GPUs that fit: 4 (the time limit left 2 unknown: fewer may fit)"
    code, text, _ = run_cli(capsys, *args, "--format", "json")
    doc = json.loads(text)
    assert [(r["fits"], r["unknown"]) for r in doc["rows"]] == [(False, False), (False, True), (True, False),
                                                                (False, False)]
    assert doc["fewest_gpus"] == 4 and doc["unsettled_below_fewest"] == [2]
    stopped.add(4)
    code, text, _ = run_cli(capsys, *args)
    assert code == 0
    assert text.splitlines()[-1] == "no GPU count in the range was found to fit: the time limit left 2, 4 unknown"


def test_gpu_counts_are_powers_of_two_or_a_list():
    assert api.gpu_counts("8..64") == [8, 16, 32, 64]
    assert api.gpu_counts("3..20") == [4, 8, 16]
    assert api.gpu_counts("8,24,8,16") == [8, 24, 16]


@pytest.mark.parametrize("command", ["solve", "layouts"])
def test_an_output_never_replaces_a_tensor_parallel_profile(files, tmp_path, capsys, command):
    import shutil
    half = tmp_path / "half.json"
    shutil.copy(files / "half.json", half)
    before = half.read_bytes()
    layout = ["--layout", "auto"] if command == "solve" else []
    got = refused_line(capsys, command, files / "stack.json", *layout, "--gpus", 2, *BASE, "--tp-profile",
                       f"2={half}", "--out", half)
    assert "--out" in got and half.read_bytes() == before


def test_refused_combinations_are_settled_and_counted(files):
    """The engine's rules refuse a combination whatever the time (1F1B needs a micro-batch per
    stage: 32 samples in micro-batches of 8 are 4 per replica's step, fewer than the stages of every
    layout of 8 GPUs on 4 layers): each refused row is proven, and the text counts them."""
    from dataclasses import replace

    from stagesplit.plan.layouts import LayoutRow
    from stagesplit.reporting.layouts import layouts_text
    stack = str(files / "stack.json")
    lp = api.layouts(stack, gpus=8, global_batch=32, micro_batch_size=8, target="h100-80gb")
    assert lp.best is None and lp.rows and all(r.status == "refused" and r.proven for r in lp.rows)
    assert all(r.layout.micro_batches < r.layout.pp for r in lp.rows)
    lines = layouts_text(lp).splitlines()
    n = len(lp.rows)
    assert lines[1] == f"no layout fits every rank: {n} of {n} combination(s) refused (the rows say why)"
    assert lines[3] == "proven: no combination fits every rank or runs" and lp.proven
    # a search with a best and one refused row (its rows as the search makes them)
    solved = api.layouts(stack, gpus=4, global_batch=32, micro_batch_size=8, target="h100-80gb")
    assert solved.proven and solved.best is not None
    both = replace(solved, rows=solved.rows + (replace(lp.rows[0], status="refused"),))
    lines = layouts_text(both).splitlines()
    assert "proven: every other combination is slower, refuted by a lower bound or does not fit; 1 refused (the " \
        "rows say why)" in lines
    assert isinstance(both.rows[-1], LayoutRow)


def test_the_sweep_splits_one_deadline_across_the_counts(files, monkeypatch):
    """Each count's search gets the time left over the counts left (the first a quarter of 30 s of
    four counts, ...), none outliving the whole; a count no layout fits on (12 GPUs in nodes of 8)
    is a row saying so, not searched."""
    from stagesplit.plan import layouts
    given = []

    def search(analyze, degrees, req, deadline, events):
        given.append((req.gpus, deadline.left(), deadline.at))
        return layouts.LayoutPlan(req, ())
    monkeypatch.setattr(layouts, "search", search)
    sweep = api.layout_sweep(str(files / "stack.json"), gpus=[2, 4, 12, 8], global_batch=32, micro_batch_size=8,
                             target="h100-80gb", time_limit=30)
    assert [g for g, _, _ in given] == [2, 4, 8]
    assert given[0][1] == pytest.approx(30 / 4, abs=0.5)        # 4 counts left, the 12 among them
    assert given[1][1] == pytest.approx(30 / 3, abs=0.5)        # (the stub takes no time)
    assert given[2][1] == pytest.approx(30, abs=0.5)             # the last: all the time left
    assert given[0][2] <= given[1][2] <= given[2][2]
    assert [r.gpus for r in sweep.rows] == [2, 4, 12, 8] and sweep.rows[2].plan is None
    assert sweep.rows[2].refused == "8 GPUs per node does not divide 12 GPUs"
    assert sweep.fewest is None                 # no search here found a best


def test_the_micro_batch_size_is_searched_when_not_given(files):
    """Without --micro-batch-size every divisor of the batch per data-parallel rank is a layout of
    its own (the stack captured at 8 samples, scaled to each size); the best is the fastest of the
    searches at each size fixed, and the plan records its size and the global batch."""
    stack = str(files / "stack.json")
    lp = api.layouts(stack, gpus=4, global_batch=32, captured_batch=8, sequence_length=1, target="h100-80gb")
    sizes = {(r.layout.dp, r.layout.micro_batch_size) for r in lp.rows}
    assert sizes == {(dp, s) for dp in (1, 2, 4) for s in range(1, 32 // dp + 1) if (32 // dp) % s == 0}
    assert all(r.layout.micro_batch_size * r.layout.micro_batches * r.layout.dp == 32 for r in lp.rows)
    fixed = {}
    for s in (1, 2, 4, 8):
        one = api.layouts(stack, gpus=4, global_batch=32, micro_batch_size=s, captured_batch=8, sequence_length=1,
                          target="h100-80gb")
        if one.best is not None:
            fixed[s] = one.best.step_s
    assert lp.best is not None and lp.best.step_s <= min(fixed.values()) * (1 + 1e-9)
    if lp.best.layout.micro_batch_size in fixed:
        assert lp.best.step_s == pytest.approx(fixed[lp.best.layout.micro_batch_size])
    inputs = lp.plan.inputs
    assert (inputs.micro_batch_size, inputs.global_batch) == (lp.best.layout.micro_batch_size, 32)
    assert inputs.micro_batch_size * inputs.micro_batches * inputs.request.dp == 32
    # at the captured size the profile is used as captured: the search at 8 fixed is the old one's
    at8 = api.layouts(stack, gpus=4, global_batch=32, micro_batch_size=8, sequence_length=1, target="h100-80gb")
    assert at8.best.step_s == pytest.approx(fixed[8])


def _layout_plan(files, tmp_path, capsys, *extra):
    out = tmp_path / "plan.json"
    code, _, err = run_cli(capsys, "solve", str(files / "stack.json"), "--layout", "auto", "--gpus", 8, "--pp", 2,
                           "--global-batch", 64, "--captured-batch", 8, "--seq-len", 1, "--target", "h100-80gb",
                           *extra, "--out", out)
    assert code == 0, err
    from stagesplit.plan.files import read_plan
    return out, read_plan(out)


def test_the_exports_carry_the_micro_batch_size_and_the_global_batch(files, tmp_path, capsys):
    """Megatron's --micro-batch-size/--global-batch-size give its micro-batch calculator the plan's
    micro-batches; DeepSpeed's batch keys pass its own config's batch check; torchtitan's local batch
    over its micro-batch size is the plan's micro-batches."""
    out, plan = _layout_plan(files, tmp_path, capsys, "--zero", 1, "--micro-batch-size", 4)
    i = plan.inputs
    assert (i.micro_batch_size, i.global_batch) == (4, 64) and i.request.dp == 4 and i.micro_batches == 4
    code, text, _ = run_cli(capsys, "export", out, "--to", "megatron")
    assert code == 0
    line = shlex.split(next(x for x in text.splitlines() if x.startswith("--")))
    mbs, gbs = int(line[line.index("--micro-batch-size") + 1]), int(line[line.index("--global-batch-size") + 1])
    assert (mbs, gbs) == (4, 64)
    core = pytest.importorskip("megatron.core.num_microbatches_calculator")
    core.init_num_microbatches_calculator(0, None, gbs, mbs, i.request.dp)
    try:
        assert core.get_num_microbatches() == i.micro_batches
    finally:
        core.destroy_num_microbatches_calculator()
    code, text, _ = run_cli(capsys, "export", out, "--to", "deepspeed")
    assert code == 0
    import ast
    values = {node.targets[0].id: node.value.value for node in ast.parse(text).body
              if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)}
    assert (values["TRAIN_MICRO_BATCH_SIZE_PER_GPU"], values["TRAIN_BATCH_SIZE"]) == (4, 64)
    assert values["GRADIENT_ACCUMULATION_STEPS"] == i.micro_batches
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed here")
    from types import SimpleNamespace

    from deepspeed.runtime.config import DeepSpeedConfig
    mpu = SimpleNamespace(get_data_parallel_world_size=lambda: i.request.dp)
    import deepspeed.comm as dist
    rank = dist.get_rank
    dist.get_rank = lambda *a, **k: 0
    try:
        config = DeepSpeedConfig({"train_batch_size": values["TRAIN_BATCH_SIZE"],
                                  "train_micro_batch_size_per_gpu": values["TRAIN_MICRO_BATCH_SIZE_PER_GPU"],
                                  "gradient_accumulation_steps": values["GRADIENT_ACCUMULATION_STEPS"]}, mpu=mpu)
    finally:
        dist.get_rank = rank
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps) \
        == (64, 4, 4)


def test_torchtitan_words_carry_the_batch(files, tmp_path, capsys):
    out, plan = _layout_plan(files, tmp_path, capsys, "--zero", 3, "--micro-batch-size", 2)
    i = plan.inputs
    code, text, _ = run_cli(capsys, "export", out, "--to", "torchtitan")
    assert code == 0
    words = shlex.split(text, comments=True)
    flag = {w: words[k + 1] for k, w in enumerate(words) if w.startswith("--") and k + 1 < len(words)}
    assert int(flag["--parallelism.pipeline_parallel_microbatch_size"]) == 2
    assert int(flag["--training.local_batch_size"]) == 2 * i.micro_batches
    assert int(flag["--training.global_batch_size"]) == 64 == 2 * i.micro_batches * i.request.dp


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_torchtitan_s_config_manager_reads_the_batch(files, tmp_path, capsys, monkeypatch):
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "exporters"))
    import test_export_torchtitan as titan
    titan._without_triton_kernels(monkeypatch)
    from torchtitan.config.manager import ConfigManager
    out, plan = _layout_plan(files, tmp_path, capsys, "--zero", 3, "--micro-batch-size", 2)
    code, text, _ = run_cli(capsys, "export", out, "--to", "torchtitan")
    words = shlex.split(text, comments=True)
    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *words])
    t, p = config.training, config.parallelism
    assert (p.pipeline_parallel_microbatch_size, t.local_batch_size, t.global_batch_size) == \
        (2, 2 * plan.inputs.micro_batches, 64)
    assert t.global_batch_size == t.local_batch_size * p.data_parallel_shard_degree
