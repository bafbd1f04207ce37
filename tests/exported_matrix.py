"""The user's path for Hugging Face decoder families, as one function the tests and
``benchmarks/bench_exported.py`` share: capture each family once (``stagesplit capture``), then
per (family, schedule, P): ``stagesplit solve`` and ``stagesplit export --to torch-pipelining``
(the CLI itself, in-process), and run the exported file's own program on P processes
(``pipeline_harness.run_exported``: gloo, MemTracker per rank). Each row holds every rank's
predicted peak (the plan file's) and measured one, the pipelined losses and gradients against the
unpipelined model's, and the measured step's wall time."""

from __future__ import annotations

import contextlib
import functools
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import decoder_families as families
import pipeline_harness as harness

__all__ = ["CHUNKED", "SCHEDULES", "Row", "run_matrix"]

#: every schedule torch ships, and the chunks per rank each runs with here
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2, "looped-bfs": 2, "zb-h1": 1, "zbv": 2, "dualpipev": 2}
CHUNKED = {k for k, v in SCHEDULES.items() if v > 1}


@dataclass(frozen=True)
class Row:
    family: str
    schedule: str
    devices: int
    micro_batches: int
    split: str
    predicted: tuple[int, ...]     #: per rank, the plan's peak
    measured: tuple[int, ...]      #: per rank, MemTracker's peak of the exported step
    loss: float                    #: the pipelined step's mean micro-batch loss
    reference_loss: float          #: the unpipelined model's on the same batch
    gradient_error: float          #: the largest |pipelined - unpipelined| over every gradient, relative
    seconds: float                 #: the measured step's wall time (the slowest rank)

    @property
    def errors(self) -> tuple[float, ...]:
        """Per rank, (predicted - measured) / measured: negative where the plan over-predicts."""
        return tuple((p - m) / m for p, m in zip(self.predicted, self.measured))

    @property
    def worst(self) -> float:
        return max(self.errors, key=abs)


#: a case's precision (its family's name after "+") -> the capture's options
PRECISIONS = {"": [], "master": ["--master-weights"], "amp": ["--amp"]}


def _cli(*args) -> str:
    from stagesplit.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    if code != 0:
        raise RuntimeError(f"stagesplit {' '.join(map(str, args))}: exit {code}: {err.getvalue().strip()}")
    return out.getvalue()


def _micro_batches(schedule: str, devices: int) -> int:
    """Enough micro-batches for every schedule class (DualPipeV needs 2P, 1F1B P)."""
    return 2 * devices


def _reference(family: str, micro_batches: int) -> tuple[float, dict[str, np.ndarray]]:
    import torch
    torch.manual_seed(0)
    model = families.model(family)
    ids, labels = families.batch(family, micro_batches)
    losses = [model(input_ids=i, labels=t).loss for i, t in zip(ids.chunk(micro_batches), labels.chunk(micro_batches))]
    total = sum(losses) / micro_batches
    total.backward()
    return float(total.detach()), {n: p.grad.detach().float().numpy().copy() for n, p in model.named_parameters()
                                  if p.grad is not None}


def run_matrix(cases: Sequence[tuple], folder: Path) -> list[Row]:
    """Each (family, schedule, P) or (family, schedule, P, chunks per rank; default: SCHEDULES'): solve,
    export, run the export's program; rows in the same order."""
    plans: dict[tuple, dict] = {}
    exported: dict[int, list[tuple[int, harness.ExportedCase]]] = {}
    for index, (named, schedule, devices, *given) in enumerate(cases):
        # "family+precision": captured in that precision (PRECISIONS), its export run as it sets it
        family, _, precision = named.partition("+")
        profile = folder / f"{named}.stagesplit"
        if not profile.exists():
            dtype = ["--dtype", "bfloat16"] if family in families.MOE_FAMILIES else []
            _cli("capture", families.capture_spec(family), *dtype, *PRECISIONS[precision], "-o", profile)
        m = _micro_batches(schedule, devices)
        v = given[0] if given else SCHEDULES[schedule]
        name = f"{named}-{schedule}-{devices}-{v}"
        plan, code = folder / f"{name}.json", folder / f"{name}.py"
        chunks = ["--chunks-per-rank", v] if schedule in CHUNKED else []
        _cli("solve", profile, "--devices", devices, "--schedule", schedule, "--micro-batches", m, *chunks,
             "--out", plan)
        _cli("export", plan, "--to", "torch-pipelining", "-o", code)
        plans[index] = json.loads(plan.read_text())
        exported.setdefault(devices, []).append((index, harness.ExportedCase(
            code.read_text(), functools.partial(families.model, family), functools.partial(families.batch, family, m))))
    results: dict[int, list[harness.RankResult]] = {}
    for devices, group in exported.items():
        for (index, _), ranks in zip(group, harness.run_exported([case for _, case in group], devices)):
            results[index] = ranks
    rows = []
    for index, (named, schedule, devices, *_) in enumerate(cases):
        family = named.partition("+")[0]
        plan, ranks = plans[index], results[index]
        m = plan["schedule"]["micro_batches"]
        reference_loss, reference_grads = _reference(family, m)
        losses = [v for r in ranks for v in r.losses]
        error = 0.0
        for r in ranks:
            for name, grad in r.grads.items():
                want = reference_grads[name]
                error = max(error, float(np.abs(grad - want).max() / max(np.abs(want).max(), 1e-12)))
        rows.append(Row(named, schedule, devices, m, plan["split"],
                        tuple(int(r["peak_bytes"]) for r in plan["schedule"]["ranks"]),
                        tuple(r.peak_bytes for r in ranks), float(np.mean(losses)), reference_loss, error,
                        max(r.seconds for r in ranks)))
    return rows
