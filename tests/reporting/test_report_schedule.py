"""The report's schedule section shows what was solved: the figure is the solver's own simulation
of the plan's schedule with the durations the plan records, and the text beside it states the
plan's step and bubble to the digit the plan's summary prints (a hand-computed case, and the
example GPT capture of issue #34). Large plans give a page in seconds (a per-rank summary, said
so in the text) or one line naming the plan file and the field; extreme figures never print
"inf"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import stagesplit
from helpers import PROFILES, plan_inputs
from stagesplit.cli import main
from stagesplit.model.stagememory import MemoryBreakdown
from stagesplit.plan.files import read_plan, write_plan
from stagesplit.plan.records import Plan, PlanProfile, RankRecord, ScheduleRecord, StagePlan
from stagesplit.reporting.html import schedule_section, schedule_text
from stagesplit.reporting.timeline import gantt_figure, schedule_view, step_summary, summary_figure, too_large_to_draw

MS = 1e-3


def scheduled_plan(*, micro_batches=2, chunk_times=((1 * MS, 1.5 * MS, 0.5 * MS),) * 2,
                   optimizer=(0.5 * MS, 3 * MS), transfer=(0.0,), step=10 * MS, bubble=0.225, names=("a", "b"),
                   stage_time=None) -> Plan:
    """Two ranks under 1F1B, one stage each: forward 1 ms, backward 1.5 ms + weight gradient
    0.5 ms (a full backward: 2 ms), optimizer steps of 0.5 ms (rank 0) and 3 ms (rank 1).

    By hand, with M = 2: rank 0 runs F0 [0, 1], F1 [1, 2]; rank 1 F0 [1, 2], B0 [2, 4]; rank 0
    B0 [4, 6]; rank 1 F1 [4, 5], B1 [5, 7]; rank 0 B1 [7, 9]. Rank 0 ends at 9 + 0.5, rank 1 at
    7 + 3: the step is 10 ms (9 ms without the optimizer steps, (M + P - 1) x 3 ms). Busy:
    2 x 3 + 0.5 and 2 x 3 + 3, 15.5 of 2 x 10 ms: bubble 22.5%."""
    P = len(names)
    memory = MemoryBreakdown(always_live=100, not_always_live=50, stashed_copies=50)
    stages = [StagePlan(stage=i, device=i, first_layer=i, last_layer=i, layers=[names[i]], in_flight=P - i,
                        capacity_bytes=1000, worst_tile=0, worst_tile_bytes=memory.total, memory_at_worst_tile=memory,
                        memory_total=memory, compute=1.0, time_s=sum(chunk_times[i]) if stage_time is None
                        else stage_time, bytes_received=0, bytes_sent=0) for i in range(P)]
    ranks = tuple(RankRecord(rank=r, chunks=(r,), peak_bytes=memory.total, capacity_bytes=1000, peak_at="",
                             busy=micro_batches * sum(chunk_times[r]) + optimizer[r]) for r in range(P))
    record = ScheduleRecord(kind="1f1b", chunks_per_rank=1, micro_batches=micro_batches, step_time=step,
                            time_unit="seconds", bubble=bubble, ranks=ranks, chunk_times=tuple(chunk_times),
                            transfer_times=tuple(transfer), optimizer_times=tuple(optimizer))
    return Plan(profile=PlanProfile(name="hand", tiles=1), inputs=plan_inputs(P, schedule="1f1b",
                                                                             micro_batches=micro_batches),
                layer_names=list(names), devices=P, method="cp-sat", status="optimal", feasible=True, message="",
                stages=stages, compute_unit="flops", schedule=record)


def note(page: str) -> str:
    """The text beside the schedule's figures."""
    return re.search(r'<h2>The schedule</h2>\n<p class="(?:note|bad)">([^<]*)</p>', page).group(1)


# -- the figure is the simulation the plan was solved with ----------------------------------------

def test_a_hand_computed_step_with_optimizer_steps_is_the_plans():
    plan = scheduled_plan()
    view = schedule_view(plan)
    assert view.solved
    assert view.step_time == 10 * MS                                   # exactly: rank 1's optimizer ends it
    assert view.bubble == pytest.approx(0.225, abs=1e-12)
    ends = [list(np.round(e / MS, 9)) for e in view.simulation.end]
    assert ends == [[1, 2, 6, 9], [2, 4, 5, 7]]                        # the actions' ends worked out above
    text = schedule_text(plan)
    assert text.startswith("Step: 10 ms for 2 micro-batches with 1f1b (bubble 22.5%, the schedule simulated). ")
    assert "gives a step of" not in text                               # the drawing agrees with the plan
    section = schedule_section(plan)                                    # the page's schedule section
    assert section.startswith('<p class="note">Step: 10 ms for 2 micro-batches with 1f1b (bubble 22.5%')
    assert section.count("data:image/png;base64,") == 2
    # the plan's own summary line says the same, to the digit
    assert "step: 10 ms for 2 micro-batches with 1f1b (bubble 22.5%, the schedule simulated)" in \
        plan.summary(2, gpu=True)


