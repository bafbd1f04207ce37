"""Shared by the benchmark scripts: the BERT-Large-scale profile, timing and memory helpers."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
#: the tests' support modules too: tests/indexed_inputs.py gives options written in layer indices
#: their plan inputs, as the tests do
sys.path.append(str(ROOT / "tests"))


#: ``--tiny``: every script's own code path on tiny inputs, in seconds (tests/test_benchmarks.py
#: runs each so, that a refactor cannot break one silently); the figures it prints are not the
#: benchmark's. (Some scripts also have a ``--quick``: a shorter benchmark, its figures real.)
TINY_FLAG = "--tiny"


def tiny_mode(argv: list[str] | None = None) -> bool:
    """Whether the script was asked for its tiny run (``--tiny`` among the arguments)."""
    return TINY_FLAG in (sys.argv[1:] if argv is None else argv)


def bert_large_profile_path(tiny: bool = False) -> Path:
    """Generate (once per machine, cached in the temp folder) the BERT-Large-scale profile:
    26 layers (embeddings, 24 encoder layers, head), 1472 tiles, ~5,500 steps, ~1.26 M variables.
    ``tiny``: the same generator's BERT with 4 encoder layers (the embeddings and the head group
    with the first and the last: 4 layers), ~170 K variables, made in a second or two."""
    import hashlib

    import stagesplit.io.builder
    import stagesplit.io.synth
    source = "".join(Path(m.__file__).read_text() for m in (stagesplit.io.synth, stagesplit.io.builder))
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]          # regenerate when the generator changes
    name = "bert-4-layers" if tiny else "bert-large"
    path = Path(tempfile.gettempdir()) / f"stagesplit-bench-{name}-{digest}.stagesplit"
    if not path.exists():
        # in a child process: Linux keeps a process's peak RSS across fork and exec, so a parent
        # grown by the generator would show in every measurement it starts afterwards
        start = time.perf_counter()
        family = "'bert-base', layers=4" if tiny else "'bert-large'"
        code = ("from stagesplit.io.targets import load_target; from stagesplit.io import save_profile; "
                "from stagesplit.io.synth import synthesize; import sys; save_profile(synthesize("
                f"{family}, target=load_target('ipu-mk2'), piece_bytes=4096, programs_per_op=6), sys.argv[1])")
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=str(ROOT),
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(f"generated {path.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def status_mb(field: str) -> float | None:
    """A memory field of Linux's ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...) in MiB; None elsewhere."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def own_peak_rss_mb() -> float:
    """This process image's own peak resident memory (Linux's ``VmHWM``): Linux carries ``ru_maxrss``
    over an exec, so a script ``run_measurement`` starts from a parent that had imported torch reads
    the parent's peak there; elsewhere ``peak_rss_mb``."""
    own = status_mb("VmHWM")
    return peak_rss_mb() if own is None else own


def run_measurement(script: str, *args: str) -> dict:
    """Run ``script --measure args`` in a fresh interpreter (so its peak memory is its own)."""
    proc = subprocess.run([sys.executable, script, "--measure", *args], capture_output=True, text=True,
                          cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(title: str, rows: list[tuple[str, str, str]]) -> None:
    width = [max(len(r[i]) for r in rows + [("measure", "value", "target")]) for i in range(3)]
    print(title)
    print("=" * len(title))
    print(f"{'measure'.ljust(width[0])}  {'value'.rjust(width[1])}  {'target'.ljust(width[2])}")
    print(f"{'-' * width[0]}  {'-' * width[1]}  {'-' * width[2]}")
    for name, value, target in rows:
        print(f"{name.ljust(width[0])}  {value.rjust(width[1])}  {target.ljust(width[2])}")
    print()
