"""Start-up benchmark (issue 11): the light commands import neither the solver (OR-Tools) nor
plotting (matplotlib) nor pandas, and `stagesplit --help` answers in under 0.3 s.

Each command runs 5 times in a fresh interpreter; the table shows the median wall time and the
heavy modules that ``python -X importtime`` saw imported.

Run from the repository root:  python benchmarks/bench_startup.py [--tiny]
(``--tiny``: each command once, not 5 times.)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ROOT, print_table, tiny_mode

HEAVY = ("ortools", "matplotlib", "pandas", "torch", "onnx", "scipy")
COMMANDS = (["--help"], ["targets"], ["breakdown", "profiles/tiny.json", "--sections", "totals"],
            ["convert", "profiles/tiny.json", "-o", os.path.join(tempfile.gettempdir(), "stagesplit-startup.json")])


def heavy_imports(argv: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "stagesplit", *argv], capture_output=True,
                          text=True, cwd=str(ROOT))
    seen = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:"):
            module = line.rsplit("|", 1)[-1].strip().split(".")[0]
            if module in HEAVY:
                seen.add(module)
    return sorted(seen)


def wall(argv: list[str], runs: int = 5) -> tuple[float, float]:
    """Median wall seconds and the largest peak RSS (MB) of ``runs`` runs."""
    times, peaks = [], []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "stagesplit", *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=str(ROOT))
        _, _, usage = os.wait4(proc.pid, 0)                # this child's own peak RSS
        times.append(time.perf_counter() - start)
        peaks.append(usage.ru_maxrss / 1024)
        proc.returncode = 0
    return statistics.median(times), max(peaks)


def main() -> None:
    runs = 1 if tiny_mode() else 5
    rows = []
    for argv in COMMANDS:
        label = "stagesplit " + " ".join(argv[:2])
        heavy = heavy_imports(argv)
        target = "< 0.3 s" if argv == ["--help"] else ""
        seconds, rss = wall(argv, runs)
        rows.append((label, f"{seconds:.2f} s, {rss:,.0f} MB peak RSS; heavy imports: {', '.join(heavy) or 'none'}",
                     target + ("; none" if target else "none")))
    print_table(f"Start-up: median of {runs} run{'s' if runs > 1 else ''} in a fresh interpreter, peak RSS, heavy "
                "modules imported", rows)


if __name__ == "__main__":
    main()
