"""The plan's step time against reality on this CPU (issue #32): a small Hugging Face Llama (8
blocks, hidden 256, FFN 1024, 4 heads, 2 key/value heads, vocabulary 256, 4 sequences of 64 tokens
per micro-batch, float32, Adam), each block's forward, backward and optimizer step timed on this CPU
(one thread per process) and given by phase to ``stagesplit solve --layer-compute`` with a target file of this CPU (FLOP and copy rates, gloo's
point-to-point link, measured), then each plan exported with ``--to torch-pipelining`` and its own
program run on two gloo processes, the plans interleaved round by round (tests/steptime_harness.py
says how).

Printed: what was measured of the machine (rates, the link's one-way times, each block's forward,
backward and optimizer step), then per plan (schedule, micro-batches, split: the solver's, or forced
with ``--pin-split``): the plan's step time, the measured step (median of the rounds, and the
range), the error, and each rank's busy time, predicted and measured, and the step the same blocks
predict given as one total per layer (tests/steptime_harness.py's OPTIMIZER says why by phase); then
whether the measured steps keep the plans' order.

Then the layouts of the same two processes (issue #32's TP 2 run): TP 2, PP 2 and DP 2 of one global
batch, each the layout search's step (plan/layouts.py, with the per-layer compute measured: a TP
rank's blocks for TP 2) against a real run of it (tensor parallelism by torch's ``parallelize_module``
with the model's declared plan, the exported pipeline, DDP): predicted, of which compute and bubble,
the collectives, measured, error, and whether the order is kept.

Run: ``python benchmarks/bench_steptime.py`` (12 plans, 7 rounds, then the three layouts: about 4
minutes on 2 cores); ``--tiny``: two plans, two rounds, no layouts (the same code path for the plans,
under a minute).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _blocks(split: str) -> str:
    """A plan's split as its stages' blocks, ``0-3 / 4-7`` (no ``|``: the table's cells are markdown)."""
    stages = [part.split() for part in split.strip("[] ").split("|")]
    return " / ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else s[0] for s in stages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="two plans, two rounds")
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds (default: 7)")
    args = parser.parse_args(argv)
    import steptime_harness as harness
    Case = harness.Case
    if args.tiny:
        cases, rounds, repeats = [Case("1f1b", 4), Case("1f1b", 4, 2)], 2, 2
    else:
        cases = [Case(s, 4, k) for s in ("1f1b", "gpipe") for k in (None, 6, 2, 1)]
        cases += [Case(s, 8, k) for s in ("1f1b", "gpipe") for k in (None, 2)]
        rounds, repeats = args.rounds, 7
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-steptime-") as folder:
        machine, rows = harness.compare(Path(folder), cases, rounds=rounds, repeats=repeats)
    m = machine
    print("Machine (two processes, one thread each; medians over both ranks)")
    print(f"own cores: {'yes' if m.own_cores else 'no (the steps carry the machine load)'}")
    print(f"matrix product: {m.flops_per_s / 1e9:.1f} GFLOP/s; copy: {m.memory_bytes_per_s / 1e9:.2f} GB/s")
    print(f"gloo point-to-point: latency {m.latency_s * 1e6:.0f} us, bandwidth {m.bytes_per_s / 1e9:.2f} GB/s "
          "(fitted); one-way: " + ", ".join(f"{s // 1024} KiB {_ms(t)} ms" for s, t in sorted(m.one_way.items())))
    print("all-reduce: " + ", ".join(f"{s // 1024} KiB {_ms(t)} ms" for s, t in sorted(m.all_reduce.items())))
    print("blocks (forward / backward / optimizer, ms, with the steps): " + "; ".join(
        f"{k}: {_ms(f)} / {_ms(b)} / {_ms(o)}" for k, (f, b, o) in enumerate(zip(m.forward, m.backward, m.optimizer))))
    print()
    print("| schedule | M | split | predicted | measured (median) | range | error | busy predicted | busy measured "
          "| given as totals: predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        how = "solver" if r.case.split_at is None else "pinned"
        totals_error = (r.predicted_from_totals - r.median) / r.median
        print(f"| {r.case.schedule} | {r.case.micro_batches} | {_blocks(r.split)} ({how}) | {_ms(r.predicted)} ms | "
              f"{_ms(r.median)} ms | {_ms(min(r.measured))}-{_ms(max(r.measured))} | {100 * r.error:+.1f}% | "
              f"{' / '.join(_ms(b) for b in r.busy)} | {' / '.join(_ms(b) for b in r.busy_measured)} | "
              f"{_ms(r.predicted_from_totals)} ms | {100 * totals_error:+.1f}% |")
    print()
    worst = max(rows, key=lambda r: abs(r.error))
    print(f"worst error: {100 * worst.error:+.1f}% ({worst.case.schedule}, {_blocks(worst.split)}); "
          f"within 10%: {sum(abs(r.error) <= 0.10 for r in rows)} of {len(rows)}")
    for schedule, count in sorted({(r.case.schedule, r.case.micro_batches) for r in rows}):
        group = [r for r in rows if (r.case.schedule, r.case.micro_batches) == (schedule, count)]
        predicted = [_blocks(r.split) for r in sorted(group, key=lambda r: r.predicted)]
        measured = [_blocks(r.split) for r in sorted(group, key=lambda r: r.median)]
        print(f"order {schedule}, {count} micro-batches: {'same' if predicted == measured else 'differs'} "
              f"(predicted {', '.join(predicted)}; measured {', '.join(measured)}, fastest first)")
    print(f"\n{len(rows)} plans, {rounds} rounds, in {time.perf_counter() - start:.0f} s")
    if not args.tiny:                  # not cheap: two more captures and three more runs (about 45 s)
        _layouts(harness, rounds, repeats)
    return 0


def _layouts(harness, rounds: int, repeats: int) -> None:
    """The layout search's step for TP 2, PP 2 and DP 2 of one global batch (4 micro-batches) against
    real runs of each on the same two processes (``compare_layouts``)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-steptime-layouts-") as folder:
        machine, rows = harness.compare_layouts(Path(folder), micro_batches=4, rounds=rounds, repeats=repeats)
    latency, bandwidth = machine.reduce_link
    print()
    print("Layouts of two processes, a global batch of 4 micro-batches (the layout search's step, plan/layouts.py)")
    print("all-reduce (8 back to back, mean): " + ", ".join(
        f"{s // 1024} KiB {_ms(t)} ms" for s, t in sorted(machine.all_reduce.items()))
        + f"; the node's link fitted to them: latency {latency * 1e6:.0f} us, {bandwidth / 1e9:.2f} GB/s")
    print("a TP 2 rank's blocks (forward / backward / optimizer, ms, with the steps): " + "; ".join(
        f"{k}: {_ms(f)} / {_ms(b)} / {_ms(o)}"
        for k, (f, b, o) in enumerate(zip(machine.tp_forward, machine.tp_backward, machine.tp_optimizer))))
    print()
    print("| layout | split | predicted | of which compute and bubble | TP collectives | DP exposed | "
          "measured (median) | range | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.name} | {_blocks(r.split)} | {_ms(r.predicted)} ms | {_ms(r.pipeline)} ms | {_ms(r.tp_comm)} ms | "
              f"{_ms(r.dp_comm)} ms | {_ms(r.median)} ms | {_ms(min(r.measured))}-{_ms(max(r.measured))} | "
              f"{100 * r.error:+.1f}% |")
    tp = rows[0]
    print(f"\nTP 2's loss on both ranks: {', '.join(f'{x:.6f}' for x in tp.losses)} (the unparallelised model's: "
          f"{harness.reference_loss(4):.6f})")
    predicted = [r.name for r in sorted(rows, key=lambda r: r.predicted)]
    measured = [r.name for r in sorted(rows, key=lambda r: r.median)]
    print(f"order: {'same' if predicted == measured else 'differs'} (predicted {', '.join(predicted)}; measured "
          f"{', '.join(measured)}, fastest first)")
    print(f"{len(rows)} layouts, {rounds} rounds, in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
