"""Benchmark the PopVision reader (the ``stagesplit convert profile.pop`` path) at BERT-Large scale.

Builds the BERT-Large-scale synthetic profile (26 layers, 1472 tiles, ~5,500 steps, ~1.26 M
lowered variables), turns it into a report of the fake libpva in tests/fake_pva (the real one
ships only with the Poplar SDK), then times ``read_popvision`` (on two cores, as it reads a
report this large by default, and in one process), writing and reading the compact
file, and ``diagnose`` of the whole profile against its ground truth, and prints wall time and
peak resident memory per phase.

Run from the repository root:  python benchmarks/bench_popvision.py [--ipus 2] [--piece-bytes N] [--tiny]
(``--tiny``: the same phases on a BERT with 4 encoder layers, in seconds.)

Peak RSS is the process's high-water mark after each phase (``resource.getrusage``); where
Linux allows resetting it (``/proc/self/clear_refs``), the phase's own peak is shown too.
The fake report makes its objects on access, as libpva does; what it keeps counts in the
process peak. The two-process read's forked child has its own peak, printed apart.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fake_pva"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import pva  # noqa: E402  (the fake libpva)
from _common import status_mb  # noqa: E402

from stagesplit.io import load_profile  # noqa: E402
from stagesplit.io.compact import write_compact  # noqa: E402
from stagesplit.io.popvision import read_popvision  # noqa: E402
from stagesplit.io.synth import synthesize  # noqa: E402
from stagesplit.io.targets import load_target  # noqa: E402
from stagesplit.model.analysis import Analysis  # noqa: E402
from stagesplit.reporting.diagnosis import diagnose  # noqa: E402


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0      # KiB on Linux


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _rss_mb() -> float:
    rss = status_mb("VmRSS")
    return float("nan") if rss is None else rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="bert-large")
    ap.add_argument("--target", default="ipu-mk2")
    ap.add_argument("--piece-bytes", type=int, default=4096)
    ap.add_argument("--programs-per-op", type=int, default=6)
    ap.add_argument("--ipus", type=int, default=1, help="IPUs in the fake report (IPU 2.. mirror the first)")
    ap.add_argument("--tiny", action="store_true",
                    help="bert-base with 4 encoder layers: the same code in seconds (not the benchmark's figures)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.family = "bert-base"
    params = {"layers": 4} if args.tiny else {}

    rows = []

    def phase(name, fn):
        gc.collect()
        before = _rss_mb()
        resettable = _reset_peak()
        t0 = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - t0
        rows.append((name, wall, _peak_mb() if resettable else float("nan"), _rss_mb() - before, _peak_mb()))
        return result

    profile = phase("synthesize profile", lambda: synthesize(
        args.family, load_target(args.target), piece_bytes=args.piece_bytes, programs_per_op=args.programs_per_op,
        **params))
    report = phase("fake pva report (lazy)", lambda: pva.report_from_profile(profile, ipus=args.ipus))
    with tempfile.TemporaryDirectory() as tmp:
        pop = pva.register(Path(tmp) / "profile.pop", report)
        read = phase("read_popvision, two processes", lambda: read_popvision(pop, workers=2))
        child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
        # a fresh report: the double keeps what it made on first access, as the first read left it
        one = pva.register(Path(tmp) / "one" / "profile.pop", pva.report_from_profile(profile, ipus=args.ipus))
        phase("read_popvision, one process", lambda: read_popvision(one, workers=1))
        out = Path(tmp) / "model.stagesplit"
        phase("write compact .stagesplit", lambda: write_compact(read, out))
        size = out.stat().st_size
        back = phase("load compact .stagesplit", lambda: load_profile(out))
        assert len(back.variables) == len(profile.variables)
        report = read = None            # let the fake report and the first read go
        model = phase("group layers + cost model", lambda: Analysis.of(back).model)
        found = phase("diagnose (whole profile)", lambda: diagnose(model))
        check = found.stages[0].ground_truth

    print(f"{args.family} on {args.target}: {len(profile.variables):,} variables, {profile.num_steps:,} steps, "
          f"{len(profile.programs):,} programs, {len(profile.operations):,} operations, "
          f"{len(profile.liveness):,} liveness classes; fake report on {args.ipus} IPU(s); "
          f"compact file {size / 1e6:.1f} MB")
    print(f"the two-process read's forked child peaked at {child_peak:,.0f} MB RSS")
    print(f"diagnose: bottleneck tile {found.stages[0].tile} at step {found.stages[0].step}; modelled "
          f"{check.modelled:,} vs ground truth {check.measured:,} bytes ({check.unexplained:,} unexplained)")
    header = ("phase", "wall s", "phase peak RSS MB", "RSS change MB", "process peak RSS MB")
    print(f"{header[0]:<32}{header[1]:>8}{header[2]:>19}{header[3]:>15}{header[4]:>21}")
    for name, wall, phase_peak, grew, peak in rows:
        print(f"{name:<32}{wall:>8.2f}{phase_peak:>19.0f}{grew:>15.0f}{peak:>21.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
