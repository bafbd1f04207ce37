"""The exported pipelines' real step (issue #30): Hugging Face decoder families from configs
(GPT-2, Llama, Qwen2, Mistral, GPT-NeoX, OPT, Phi-3, Qwen3, Gemma; 8 blocks, float32, SDPA, labels =
input ids), each captured once, solved under every schedule torch ships (two chunks per device
where chunked) for 2 and 4 devices with 2 x devices micro-batches, exported with ``--to
torch-pipelining`` and the exported file's own program run on as many CPU processes (gloo):
``build_pipeline``, ``train_step``, ``sum_tied_gradients``, Adam, ``zero_grad`` as the export says.
Each rank's peak is measured by torch's MemTracker (tests/pipeline_harness.py says how).

Printed per (family, schedule, P): the plan's predicted peak against the measured one for the
rank where they differ most ((predicted - measured) / measured: negative means the plan
under-predicts, the direction that runs out of memory), whether the loss and every gradient
equal the unpipelined model's, and the measured step's wall time; then the worst rank per family
and schedule (the table in the README).

Run: ``python benchmarks/bench_exported.py`` (126 runs, about 8 minutes on 2 cores); ``--tiny``: Llama
under 1F1B on 2 processes (the same code path, under a minute).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="Llama under 1F1B on 2 processes")
    parser.add_argument("--families", help="comma-separated families (default: the README's table; the "
                        "mixture-of-experts ones in bfloat16)")
    parser.add_argument("--schedules", help="comma-separated schedules (default: every one torch ships)")
    args = parser.parse_args(argv)
    import decoder_families
    import exported_matrix
    families = (["llama"] if args.tiny else
                args.families.split(",") if args.families
                else list(decoder_families.TABLE_FAMILIES))
    schedules = (["1f1b"] if args.tiny else args.schedules.split(",") if args.schedules
                 else list(exported_matrix.SCHEDULES))
    devices = [2] if args.tiny else [2, 4]
    cases = [(f, s, p) for p in devices for f in families for s in schedules]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-exported-") as folder:
        rows = exported_matrix.run_matrix(cases, Path(folder))
    print(f"{'family':9} {'schedule':17} {'P':>2} {'M':>2}  {'worst rank':>10}  {'predicted':>11}  {'measured':>11}  "
          f"{'loss equal':>10}  {'gradient error':>14}  {'step (s)':>8}")
    for r in rows:
        k = max(range(len(r.errors)), key=lambda i: abs(r.errors[i]))
        same = abs(r.loss - r.reference_loss) <= 1e-5 * abs(r.reference_loss)
        print(f"{r.family:9} {r.schedule:17} {r.devices:>2} {r.micro_batches:>2}  {100 * r.errors[k]:>+9.2f}%  "
              f"{r.predicted[k]:>11,}  {r.measured[k]:>11,}  {'yes' if same else 'NO':>10}  {r.gradient_error:>14.1e}  "
              f"{r.seconds:>8.3f}")
    print()
    print("worst rank over P = " + " and ".join(map(str, devices)) + " (per family and schedule):")
    print("| family | " + " | ".join(schedules) + " |")
    print("|---|" + "---|" * len(schedules))
    for family in families:
        cells = []
        for s in schedules:
            worst = max((r.worst for r in rows if r.family == family and r.schedule == s), key=abs)
            cells.append(f"{100 * worst:+.2f}%")
        print(f"| {family} | " + " | ".join(cells) + " |")
    print(f"\n{len(rows)} runs in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
