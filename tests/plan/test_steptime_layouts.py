"""The layout search's step time against real runs of three layouts of two processes on this CPU
(issue #32: "a 2-process pipeline (and a TP 2 run) ... predicted vs measured step, and the same
order"): the small Hugging Face Llama of tests/steptime_harness.py (8 blocks, hidden 256), a global
batch of 4 micro-batches of 4 sequences, laid out as

* TP 2 x PP 1 x DP 1: the model's declared tensor-parallel plan applied by torch's
  ``parallelize_module`` on a gloo mesh of both processes (as ``capture --tp 2`` applied it), every
  micro-batch through the whole model on both ranks;
* TP 1 x PP 2 x DP 1: the plan of ``stagesplit solve --layer-compute --communication`` (1F1B),
  exported with ``--to torch-pipelining`` and its own program run;
* TP 1 x PP 1 x DP 2: torch's DistributedDataParallel, two micro-batches per rank, the gradients
  all-reduced in the last one's backward;

the three interleaved round by round (5 rounds after a warm-up; a step is the slower rank's), the
median round's step what a launch measured. Each
prediction is the layout search's step for that layout as a user asks for it (``layout_prediction``:
``stagesplit layouts --tp T --pp P --dp D --zero 0 --layer-compute ... --format json``; where the
search's PP 2 split is not the one that ran, ``layout_step``: the functions the search calls, that
split pinned), with each layer's compute measured on this CPU in the same rounds as the steps
(``layer_compute``; for TP 2, ``--tp-layer-compute 2=``: one tensor-parallel rank's blocks,
parallelized the same way over torch's fake process group, so that their collectives move nothing)
and the collectives priced on the target's node, whose links are fitted to gloo's measured
all-reduces. Nothing measured of the steps goes into a prediction.

What is asserted:

* the TP 2 run is real: both ranks compute the unparallelised model's loss (its collectives ran);
* every layout within TOLERANCE, the issue's 10%, its error the mean over LAUNCHES launches of the two
  processes, each a whole comparison of its own (its prediction from its own measurements; three runs
  of the test on this machine: TP 2 +0.8%, -1.0%, -8.2%, PP 2 +3.6% to +3.9%, DP 2 -0.7% to +3.6%;
  docs/benchmarks.md). One launch is not enough for TP 2: its step is half collectives, gloo
  all-reduces that cost from 1.8 to 2.7 ms each from one launch to the next on the same quiet machine
  (steady within one), a spread no all-reduce timed apart follows (one launch's TP 2 error ran from
  -11.7% to +4.3%). TP 2: the rank's compute and its 58
  all-reduces of a 256 KiB hidden state per micro-batch (and the head's all-gather), each priced in
  series at gloo's mean all-reduce (steptime_harness.py's ``_all_reduce``, ``_mean``). PP 2: the pipeline's transfers at the node's links. DP 2:
  DDP's gradient all-reduce at gloo's measured all-reduce, and its bucket copies (every gradient into
  its bucket and back, at the measured copy rate), none of it hidden under the backward: the target's
  node says ``overlaps_compute: false``, as each rank runs on one core with gloo's threads (before both
  rules, the all-reduce overlapped as on a GPU and the copies unpriced: -11.7% to -29.4% measured).
  As in tests/plan/test_steptime_real.py, a comparison with a layout outside 10% is measured once
  more (both launches), from the blocks up, and the second must hold (another job's burst can slow one measurement;
  an error of the model's shows in both);
* the same order wherever two predictions differ by more than SEPARATED (TP 2 is about three times
  slower than either other: DTensor's work on the host and the collectives; DP 2 and PP 2 are
  predicted within a few percent of each other, not separated).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import steptime_harness as harness  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timed]

TOLERANCE = 0.10
SEPARATED = 0.10
#: independent launches of the two processes whose errors are averaged (module docstring)
LAUNCHES = 2


def _table(rows) -> str:
    return "\n".join(f"{r.name}  {r.split:28} predicted {r.predicted * 1e3:7.1f} ms (pipeline {r.pipeline * 1e3:.1f}, "
                     f"TP {r.tp_comm * 1e3:.1f}, DP {r.dp_comm * 1e3:.1f})  measured {r.median * 1e3:7.1f} ms "
                     f"({r.error:+.1%})" for r in rows)


def _launches(tmp_path) -> tuple[list, list[float], str]:
    """``LAUNCHES`` launches of ``compare_layouts`` (each its own processes, its own prediction from
    its own measurements, its own steps): every launch's rows, each layout's mean error over the
    launches, and the table of both."""
    runs = [harness.compare_layouts(tmp_path, micro_batches=4, rounds=5, repeats=4) for _ in range(LAUNCHES)]
    if not all(machine.own_cores for machine, _ in runs):
        pytest.skip("the two ranks could not each have a core of their own here (no CAP_SYS_NICE, or one core): "
                    "their steps carry the machine's other work")
    launches = [rows for _, rows in runs]
    errors = [sum(rows[i].error for rows in launches) / LAUNCHES for i in range(len(harness.LAYOUTS))]
    table = "\n".join(f"launch {k + 1}:\n{_table(rows)}" for k, rows in enumerate(launches))
    table += "\nmean errors: " + ", ".join(f"{r.name} {e:+.1%}" for r, e in zip(launches[0], errors))
    return launches, errors, table


def test_layout_step_times_against_real_tp_pp_and_dp_runs(tmp_path):
    launches, errors, table = _launches(tmp_path)
    if any(abs(e) > TOLERANCE for e in errors):       # measured once more (module docstring)
        first = table
        launches, errors, table = _launches(tmp_path)
        table = f"first measurement:\n{first}\nmeasured again:\n{table}"
    for rows in launches:
        assert [(r.tp, r.pp, r.dp) for r in rows] == list(harness.LAYOUTS)
        assert [r.split for r in rows] == ["[ 0 1 2 3 4 5 6 7 ]", "[ 0 1 2 3 | 4 5 6 7 ]", "[ 0 1 2 3 4 5 6 7 ]"], table
        tp, pp, dp = rows
        assert tp.losses == pytest.approx([harness.reference_loss(4)] * 2, rel=1e-4)
        # what each layout's step is made of: only TP 2 has tensor-parallel collectives, only DP 2 a gradient all-reduce
        assert tp.tp_comm > 0 and tp.dp_comm == 0, table
        assert pp.tp_comm == 0 and pp.dp_comm == 0, table
        assert dp.tp_comm == 0 and dp.dp_comm > 0, table
        for row in rows:
            assert row.predicted == pytest.approx(row.pipeline + row.tp_comm + row.dp_comm, rel=1e-12)
        for a in rows:
            for b in rows:
                if a.predicted < b.predicted * (1 - SEPARATED):
                    assert a.median < b.median, table
    for error in errors:
        assert abs(error) <= TOLERANCE, table