def test_the_gantt_draws_every_action_and_each_optimizer_step():
    view = schedule_view(scheduled_plan())
    fig = gantt_figure(view)
    ax = fig.axes[0]
    bars = [path for c in ax.collections for path in c.get_paths()]
    assert len(bars) == 2 * 2 * 2 + 2                  # 2 ranks x 2 micro-batches x (F, B), and 2 optimizer steps
    assert ax.get_xlim() == (0.0, 10.0)                # the step, in ms
    assert "step 10 ms, bubble 22.5%" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forward", "backward", "optimizer step"]


def test_a_plan_file_without_the_optimizer_times_says_its_drawing_differs():
    """An older plan records no optimizer or transfer times: the optimizer steps come from the
    ranks' busy time, and a step that then differs is said, beside the plan's own."""
    plan = scheduled_plan(step=10.5 * MS)                    # a plan whose record no longer matches
    text = schedule_text(plan)
    assert text.startswith("Step: 10.5 ms for 2 micro-batches")
    assert "it gives a step of 10 ms (bubble 22.5%): this plan file does not record every duration" in text


def test_the_figures_survive_the_plan_file(tmp_path):
    plan = scheduled_plan()
    write_plan(plan, tmp_path / "plan.json")
    back = read_plan(tmp_path / "plan.json")
    assert back.schedule.optimizer_times == (0.5 * MS, 3 * MS) and back.schedule.transfer_times == (0.0,)
    assert schedule_view(back).step_time == 10 * MS


@pytest.fixture(scope="module")
def gpt_auto(tmp_path_factory):
    """Issue #34's example: the captured GPT on 4 devices, 8 micro-batches, --schedule auto."""
    plan = stagesplit.solve(PROFILES / "gpt-captured.stagesplit", 4, micro_batches=8, schedule="auto")
    path = tmp_path_factory.mktemp("gpt") / "plan.json"
    write_plan(plan, path)
    return read_plan(path)


def test_the_example_gpt_plan_is_drawn_at_its_own_step(gpt_auto):
    """It was drawn at 6.04 ms, bubble 28% (the stages' time split 1:2, no optimizer) where the
    plan says 6.24 ms (28.5%)."""
    s = gpt_auto.schedule
    assert s.kind == "interleaved-1f1b" and len(s.optimizer_times) == 4 and len(s.transfer_times) == 3
    view = schedule_view(gpt_auto)
    assert view.step_time == s.step_time                               # the very simulation, bit for bit
    assert f"{view.bubble:.1%}" == f"{s.bubble:.1%}" == "28.5%"
    line = next(x for x in gpt_auto.summary(8, gpu=True).splitlines() if x.startswith("step: "))
    assert line == "step: 6.24 ms for 8 micro-batches with interleaved-1f1b (bubble 28.5%, the schedule simulated)"
    assert schedule_text(gpt_auto).startswith("S" + line[1:] + ". ")


@pytest.mark.slow
def test_the_example_report_states_the_plans_step_beside_the_figure(tmp_path, capsys):
    profile = PROFILES / "gpt-captured.stagesplit"
    plan, page = tmp_path / "plan.json", tmp_path / "r.html"
    assert main(["solve", str(profile), "--devices", "4", "--micro-batches", "8", "--schedule", "auto",
                 "--out", str(plan)]) == 0
    assert main(["report", str(plan), str(profile), "-o", str(page)]) == 0
    text = page.read_text()
    assert note(text).startswith("Step: 6.24 ms for 8 micro-batches with interleaved-1f1b (bubble 28.5%, the "
                                 "schedule simulated). The drawing is the solver&#x27;s simulation")
    assert "6.04" not in note(text)


