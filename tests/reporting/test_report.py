"""stagesplit/report.py on small hand-built plans: every string and table cell below is worked
out by hand from the plan's figures (no solver runs)."""

import pytest

from helpers import plan_inputs
from stagesplit.model.stagememory import MemoryBreakdown
from stagesplit.plan.records import PhaseRecord, Plan, PlanProfile, PlanRun, StagePlan
from stagesplit.plan.sweep import SweepRow
from stagesplit.plan.text import seconds_text
from stagesplit.reporting.summary import comparison_table, stages_table, sweep_table
from stagesplit.reporting.table import render

NAMES = ["emb", "l1", "l2", "head"]


def stage(stage, first, last, *, compute, worst=None, capacity=1000, device=None, in_flight=1, tile=0,
          time_s=None, received=0, sent=0, time=None) -> StagePlan:
    """A stage of layers first..last of NAMES; ``worst`` is its fullest tile's breakdown (or a
    byte count, all of it always-live)."""
    at = worst if isinstance(worst, MemoryBreakdown) else MemoryBreakdown(always_live=worst or 0)
    return StagePlan(stage=stage, device=stage if device is None else device, first_layer=first, last_layer=last,
                     layers=NAMES[first:last + 1], in_flight=in_flight, capacity_bytes=capacity, worst_tile=tile,
                     worst_tile_bytes=at.total, memory_at_worst_tile=at, memory_total=at, compute=compute,
                     time_s=time_s, bytes_received=received, bytes_sent=sent, time=time)


def plan(stages, *, method="cp-sat", status="optimal", feasible=True, message="", phases=(), devices=3,
         inputs=None, notes=(), run=None) -> Plan:
    return Plan(profile=PlanProfile(name="hand"), inputs=plan_inputs(devices, **(inputs or {})),
                layer_names=list(NAMES), devices=devices, method=method, status=status, feasible=feasible,
                message=message, stages=list(stages), phases=list(phases), compute_unit="cycles",
                run=PlanRun(**(run or {})), notes=list(notes))


def status_line(p: Plan) -> str:
    return p.status_line()


def plan_summary(p: Plan, micro_batches: int = 1, gpu: bool = False) -> str:
    return p.summary(micro_batches, gpu=gpu)


#: stage 0: layers emb..l2 with 2 micro-batches in flight, 800 of 1000 bytes on tile 5
#: (500 variables, 100 stashed, 200 code and state), 3000 cycles = 3 us; stage 1: head alone,
#: 250 bytes on tile 0, 1000 cycles = 1 us. 4096 bytes cross the cut.
STAGE0_MEMORY = MemoryBreakdown(always_live=300, not_always_live=200, stashed_copies=100, vertex_code=100,
                                vertex_state=50, exchange_code=30, control_code=20)


def two_stage_plan(**kw) -> Plan:
    stages = [stage(0, 0, 2, compute=3000.0, worst=STAGE0_MEMORY, in_flight=2, tile=5, time_s=3e-6, sent=4096),
              stage(1, 3, 3, compute=1000.0, worst=MemoryBreakdown(always_live=200, not_always_live=50),
                    time_s=1e-6, received=4096)]
    kw.setdefault("phases", [PhaseRecord("bottleneck stage time", "OPTIMAL", 3000, 3000, 0.0),
                             PhaseRecord("worst stage memory", "OPTIMAL", 800, 800, 0.0)])
    return plan(stages, **kw)


# -- seconds_text -----------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds, text", [
    (0.0, "0 ms"),
    (3.63e-4, "0.363 ms"),
    (2.8e-3, "2.8 ms"),
    (1e-4, "0.1 ms"),                 # the smallest duration still shown in ms
    (9.99e-5, "99.9 us"),
    (1e-6, "1 us"),
    (9.99e-7, "999 ns"),
    (3e-8, "30 ns"),                  # not 3e-05 ms
    (5e-7, "500 ns"),
    (1.5, "1.5e+03 ms"),              # three significant digits whatever the size
    (-2e-3, "-2 ms"),
    (-5e-6, "-5 us"),
])
def test_seconds_text(seconds, text):
    assert seconds_text(seconds) == text


