"""``--time-limit`` on long schedule searches (issue #34): thousands of micro-batches, many
chunks per device, a wide captured model, every schedule search kind (one schedule, ``--schedule
auto``, ``--objective devices``, both, and the limit from a settings file). Each solve (its
pricing included) ends within twice the limit plus 5 s and says what it proved: a plan proven
optimal, one marked not proven (the time limit named), or the one-line error where nothing was
found."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from stagesplit import api
from stagesplit.cli import main
from stagesplit.common.deadline import TimeLimitReached
from stagesplit.model.phases import phase_table

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 3.0
#: a wide model: the example GPT with 62 blocks (64 layers with the embedding and the head)
FACTORY = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from examples.gpt import GPTConfig, build as build_gpt


def build():
    return build_gpt(GPTConfig(vocab_size=64, context=8, d_model=16, heads=2, layers=62, batch=2))
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The wide capture, read once; and how long reading it and pricing its ranges take (each
    solve below prices them again: they are timed with the search, a bound on its time)."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("wide")
    (folder / "wide_gpt.py").write_text(FACTORY)
    path = folder / "wide.stagesplit"
    assert main(["capture", f"{folder / 'wide_gpt.py'}:build", "-o", str(path)]) == 0
    started = time.monotonic()
    analysis = api.analyze(str(path))
    phase_table(analysis.model)
    return path, analysis, time.monotonic() - started


def _says_what_was_proven(plan) -> None:
    """A plan proven optimal names no time limit; any other names it (or, for --schedule auto, the
    schedules it did not finish do), and the devices search says what it knows about fewer devices."""
    said = " ".join([plan.message, *plan.notes, *(c.note for c in plan.candidates)])
    if plan.status == "optimal" and all(c.status != "unknown" for c in plan.candidates):
        assert "time limit" not in said
    else:
        assert "time limit" in said, said
    if plan.inputs.options.objective.value == "devices" and plan.feasible:
        note = next(n for n in plan.notes if n.startswith("`objective='devices'`: "))
        assert note.startswith(f"`objective='devices'`: {plan.devices} device")
        assert plan.devices == 1 or "proven by CP-SAT" in note or "not known" in note or "cannot" in note


CASES = {
    "interleaved, 16 chunks per device": dict(devices=2, schedule="interleaved-1f1b", chunks_per_rank=16,
                                              micro_batches=4096),
    "looped-bfs, 8 chunks per device": dict(devices=4, schedule="looped-bfs", chunks_per_rank=8, micro_batches=2048),
    "zbv": dict(devices=8, schedule="zbv", micro_batches=4096),
    "auto": dict(devices=4, schedule="auto", micro_batches=4096),
    "devices, 1f1b": dict(devices=32, schedule="1f1b", micro_batches=4096, objective="devices"),
    "devices, auto": dict(devices=16, schedule="auto", micro_batches=4096, objective="devices"),
    "devices, interleaved": dict(devices=16, schedule="interleaved-1f1b", chunks_per_rank=4, micro_batches=4096,
                                 objective="devices"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_long_schedule_search_stops_at_the_time_limit(wide, case):
    _, analysis, _ = wide
    started = time.monotonic()
    try:
        plan = api.solve(analysis, time_limit=LIMIT, **CASES[case])
    except TimeLimitReached as error:
        plan = None
        assert str(error).startswith(f"no split was found within the time limit ({LIMIT:g} s)")
    took = time.monotonic() - started
    assert took < 2 * LIMIT + 5, f"{case}: {took:.1f} s"
    if plan is not None:
        _says_what_was_proven(plan)


def test_the_limit_from_a_settings_file_bounds_the_command(wide, tmp_path, capsys):
    """``time_limit: 3`` in a --config file, --schedule auto and --objective devices with 4,096
    micro-batches: the whole command takes the time to read and price the profile, then at most
    twice the limit plus 5 s."""
    path, _, reading = wide
    settings = tmp_path / "solver.yaml"
    settings.write_text("time_limit: 3\nschedule: auto\nobjective: devices\n")
    started = time.monotonic()
    code = main(["solve", str(path), "--devices", "16", "--micro-batches", "4096", "--config", str(settings)])
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert took < reading + 2 * LIMIT + 5, f"{took:.1f} s (reading and pricing {reading:.1f} s)"
    if code == 0:
        assert "time limit (3 s)" in out or "proven" in out, out
    else:
        assert err.strip().splitlines()[-1] == ("stagesplit: error: no split was found within the time limit (3 s); "
                                                "allow more with --time-limit")


if __name__ == "__main__":                 # pragma: no cover - a manual run
    sys.exit(pytest.main([__file__, "-q"]))