def test_a_stage_model_plan_states_its_own_step_and_the_drawings():
    """A stage-level plan (no schedule record): the page states the stage model's step, (M + P -
    1) x the slowest stage, and that the drawing splits each stage 1:2 with the step that gives.
    Two stages of 3 and 1.5 ms, M = 2: the model's step is 3 x 3 = 9 ms, bubble 1/3; drawn
    (F 1, B 2 and F 0.5, B 1 ms): F0 [0, 1], F1 [1, 2] on rank 0; rank 1 F0 [1, 1.5], B0
    [1.5, 2.5], F1 [2.5, 3], B1 [3, 4]; rank 0 B0 [2.5, 4.5], B1 [4.5, 6.5]: 6.5 ms, busy 6 +
    3 of 13: bubble 30.8%."""
    plan = scheduled_plan(chunk_times=((1 * MS, 2 * MS, 0.0), (0.5 * MS, 1 * MS, 0.0)))
    plan.schedule = None
    text = schedule_text(plan)
    assert text == ("This plan was solved with the stage model: its step is M + P - 1 = 3 times its slowest stage, "
                    "9 ms for 2 micro-batches (bubble 33.3%). The drawing runs 1f1b with each stage's time split 1:2 "
                    "between its forward and its backward (the plan records no schedule), which gives a step of "
                    "6.5 ms (bubble 30.8%); each rank's memory is drawn from the plan's stages.")


# -- large plans ------------------------------------------------------------------------------------

def stage_level_plan(stages: int, micro_batches: int) -> Plan:
    """``stages`` one-layer stages under 1F1B, stage i taking (1 + i / stages) ms."""
    names = [f"l{i}" for i in range(stages)]
    memory = MemoryBreakdown(always_live=2**30)
    plan = Plan(profile=PlanProfile(name="wide", tiles=1), inputs=plan_inputs(stages, schedule="1f1b",
                                                                             micro_batches=min(micro_batches, 4096)),
                layer_names=names, devices=stages, method="cp-sat", status="optimal", feasible=True, message="",
                stages=[StagePlan(stage=i, device=i, first_layer=i, last_layer=i, layers=[names[i]], in_flight=1,
                                  capacity_bytes=2**33, worst_tile=0, worst_tile_bytes=memory.total,
                                  memory_at_worst_tile=memory, memory_total=memory, compute=1.0 + i / stages,
                                  time_s=(1 + i / stages) * MS, bytes_received=0, bytes_sent=0)
                        for i in range(stages)], compute_unit="flops")
    return plan


@pytest.mark.parametrize("micro_batches", [1024, 4096])
def test_1024_stages_under_1f1b_give_a_summary_and_say_so(micro_batches):
    plan = stage_level_plan(1024, micro_batches)
    assert too_large_to_draw(plan) == "1,024 ranks (at most 64 are drawn action by action)"
    summary = step_summary(plan)
    slowest = (1 + 1023 / 1024) * MS
    assert summary.step_time == (micro_batches + 1023) * slowest
    assert summary.busy[0] == micro_batches * MS
    text = schedule_text(plan)
    step = f"{(micro_batches + 1023) * slowest * 1e3:.3g} ms"
    assert text == (f"Step: {step} for {micro_batches:,} micro-batches with 1f1b (bubble "
                    f"{1023 / (micro_batches + 1023):.1%}, the stage model: M + P - 1 times the slowest stage). Not "
                    "drawn action by action: 1,024 ranks (at most 64 are drawn action by action); the figure shows "
                    "each rank's busy share of the step and its peak memory, as the plan records them.")
    fig = summary_figure(summary)
    busy = fig.axes[0].patches[0]                        # the busy shares, one step per rank
    assert fig.get_size_inches()[0] == 10.0 and busy.get_data().values[0] == pytest.approx(
        100 * micro_batches * MS / summary.step_time)


def test_too_many_actions_on_few_ranks_give_a_summary_too():
    plan = scheduled_plan()
    record = plan.schedule.__dict__
    drawn = Plan(**{**plan.__dict__, "schedule": ScheduleRecord(**{**record, "micro_batches": 4096})})
    assert too_large_to_draw(drawn) == ""                    # 2 ranks x 4,096 x (F, B) = 16,384 actions
    split = Plan(**{**plan.__dict__, "schedule": ScheduleRecord(**{**record, "micro_batches": 4096, "kind": "zb-h1"})})
    assert too_large_to_draw(split) == "up to 24,576 actions in one step (at most 20,000 are drawn action by action)"
    assert schedule_text(split).startswith("Step: 10 ms for 4,096 micro-batches with zb-h1 (bubble 22.5%, the "
                                           "schedule simulated). Not drawn action by action: up to 24,576 actions")