# -- status_line ------------------------------------------------------------------------------------

def test_status_line_infeasible():
    p = plan([], status="infeasible", feasible=False, message="layer 'l2' alone needs more than a device holds")
    assert status_line(p) == "status: infeasible - layer 'l2' alone needs more than a device holds"


def test_status_line_optimal_by_cp_sat():
    p = two_stage_plan(run={"solver_seconds": 1.234})
    # a zero gap is not shown
    assert status_line(p) == ("status: optimal, proven optimal by CP-SAT in 1.23 s "
                              "[bottleneck stage time optimal; worst stage memory optimal]")


def test_status_line_optimal_by_the_dp():
    phases = [PhaseRecord("bottleneck stage time", "OPTIMAL", 3000, 3000, 0.0, proof="dp"),
              PhaseRecord("worst stage memory", "OPTIMAL", 800, 800, 0.0, proof="dp")]
    assert status_line(two_stage_plan(phases=phases)) == \
        "status: optimal, proven optimal by the exact DP [bottleneck stage time optimal; worst stage memory optimal]"
    # each solver is credited with the phases it proved, and each one's time is shown
    phases[1] = PhaseRecord("worst stage memory", "OPTIMAL", 800, 800, 0.0, proof="cp-sat")
    p = two_stage_plan(phases=phases, run={"solver_seconds": 1.5, "dp_seconds": 0.25, "cpsat_seconds": 1.25})
    assert status_line(p) == (
        "status: optimal, proven optimal by the exact DP (bottleneck stage time) and CP-SAT (worst stage memory) "
        "in 1.50 s (exact DP 0.25 s, CP-SAT 1.25 s) [bottleneck stage time optimal; worst stage memory optimal]")


def test_status_line_not_proven_with_gap_and_note():
    phases = [PhaseRecord("bottleneck stage time", "FEASIBLE", 3000, 2625, 0.125)]
    p = two_stage_plan(status="feasible", phases=phases, message="stopped by the time limit (5 s)",
                       run={"solver_seconds": 5.004})
    assert status_line(p) == ("status: feasible, NOT proven optimal in 5.00 s [bottleneck stage time feasible "
                              "(gap 12.50%)]\nnote: stopped by the time limit (5 s)")


def test_status_line_without_phases():
    # a baseline plan (greedy, uniform): no solver phases, no solver time
    p = two_stage_plan(method="uniform", status="feasible", phases=[])
    assert status_line(p) == "status: feasible, NOT proven optimal"


# -- stages_table -----------------------------------------------------------------------------------

def test_stages_table_cells():
    t = stages_table(two_stage_plan())
    assert t.title == "Stages"
    assert [c.name for c in t.columns] == [
        "stage", "device", "layers", "in flight", "worst tile", "worst tile bytes", "of capacity", "variables",
        "stashed copies", "code+state", "compute (cycles)", "time (ms)", "received", "sent"]
    assert [c.kind for c in t.columns] == ["id", "id", "text", "int", "id", "int", "percent", "int", "int", "int",
                                           "compute", "float", "bytes", "bytes"]
    assert len(t.rows) == 2
    first, second = t.rows
    # variables = always-live + not-always-live (300 + 200); code+state = 100 + 50 + 30 + 20
    assert first[:11] == [0, 0, "emb..l2 (3)", 2, 5, 800, 0.8, 500, 100, 200, 3000.0]
    assert first[11] == pytest.approx(3e-3)
    assert first[12:] == [0, 4096]
    assert second[:11] == [1, 1, "head", 1, 0, 250, 0.25, 250, 0, 0, 1000.0]
    assert second[11] == pytest.approx(1e-3)
    assert second[12:] == [4096, 0]


