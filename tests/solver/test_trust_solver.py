"""Issue 9 regressions on the solver side: communication optima (hand-computed), objective
values in user units, the micro-batch default with a schedule, and the device of each stage."""

import json
from pathlib import Path

import pytest

from indexed_inputs import indexed_inputs
from stagesplit.cli import main

REPRO = Path(__file__).resolve().parents[1] / "data" / "reproducers"


def solve_json(capsys, *args):
    code = main(["solve", *map(str, args), "--format", "json"])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def ranges(doc):
    return [(s["first_layer"], s["last_layer"]) for s in doc["stages"]]


class TestCommunication:
    """Both profiles: four layers on a 1 GHz clock, so 1 cycle = 1 ns."""

    def test_false_optimal(self, capsys):
        # compute 10, 20, 10, 20; x12 (10 bytes, layers 1 and 2) costs 100 ns at 1e8 B/s across
        # the cut before layer 2. [0 1 | 2 3]: 30 + 100 each = 130. [0 | 1 2 | 3]: 10, 30, 20.
        # Any 3-stage split cuts before 1 and 3 (free) or before 2 (100): 30 is optimal.
        code, doc, _ = solve_json(capsys, REPRO / "comm-false-optimal.json", "--devices", 3, "--communication")
        assert code == 0
        assert ranges(doc) == [(0, 0), (1, 2), (3, 3)]
        assert doc["status"] == "optimal"
        time = doc["objective"][0]
        assert (time["quantity"], time["status"], time["value"], time["bound"], time["unit"]) == \
            ("bottleneck stage time", "OPTIMAL", 30, 30, "cycles")
        assert [s["time"] for s in doc["stages"]] == [10, 30, 20]
        assert doc["stages"][1]["time_s"] == pytest.approx(30e-9)

    def test_wrong_split_is_really_worse(self, capsys):
        # the split the old model called optimal: each stage 30 compute + 100 transfer
        code, doc, _ = solve_json(capsys, REPRO / "comm-false-optimal.json", "--devices", 2, "--communication")
        assert code == 0 and doc["status"] == "optimal"
        # two stages: [0 | 1 2 3] = 50 or [0 1 2 | 3] = 40 (no transfer) beat [0 1 | 2 3] = 130
        assert ranges(doc) == [(0, 2), (3, 3)]
        assert doc["objective"][0]["value"] == 40

    @pytest.mark.parametrize("devices, expected, value", [(2, [(0, 2), (3, 3)], 30), (3, [(0, 0), (1, 2), (3, 3)], 20)])
    def test_stall_is_proven_quickly(self, capsys, devices, expected, value):
        # compute 10 each; x12 (100 bytes at 1e9 B/s) makes the cut before layer 2 cost 100.
        # Two devices: [0 | 1 2 3] or [0 1 2 | 3] = 30 (CP-SAT stopped at the 10 s limit with a
        # 91.7% gap before the fix); three: [0 | 1 2 | 3] = 20.
        code, doc, _ = solve_json(capsys, REPRO / "comm-stall.json", "--devices", devices, "--communication",
                                  "--time-limit", 10)
        assert code == 0 and doc["status"] == "optimal"
        assert doc["objective"][0]["value"] == value
        phase = doc["objective"][0]                 # proven: the bound meets the value (no gap left)
        assert phase["status"] == "OPTIMAL" and phase["solver_bound"] == phase["solver_value"]
        if devices == 3:
            assert ranges(doc) == expected
        else:
            assert ranges(doc) in ([(0, 2), (3, 3)], [(0, 0), (1, 3)])


def test_objective_values_in_profile_units(capsys):
    # compute 10.5, 20, 30, 40 cycles, 300 bytes each on 1,000-byte devices: one layer per device.
    # Fractional compute makes the solver scale times to integers; the plan reports 40 cycles.
    code, doc, err = solve_json(capsys, REPRO / "objective-value-scaled.json", "--devices", 4)
    assert code == 0
    time, memory = doc["objective"]
    assert (time["value"], time["bound"], time["unit"]) == (40, 40, "cycles")
    assert time["scale"] > 1 and time["solver_value"] == round(40 * time["scale"])
    assert (memory["value"], memory["unit"], memory["scale"]) == (300, "bytes", 1)
    main(["solve", str(REPRO / "objective-value-scaled.json"), "--devices", "4"])
    text = capsys.readouterr().out
    assert "bottleneck: stage 3 (layers 3..3): 40 cycles (40 ns)" in text
    assert "398" not in text