def write_big_profile(folder: Path, layers: int = 2000) -> Path:
    """A per-layer GPU profile of ``layers`` layers, each 16 MiB of weights and about 1 TFLOP."""
    doc = {"format": "stagesplit-profile", "version": 1, "kind": "layers", "name": "big", "target": "a100-80gb",
           "training": True, "compute_unit": "flops",
           "layers": [{"name": f"layers.{i}", "weights": 2**24, "activations": 2**20, "output": 2**16,
                       "compute": 1e12 + i * 1e9} for i in range(layers)]}
    path = folder / "big.json"
    path.write_text(json.dumps(doc))
    return path


def written_plan(profile: Path, devices: int, micro_batches: int, out: Path) -> Plan:
    """The plan stagesplit writes for an even split of ``profile`` on ``devices`` devices, built by
    the solver's own plan builder (the search itself takes minutes at this size)."""
    from stagesplit.api import resolve
    from stagesplit.model.traffic import layer_traffic
    from stagesplit.plan.build import make_plan
    from stagesplit.plan.search import price
    from stagesplit.solver.problem import Split, build_problem
    from stagesplit.solver.request import SolveRequest
    resolved = resolve(SolveRequest(devices=devices, schedule="1f1b", micro_batches=micro_batches),
                       stagesplit.analyze(profile))
    model, inputs = resolved.model, resolved.inputs
    traffic = layer_traffic(model)
    problem = build_problem(model, inputs.options, traffic=traffic,
                            table=price(model, inputs.options, max_devices=devices))
    bounds = tuple(int(x) for x in np.linspace(0, model.num_layers, devices + 1).round())
    plan = make_plan(model, problem, Split(bounds), inputs, method="uniform", traffic=traffic)
    write_plan(plan, out)
    return plan


@pytest.mark.slow
def test_the_plan_for_2000_layers_on_1024_devices_reports_in_seconds(tmp_path, capsys):
    import time
    profile = write_big_profile(tmp_path)
    plan = written_plan(profile, 1024, 4096, tmp_path / "plan.json")
    assert plan.feasible and len(plan.stages) == 1024
    started = time.monotonic()
    assert main(["report", str(tmp_path / "plan.json"), str(profile), "-o", str(tmp_path / "r.html")]) == 0
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"stagesplit: warning: {tmp_path / 'plan.json'}: devices: 1,024 devices, more than the 64 a "
                      "report solves the request again for: the page compares the plan with no other split")
    text = (tmp_path / "r.html").read_text()
    summary = step_summary(plan)
    assert note(text).startswith(f"Step: {summary.step_time * 1e3:.3g} ms for 4,096 micro-batches with 1f1b (bubble "
                                 f"{1023 / (4096 + 1023):.1%}, the stage model")
    assert "Not drawn action by action: 1,024 ranks" in note(text)
    assert text.count("data:image/png;base64,") == 2          # the stages, the per-rank summary
    assert 'class="why">why: ' in text                        # the cost model was read


@pytest.mark.slow
@pytest.mark.parametrize("micro_batches", [1024, 4096])
def test_1024_stages_from_a_plan_file_in_seconds(tmp_path, micro_batches):
    import time
    write_plan(stage_level_plan(1024, micro_batches), tmp_path / "plan.json")
    started = time.monotonic()
    assert main(["report", str(tmp_path / "plan.json"), "-o", str(tmp_path / "r.html")]) == 0
    assert time.monotonic() - started < 60
    assert "Not drawn action by action: 1,024 ranks" in note((tmp_path / "r.html").read_text())


@pytest.mark.parametrize("field, where", [("request", "request.micro_batches"),
                                          ("schedule", "schedule.micro_batches")])
def test_a_plan_of_10_to_the_12_micro_batches_is_refused_in_one_line(tmp_path, capsys, field, where):
    path = tmp_path / "plan.json"
    write_plan(scheduled_plan(), path)
    doc = json.loads(path.read_text())
    doc[field]["micro_batches"] = 10**12
    path.write_text(json.dumps(doc))
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stagesplit: error: {path}: {where}: ")
    assert "1000000000000" in err
    assert not (tmp_path / "r.html").exists()


# -- extreme figures --------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, where", [
    (lambda d: d["stages"][0].update(time_s=1.7e308), "stages[0].time_s"),
    (lambda d: d["stages"][1].update(compute=1e101), "stages[1].compute"),
    (lambda d: d["schedule"]["chunk_times"][0].__setitem__(1, 1.7e308), "schedule.chunk_times[0][1]"),
    (lambda d: d["schedule"].update(step_time=1e300), "schedule.step_time"),
    (lambda d: d["schedule"]["optimizer_times"].__setitem__(1, 1e200), "schedule.optimizer_times[1]"),
])
def test_extreme_times_in_a_plan_file_are_refused_not_printed_as_inf(tmp_path, capsys, edit, where):
    path = tmp_path / "plan.json"
    write_plan(scheduled_plan(), path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stagesplit: error: {path}: {where}: expected a number in "
                                                   "0..1e+100")
    assert not (tmp_path / "r.html").exists()