def test_stages_table_missing_seconds_and_capacity():
    # no seconds (a target that cannot convert its compute unit): no time column; no capacity
    # recorded: an empty cell
    p = plan([stage(0, 0, 1, compute=7.0, worst=40, capacity=0, device=2)], devices=3)
    (row,) = stages_table(p).rows
    assert "time (ms)" not in [c.name for c in stages_table(p).columns]
    assert row == [0, 2, "emb..l1 (2)", 1, 0, 40, None, 40, 0, 0, 7.0, 0, 0]
    text = render([stages_table(p)])
    assert text.splitlines()[4].split() == ["0", "2", "emb..l1", "(2)", "1", "0", "40", "-", "40", "0", "0", "7",
                                            "0", "0"]


# -- plan_summary -----------------------------------------------------------------------------------

def test_plan_summary_on_tiles_with_1f1b_note():
    p = two_stage_plan(inputs={"schedule": "1f1b", "communication": False}, notes=["micro-batches given: 4"],
                       run={"solver_seconds": 0.5})
    # balance: mean compute (3000 + 1000) / 2 over the bottleneck 3000 = 66.7%
    assert plan_summary(p).splitlines() == [
        "split: [ emb l1 l2 | head ]",
        "status: optimal, proven optimal by CP-SAT in 0.50 s [bottleneck stage time optimal; worst stage memory "
        "optimal]",
        "note: micro-batches given: 4",
        "bottleneck: stage 0 (layers emb..l2): 3000 cycles (3 us)",
        "memory: fullest stage 0 uses 800 of 1,000 bytes on tile 5 (80.0%); 2 of 3 devices used",
        "note: with 1F1B, stage s of P holds min(M, P - s) micro-batches, so more stages put more stashed "
        "activations on the first ones; here more devices do not fit or do not help",
        "compute balance: 66.7% (mean stage compute / bottleneck)",
    ]


def test_plan_summary_pipeline_efficiency_with_micro_batches():
    p = two_stage_plan(inputs={"schedule": "gpipe"})
    last = plan_summary(p, micro_batches=4).splitlines()[-1]
    # bubble (P-1)/(M+P-1) = 1/5; efficiency = balance 2/3 x (1 - 1/5) = 53.3%
    assert last == ("compute balance: 66.7% (mean stage compute / bottleneck); pipeline efficiency with "
                    "4 micro-batches: 53.3% (bubble 20.0%)")
    # the 1F1B note is for 1F1B only
    assert not any("1F1B" in line for line in plan_summary(p, micro_batches=4).splitlines())


def test_plan_summary_gpu_with_transfers():
    gib = 2**30
    stages = [stage(0, 0, 1, compute=2000.0, worst=3 * gib, capacity=8 * gib, time_s=2e-3, time=2500.0),
              stage(1, 2, 3, compute=2400.0, worst=6 * gib, capacity=8 * gib, time_s=2.4e-3, time=2400.0)]
    p = plan(stages, devices=2, inputs={"schedule": "none", "communication": True},
             phases=[PhaseRecord("bottleneck stage time", "OPTIMAL", 2500, 2500, None)])
    lines = plan_summary(p, gpu=True).splitlines()
    # the bottleneck is the slowest stage with its transfers (2500 > 2400), though it computes less
    assert lines[2] == "bottleneck: stage 0 (layers emb..l1): 2500 cycles (2 ms) with transfers"
    assert lines[3] == "memory: fullest stage 1 uses 6.00 of 8.00 GiB (75.0%); 2 of 2 devices used"
    # balance (2000 + 2400) / 2 / 2500 = 88.0%
    assert lines[4] == "compute balance: 88.0% (mean stage compute / bottleneck)"
    assert len(lines) == 5


def test_plan_summary_without_a_split():
    p = plan([], status="infeasible", feasible=False, message="no split fits", notes=["a note"])
    assert plan_summary(p, micro_batches=8) == "split: none\nstatus: infeasible - no split fits\nnote: a note"


# -- comparison_table -------------------------------------------------------------------------------

