"""Shared helpers of the export tests: hand-made plans, the CLI runner, stand-in modules, and
the multi-process runner for the real framework runs."""

from __future__ import annotations

import os
import socket
import sys
import time
import types
from pathlib import Path

from hypothesis import strategies as st

from helpers import plan_inputs
from stagesplit.cli import main
from stagesplit.model.stagememory import MemoryBreakdown
from stagesplit.plan import Plan, PlanProfile, StagePlan

ROOT = Path(__file__).resolve().parents[2]
#: a small examples/gpt.py: 6 blocks, one micro-batch of 2 (the captured batch)
GPT_CONFIG = dict(vocab_size=64, context=8, d_model=16, heads=2, layers=6, batch=2)
GPT_FACTORY = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from examples.gpt import GPTConfig, build as build_gpt


def build():
    return build_gpt(GPTConfig(**{GPT_CONFIG!r}))
"""
PYTHON_FORMATS = ("poptorch", "popart", "tf-ipu", "optimum-ipu", "torch-pipelining", "deepspeed")
ARGUMENT_FORMATS = ("megatron", "megatron-uneven", "torchtitan")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def make_plan(names, starts, paths=None, devices=None, headroom=0.0, micro_batches=1, schedule="none",
              profile=None) -> Plan:
    """A plan splitting ``names`` into stages beginning at ``starts`` (indices)."""
    bounds = list(starts) + [len(names)]
    devices = devices or list(range(len(starts)))
    stages = [StagePlan(stage=k, device=devices[k], first_layer=a, last_layer=b - 1, layers=list(names[a:b]),
                        in_flight=1, capacity_bytes=1000, worst_tile=0, worst_tile_bytes=100 * (k + 1),
                        memory_at_worst_tile=MemoryBreakdown(), memory_total=MemoryBreakdown(), compute=float(b - a),
                        time_s=None, bytes_received=0, bytes_sent=0)
              for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    profile = profile or {"name": "handmade", "sha256": "ab" * 32, "target": "ipu-mk2"}
    return Plan(profile=PlanProfile(**{"tiles": 1472, **profile}),
                inputs=plan_inputs(max(devices) + 1, headroom=headroom, micro_batches=micro_batches, schedule=schedule),
                layer_names=list(names), devices=max(devices) + 1, method="cp-sat", status="optimal", feasible=True,
                message="", stages=stages, module_paths=list(paths) if paths is not None else [])


def stages_of(plan: Plan) -> list[list[str]]:
    return [list(s.layers) for s in plan.stages]


splits = st.integers(1, 12).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(1, n - 1), max_size=n - 1) if n > 1 else st.just(set())))


def plan_from(n_and_cuts, root="blocks", **kw) -> Plan:
    n, cuts = n_and_cuts
    names = [str(i) for i in range(n)]
    return make_plan(names, [0] + sorted(cuts), paths=[f"{root}.{i}" for i in range(n)], **kw)


def install(monkeypatch, name: str, **attrs) -> types.ModuleType:
    """A stand-in module ``name`` in ``sys.modules`` (undone by ``monkeypatch``)."""
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


class ModuleRef:
    """Stands in for the user's model: records the attribute/index path of every module the
    snippet reads, and every assignment back into the model."""

    def __init__(self, path: str, log: list):
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        return ModuleRef(f"{self._path}.{name}", self._log)

    def __getitem__(self, index):
        return ModuleRef(f"{self._path}.{index}", self._log)

    def __setattr__(self, name, value):
        self._log.append((f"{self._path}.{name}", value))

    def __setitem__(self, index, value):
        self._log.append((f"{self._path}.{index}", value))


# -- real multi-process runs -----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, target, args) -> None:
    """One forked rank: one thread, a gloo process group, then ``target(rank, world, *args)``."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        target(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, target, *args, timeout: float = 240.0) -> None:
    """Run ``target(rank, world, *args)`` in ``world`` forked processes (torch.multiprocessing,
    gloo on CPU); a failure in any rank raises here with its traceback, a hang is killed."""
    import torch.multiprocessing as mp
    context = mp.start_processes(_worker, args=(world, free_port(), target, args), nprocs=world, join=False,
                                 start_method="fork")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{world} ranks of {getattr(target, '__name__', target)} ran past {timeout} s")