def test_the_largest_times_a_plan_file_takes_print_as_numbers(tmp_path):
    """1e100 s stages on 1,024 ranks and 4,096 micro-batches: the step, 5,119 x 1e100 s, is
    printed in ms, never "inf"; the summary line too."""
    plan = stage_level_plan(1024, 4096)
    plan.stages = [StagePlan(**{**s.__dict__, "time_s": 1e100, "compute": 1e100}) for s in plan.stages]
    write_plan(plan, tmp_path / "plan.json")
    back = read_plan(tmp_path / "plan.json")
    text = schedule_text(back)
    assert text.startswith("Step: 5.12e+106 ms for 4,096 micro-batches")     # 5,119 x 1e100 s in ms
    assert "inf" not in text and "inf" not in back.summary(4096, gpu=True)


def test_a_step_that_overflows_in_memory_is_refused_naming_the_fields():
    plan = scheduled_plan(chunk_times=((1e308, 1e308, 0.0),) * 2, stage_time=MS)
    section = schedule_section(plan)
    assert section == ('<p class="bad">not drawn: the step time is too large to compute (it overflows a float): the '
                       "plan&#x27;s stage times (stages[].time_s, schedule.chunk_times) are out of range</p>")


def test_64_ranks_are_drawn_one_by_one_with_the_fullest_rank_in_the_title():
    from stagesplit.reporting.timeline import rank_memory_figure
    plan = stage_level_plan(64, 64)
    assert too_large_to_draw(plan) == ""                          # 64 x 64 x 2 = 8,192 actions
    view = schedule_view(plan)
    gantt = gantt_figure(view)
    assert sum(len(c.get_paths()) for c in gantt.axes[0].collections) == 64 * 64 * 2
    memory = rank_memory_figure(view)
    ax = memory.axes[0]
    assert len(ax.lines) == 64 and ax.get_legend() is None        # the capacity (8 GiB) is off the scale
    assert ax.get_title() == "Memory of each rank over the step (64 ranks; the fullest, rank 0, peaks at 1 GiB)"


@pytest.mark.parametrize("micro_batches", [1024, 4096])
def test_a_solved_1f1b_schedule_on_1024_ranks_gives_the_plans_numbers_per_rank(micro_batches):
    P = 1024
    plan = scheduled_plan(micro_batches=micro_batches, chunk_times=((1 * MS, 1.5 * MS, 0.5 * MS),) * P,
                          optimizer=(0.5 * MS,) * P, transfer=(0.0,) * (P - 1), names=[f"l{i}" for i in range(P)],
                          step=7.5 * MS, bubble=0.4)
    assert schedule_text(plan) == (
        f"Step: 7.5 ms for {micro_batches:,} micro-batches with 1f1b (bubble 40.0%, the schedule simulated). Not drawn "
        "action by action: 1,024 ranks (at most 64 are drawn action by action); the figure shows each rank's busy "
        "share of the step and its peak memory, as the plan records them.")
    summary = step_summary(plan)
    assert summary.simulated and list(summary.busy) == [r.busy for r in plan.schedule.ranks]
    assert summary.peak[0] == 200 and summary.capacity[0] == 1000


def test_the_stage_figure_of_1024_stages_has_a_bounded_width_and_no_per_stage_labels():
    from stagesplit.reporting.plot import plan_figure
    fig = plan_figure(stage_level_plan(1024, 4096))
    memory, time = fig.axes
    assert tuple(fig.get_size_inches()) == (16.0, 7.5)
    assert len(memory.texts) == 0 and memory.get_xlabel() == time.get_xlabel() == "stage"
    assert memory.get_xlim() == time.get_xlim() == (-0.5, 1023.5)
    steps = time.patches[0].get_data()                      # each stage's time, in ms: (1 + i / 1024)
    assert steps.values[0] == pytest.approx(1.0) and steps.values[-1] == pytest.approx(1 + 1023 / 1024)
    assert list(time.lines[0].get_xdata()) == [1023]        # the bottleneck marked
    assert fig._suptitle.get_text() == "wide: 1024 stages on 1024 GPUs"