def comparison_plans():
    best = two_stage_plan()                                                # bottleneck 3000, worst 800
    greedy = plan([stage(0, 0, 1, compute=2000.0, worst=700), stage(1, 2, 3, compute=2000.0, worst=600)],
                  method="greedy", status="feasible")                     # bottleneck 2000, worst 700
    uniform = plan([stage(0, 0, 0, compute=1000.0, worst=300), stage(1, 1, 1, compute=1000.0, worst=300),
                    stage(2, 2, 3, compute=2000.0, worst=1200)],
                   method="uniform", status="infeasible", feasible=False)  # does not fit: 1200 > 1000
    nothing = plan([], method="greedy (3+ layers)", status="infeasible", feasible=False)
    return best, greedy, uniform, nothing


def test_comparison_table_ratios_to_the_optimal_plan():
    t = comparison_table(comparison_plans())
    assert t.title == "Comparison (every split priced by the same cost model)"
    assert [c.name for c in t.columns] == ["method", "fits", "stages", "split", "bottleneck compute",
                                           "worst tile bytes", "step vs optimal", "memory vs optimal"]
    rows = t.rows
    assert rows[0] == ["stagesplit (optimal)", "yes", 2, "[ emb l1 l2 | head ]", 3000.0, 800, 1.0, 1.0]
    # one micro-batch: a step is (1 + P - 1) x the slowest stage, in compute (the others have no seconds)
    assert rows[1][:6] == ["greedy", "yes", 2, "[ emb l1 | l2 head ]", 2000.0, 700]
    assert rows[1][6:] == [pytest.approx(2 * 2000 / (2 * 3000)), pytest.approx(7 / 8)]
    assert rows[2][:6] == ["uniform", "NO", 3, "[ emb | l1 | l2 head ]", 2000.0, 1200]
    assert rows[2][6:] == [pytest.approx(3 * 2000 / (2 * 3000)), pytest.approx(1.5)]
    assert rows[3] == ["greedy (3+ layers)", "no", 0, "-", None, None, None, None]
    assert t.note.startswith("vs optimal: the method's pipeline step time ((micro-batches + stages - 1) x slowest "
                             "stage)")


def test_comparison_table_on_a_gpu_shows_memory_in_gib():
    t = comparison_table(comparison_plans(), gpu=True)
    assert [c.name for c in t.columns][5] == "memory" and t.columns[5].kind == "gib"
    text = render([t])
    assert "memory (GiB)" in text and "worst tile" not in text


# -- sweep_table ------------------------------------------------------------------------------------

def test_sweep_table_rows():
    none_fits = plan([], status="infeasible", feasible=False, devices=1,
                     message="no split of the 4 layers fits on 1 device(s); the smallest number that fits is 2",
                     notes=["a schedule note"])
    two = two_stage_plan(devices=2)
    t = sweep_table([SweepRow(1, none_fits, 1), SweepRow(2, two, 2)])
    assert [c.name for c in t.columns] == ["devices", "fits", "used", "bottleneck compute", "bottleneck ms",
                                           "efficiency", "bubble", "worst memory", "status", "split"]
    assert t.rows[0] == [1, "no", 0, None, None, None, None, None, "infeasible", none_fits.message]
    row = t.rows[1]
    assert row[:4] == [2, "yes", 2, 3000.0]
    # 3 us = 0.003 ms; with 2 micro-batches the bubble is 1/3 and efficiency 2/3 x 2/3 = 4/9
    assert row[4:7] == [pytest.approx(3e-3), pytest.approx(4 / 9), pytest.approx(1 / 3)]
    assert row[7:] == [0.8, "optimal", "[ emb l1 l2 | head ]"]
    assert t.note == "a schedule note"            # the first row's first note


def test_sweep_table_note_for_defaulted_micro_batches():
    inputs = {"micro_batches_auto": True, "schedule": "1f1b"}
    rows = [SweepRow(n, two_stage_plan(devices=n, inputs=inputs, notes=["ignored"]), n) for n in (2, 3)]
    t = sweep_table(rows)
    assert t.note == ("`micro_batches` not given: each row uses as many micro-batches as devices (the fewest that "
                      "fill its 1f1b pipeline)")
    # efficiency with M = 3: bubble 1/4, 2/3 x 3/4 = 1/2
    assert t.rows[1][5:7] == [pytest.approx(0.5), pytest.approx(0.25)]
    assert sweep_table([]).rows == [] and sweep_table([]).note == ""