def test_objective_values_with_mixed_capacities():
    """On mixed devices memory is ranked as a fraction of each device's capacity."""
    from helpers import layer_model, options
    from stagesplit.plan.advise import advise
    model = layer_model([4, 4, 4, 4, 4, 4], [1, 1, 1, 1, 5, 5])
    plan = advise(model, indexed_inputs(model, options(3, [8, 16, 10], objective="memory"))).plan
    memory = plan.phases[0]
    assert (memory.quantity, memory.unit, memory.scale) == ("worst stage memory", "fraction of capacity", 1_000_000)
    # six layers of 4 on devices of 8, 16, 10: at most 2, 4, 2 layers. Layer counts (1, 3, 2)
    # give 4/8, 12/16, 8/10 -> 0.8; every other count uses some device fully (1.0)
    assert [(s.first_layer, s.last_layer) for s in plan.stages] == [(0, 0), (1, 3), (4, 5)]
    assert memory.value == 0.8 and memory.bound == 0.8
    assert memory.solver_value == 800_000


class TestMicroBatches:
    PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "bert-base.stagesplit"

    def test_default_is_the_number_of_devices_and_is_said(self, capsys):
        code, doc, _ = solve_json(capsys, self.PROFILE, "--devices", 8, "--schedule", "1f1b")
        assert doc["resolved"]["micro_batches"] == 8 and doc["resolved"]["micro_batches_auto"] is True
        assert any("--micro-batches not given: using 8" in n for n in doc["notes"])
        main(["solve", str(self.PROFILE), "--devices", "8", "--schedule", "gpipe"])
        text = capsys.readouterr().out
        assert "schedule: gpipe with 8 micro-batches" in text
        assert "note: --micro-batches not given: using 8" in text
        assert "with 1 micro-batches" not in text

    def test_explicit_one_micro_batch_with_a_schedule_warns(self, capsys):
        code, doc, _ = solve_json(capsys, self.PROFILE, "--devices", 8, "--schedule", "1f1b", "--micro-batches", 1)
        assert doc["resolved"]["micro_batches"] == 1 and doc["resolved"]["micro_batches_auto"] is False
        assert any("the same as --schedule none" in n for n in doc["notes"])
        # and it is indeed the same plan as no schedule
        _, none, _ = solve_json(capsys, self.PROFILE, "--devices", 8)
        assert ranges(doc) == ranges(none) and not none["notes"]

    def test_explicit_count_has_no_note(self, capsys):
        _, doc, _ = solve_json(capsys, self.PROFILE, "--devices", 8, "--schedule", "1f1b", "--micro-batches", 16)
        assert doc["resolved"]["micro_batches"] == 16 and doc["notes"] == []

    def test_sweep_rows_follow_the_device_count(self):
        from stagesplit.model.analysis import Analysis
        from stagesplit.plan.sweep import sweep
        from stagesplit.solver.problem import SolveOptions
        model = Analysis.load(self.PROFILE).model
        opts = SolveOptions(devices=9, schedule="gpipe", micro_batches=9, micro_batches_auto=True, time_limit=30)
        rows = sweep(model, indexed_inputs(model, opts), [7, 9])
        assert [r.micro_batches for r in rows] == [7, 9]
        assert [r.plan.inputs.micro_batches for r in rows] == [7, 9]


