"""Synthetic profile variants for ``stagesplit solve a=0.2 b=0.6 ...``: a synthetic profile
re-costed as if compiled at other available memory proportions.

    python examples/make_variants.py 0.2 0.4 0.6
    stagesplit solve bert-base-amp0.2.stagesplit=0.2 bert-base-amp0.4.stagesplit=0.4 \
        bert-base-amp0.6.stagesplit=0.6 --devices 3
    stagesplit solve bert-base-variants.yaml --devices 3       # the same, from the variants file

A real variant is one more compile of the model with ``opts.setAvailableMemoryProportion(...)``
(PopTorch) at another value. Here the shipped synthetic BERT-base (profiles/bert-base.stagesplit,
taken as compiled at 0.2) stands in: at proportion ``p`` every matmul's temporary memory (its
``workspace`` and ``grad_workspace`` variables) scales by ``p / 0.2`` and its programs' cycles
by ``sqrt(0.2 / p)`` (more temporary memory: a more parallel plan). The figures are made up,
and the profiles say so (synthetic).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from anywhere in a checkout

ROOT = Path(__file__).resolve().parent.parent
BASE_PROPORTION = 0.2
MATMUL_MARKERS = ("MatMul", "dense", "query", "key", "value")


def is_matmul(name: str) -> bool:
    """Whether an operation (or the variable named after it) is a matrix multiplication."""
    return any(marker in name for marker in MATMUL_MARKERS)


def variant(profile, proportion: float, base: float = BASE_PROPORTION):
    """``profile`` (a synthetic profile compiled at ``base``) as if compiled at ``proportion``."""
    if not 0 < proportion <= 1:
        raise ValueError(f"a memory proportion is in (0, 1], got {proportion}")
    v, ops = profile.variables, profile.operations
    temporary = np.array([name.endswith(("/workspace", "/grad_workspace")) and is_matmul(name)
                          for name in (profile.variable_name(i) for i in range(len(v)))], bool)
    v.bytes = np.where(temporary, np.maximum(np.round(v.bytes * (proportion / base)), 1), v.bytes).astype(v.bytes.dtype)
    slower = np.zeros(len(profile.programs), bool)
    for i, name in enumerate(ops.name):
        if is_matmul(name):
            slower[ops.programs.values[ops.programs.offsets[i]:ops.programs.offsets[i + 1]]] = True
    profile.programs.cycles = np.where(slower, profile.programs.cycles * math.sqrt(base / proportion),
                                       profile.programs.cycles)
    profile.ground_truth = None                     # the compile's own totals no longer apply
    info = profile.info
    info.name = f"{info.name} (amp {proportion:g})"
    info.description = (f"{info.description}; re-costed as if compiled at availableMemoryProportion {proportion:g} "
                        f"(examples/make_variants.py: matmul temporaries x {proportion / base:.3g}, their cycles x "
                        f"{math.sqrt(base / proportion):.3g})")
    info.synthetic = True
    return profile


def write_variants(proportions, source: str | Path = ROOT / "profiles" / "bert-base.stagesplit",
                   folder: str | Path = ".") -> list[Path]:
    """Write ``<stem>-amp<p>.stagesplit`` in ``folder`` for each proportion, and the variants
    file ``<stem>-variants.yaml`` that lists them; the paths written."""
    from stagesplit.io import load_profile, save_profile
    out = []
    stem = Path(source).stem
    lines = ["# profile variants of one model: stagesplit solve this-file.yaml --devices N", "variants:"]
    for p in proportions:
        path = Path(folder) / f"{stem}-amp{p:g}.stagesplit"
        save_profile(variant(load_profile(source), p), path)
        out.append(path)
        lines.append(f"  - {{profile: {path.name}, proportion: {p:g}}}")
    listing = Path(folder) / f"{stem}-variants.yaml"
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out + [listing]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("proportions", nargs="+", type=float, metavar="P", help="memory proportions in (0, 1]")
    parser.add_argument("--profile", default=str(ROOT / "profiles" / "bert-base.stagesplit"),
                        help="the synthetic profile to re-cost (default: the shipped BERT-base)")
    parser.add_argument("-o", "--folder", default=".", help="where to write the variants (default: here)")
    args = parser.parse_args(argv)
    for path in write_variants(args.proportions, args.profile, args.folder):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
