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

the three interleaved round by round (5 rounds after a warm-up; a step is the slower rank's). Each
prediction is plan/layouts.py's ``step_of`` on the engine's split of that layout (the calls the
layout search makes for a combination; ``layout_step``), with each layer's compute measured on this
CPU in the same rounds as the steps (``layer_compute``: for TP 2, one tensor-parallel rank's blocks,
parallelized the same way over torch's fake process group, so that their collectives move nothing)
and the collectives priced on the target's node, whose links are fitted to gloo's measured
all-reduces. Nothing measured of the steps goes into a prediction.

What holds, and is asserted:

* the TP 2 run is real: both ranks compute the unparallelised model's loss (its collectives ran);
* PP 2 within TOLERANCE (15%, as tests/plan/test_steptime_real.py and for the same reasons: the two
  cores of this loaded virtual machine are not independent devices; docs/benchmarks.md), DP 2 within
  DP_TOLERANCE (20%: the model overlaps DDP's all-reduce with the last backward, as a GPU runs it
  beside the compute, but here gloo sums and sends on the rank's own core, and it is under-predicted
  by 10% to 17%);
* TP 2: the rank's compute alone (the pipeline part of the step: its blocks under the fake group)
  within TOLERANCE of the measured step, and the measured step below the prediction with the
  collectives priced in series on the node's links. That is the gap this test records rather than
  hides: gloo's all-reduce of a 256 KiB hidden state takes about 2 ms alone on this machine (timed
  back to back, and so between matrix products), but inside the TP run the 58 per micro-batch add
  0.1 to 0.3 ms each (the real run and the same blocks under the fake group differ by that): torch
  issues them asynchronously (functional collectives) and DTensor's own work on the host hides
  their wait, which the layout search, pricing them in series, does not model; TP 2 is
  over-predicted by about 80% (docs/benchmarks.md);
* the same order wherever two predictions differ by more than SEPARATED (TP 2 the slowest, by far
  in both; DP 2 the fastest, about 11% ahead of PP 2 in the predictions)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import steptime_harness as harness  # noqa: E402

pytestmark = pytest.mark.slow

TOLERANCE = 0.15
DP_TOLERANCE = 0.20
SEPARATED = 0.10


def _table(rows) -> str:
    return "\n".join(f"{r.name}  {r.split:28} predicted {r.predicted * 1e3:7.1f} ms (pipeline {r.pipeline * 1e3:.1f}, "
                     f"TP {r.tp_comm * 1e3:.1f}, DP {r.dp_comm * 1e3:.1f})  measured {r.median * 1e3:7.1f} ms "
                     f"({r.error:+.1%})" for r in rows)


def test_layout_step_times_against_real_tp_pp_and_dp_runs(tmp_path):
    machine, rows = harness.compare_layouts(tmp_path, micro_batches=4, rounds=5, repeats=4)
    if not machine.own_cores:
        pytest.skip("the two ranks could not each have a core of their own here (no CAP_SYS_NICE, or one core): "
                    "their steps carry the machine's other work")
    table = _table(rows)
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
    assert abs(pp.error) <= TOLERANCE, table
    assert abs(dp.error) <= DP_TOLERANCE, table
    assert abs(tp.pipeline - tp.median) <= TOLERANCE * tp.median, table
    assert tp.median < tp.predicted, table
    for a in rows:
        for b in rows:
            if a.predicted < b.predicted * (1 - SEPARATED):
                assert a.median < b.median, table