class TestStageDevices:
    """A stage's device position is shown and recorded even when positions are skipped."""

    def test_pinned_layer_skips_a_position(self, capsys):
        # pin the last layer to the last of 8 devices: the stages before it leave positions empty
        args = [TestMicroBatches.PROFILE, "--devices", 8, "--pin-layer", "11=7"]
        code, doc, _ = solve_json(capsys, *args)
        assert code == 0
        devices = [s["device"] for s in doc["stages"]]
        assert devices[-1] == 7 and devices == sorted(set(devices))
        assert len(devices) < 8 and any(s["stage"] != s["device"] for s in doc["stages"])   # a position skipped
        main(["solve", *map(str, args)])
        text = capsys.readouterr().out
        header = next(line for line in text.splitlines() if line.startswith("stage "))
        assert header.split()[:2] == ["stage", "device"]
        rows = [line.split() for line in text.splitlines() if line[:5].strip().isdigit()]
        assert [(int(r[0]), int(r[1])) for r in rows] == [(s["stage"], s["device"]) for s in doc["stages"]]


class TestGreedyIsPopLiners:
    PROFILE = TestMicroBatches.PROFILE

    def test_layer_count_loop_on_bert(self, capsys):
        # six devices: at 3+ layers per stage PopLiner's loop stops at 90% with four devices
        # (the one-layer-at-a-time first-fit alone used all six at 60%)
        from stagesplit.model.analysis import Analysis
        from stagesplit.plan.advise import advise
        from stagesplit.solver.dp import greedy
        from stagesplit.solver.problem import SolveOptions
        model = Analysis.load(self.PROFILE).model
        advice = advise(model, indexed_inputs(model, SolveOptions(devices=6, time_limit=30), compare=True))
        row = advice.baselines[0]
        assert row.method == "greedy (3+ layers, 90% of memory)"
        assert [(s.first_layer, s.last_layer) for s in row.stages] == [(0, 2), (3, 7), (8, 10), (11, 11)]
        one = greedy(advice.problem, min_layers_order=(1,))
        assert one.method == "greedy (1+ layers, 60% of memory)" and one.split.devices_used == 6

    def test_unlayered_first_flag(self, capsys):
        code, doc, _ = solve_json(capsys, self.PROFILE, "--devices", 6, "--compare", "--unlayered-first")
        assert code == 0
        greedy_row = doc["compare"][0]
        assert greedy_row["method"].startswith("greedy (") and greedy_row["method"].endswith(
            "of memory, unlayered code on stage 0)")
        _, plain, _ = solve_json(capsys, self.PROFILE, "--devices", 6, "--compare")
        assert "unlayered" not in plain["compare"][0]["method"]


def test_a_wrong_dp_optimum_is_caught_not_proven():
    """If the exact DP ever claimed a worse split optimal, CP-SAT's confirmation finds a better
    one: the solver must take that split, say so, and search on; never report the DP's worse
    answer as proven optimal."""
    from helpers import layer_model, options
    from stagesplit.solver.cpsat import solve_split_cpsat
    from stagesplit.solver.dp import Solution, exact_optimum, uniform
    from stagesplit.solver.problem import build_problem, evaluate_split
    # six layers, compute 1 2 3 4 5 6 on 3 roomy devices: the optimum bottleneck is 9 (1+2+3+4 | 5 | 6
    # would be 10; 1 2 3 | 4 5 | 6 gives 6, 9, 6), the uniform split 1 2 | 3 4 | 5 6 gives 11
    model = layer_model([1] * 6, [1, 2, 3, 4, 5, 6])
    problem = build_problem(model, options(3, 100))
    truth = exact_optimum(problem)
    wrong = uniform(problem)
    assert wrong.feasible and evaluate_split(problem, wrong.split).time > truth.evaluation.time
    lying_oracle = Solution(wrong.split, evaluate_split(problem, wrong.split), "dp")
    result = solve_split_cpsat(problem, oracle=lying_oracle)
    assert result.evaluation.key("compute") == truth.evaluation.key("compute")
    assert result.status == "optimal" and all(p.proof == "cp-sat" for p in result.phases)
    assert len(result.notes) == 1 and "below the exact DP's optimum" in result.notes[0]
    honest = solve_split_cpsat(problem, oracle=truth)
    assert honest.notes == [] and honest.evaluation.key("compute") == truth.evaluation.key("compute")
