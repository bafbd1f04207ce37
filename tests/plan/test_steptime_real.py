"""The plan's step time against a real pipeline's on this CPU (issue #32), the user's path with a
machine of their own (tests/steptime_harness.py says how): every block of a small Hugging Face
Llama (8 blocks, hidden 256) timed on this CPU, one thread per process, and given to ``stagesplit
solve`` with ``--layer-compute``, with a target file of this CPU (its FLOP and copy rates, gloo's
link between two processes, measured); the solver's split and a deliberately unbalanced one (2 | 6
blocks) under 1F1B and GPipe with 4 micro-batches, each exported with ``--to torch-pipelining`` and
its own program run on two gloo processes, the four interleaved round by round.

* every plan's step time within TOLERANCE of the measured step (the median of 7 rounds);
* the same order: wherever two plans' step times differ by more than 10%, the measured steps are
  in the same order (the solver's split is the faster under both schedules).

TOLERANCE is the issue's 10%. The two ranks are two cores of a virtual machine shared with other
jobs, not two devices: the harness makes them behave like two (sessions of their own, memory kept, a
filler on each core while its rank waits: tests/steptime_harness.py), and on the machine this was
written on every plan comes within -0.9% to +3.4% (three runs; docs/benchmarks.md). Another job's
burst can still slow one measurement, so a comparison with a plan outside 10% is measured once more,
from the blocks up, and the second must hold: an error of the model's shows in both (before the
filler, a fresh-clone CI run on another machine of this kind measured a heavy rank 17% faster than
its blocks said, in every round).

The prediction is the tool's own model on the measured blocks; nothing measured from the
pipeline's steps goes into it."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import steptime_harness as harness  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timed]

TOLERANCE = 0.10
#: plans whose step times differ by more than this are measured in the same order
SEPARATED = 0.10


def _table(rows) -> str:
    return "\n".join(f"{r.case.schedule:6} {r.split:28} predicted {r.predicted * 1e3:7.1f} ms  measured "
                     f"{r.median * 1e3:7.1f} ms ({r.error:+.1%}); busy predicted "
                     f"{', '.join(f'{b * 1e3:.0f}' for b in r.busy)} ms, measured "
                     f"{', '.join(f'{b * 1e3:.0f}' for b in r.busy_measured)} ms" for r in rows)


def test_step_time_against_the_exported_pipeline(tmp_path):
    cases = [harness.Case(schedule, 4, split_at) for schedule in ("1f1b", "gpipe") for split_at in (None, 2)]
    machine, rows = harness.compare(tmp_path, cases, rounds=7, repeats=4)
    if not machine.own_cores:
        pytest.skip("the two ranks could not each have a core of their own here (no CAP_SYS_NICE, or one core): "
                    "their steps carry the machine's other work")
    first = ""
    if any(abs(row.error) > TOLERANCE for row in rows):       # measured once more (module docstring)
        first = f"first measurement:\n{_table(rows)}\nmeasured again:\n"
        machine, rows = harness.compare(tmp_path, cases, rounds=7, repeats=4)
    table = first + _table(rows)
    # the solver's split is the balanced one; the forced one is what it was asked for
    assert [r.split for r in rows] == ["[ 0 1 2 3 | 4 5 6 7 ]", "[ 0 1 | 2 3 4 5 6 7 ]"] * 2, table
    for row in rows:
        assert abs(row.error) <= TOLERANCE, table
    for a in rows:
        for b in rows:
            if a.predicted < b.predicted * (1 - SEPARATED):
                assert a.median < b.median, table
