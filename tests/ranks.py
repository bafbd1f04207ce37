"""Starting a test's ranks (the harnesses' gloo processes): torch.multiprocessing on the
``forkserver`` start method, the server importing torch, its distributed packages and transformers
once per pytest worker, so that each rank is forked with them already imported. Under ``spawn``
every rank imported them again, about 2 to 4 CPU-s each (a Llama block's module alone 2 s), the
largest part of the multi-process tests' time on 2 cores. A rank is still a process of its own with
its own process group, as a user's ranks are; what it runs is unchanged.

Each rank still gets the test process's ``sys.path`` and working folder at its start (multiprocessing
sends them with every process); the environment is the server's, which is the test process's when
the server started (tests/steptime_harness.py, whose ranks need an environment of their own, spawns)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["PRELOAD", "start"]

#: imported by the server before it forks a rank (a module that cannot be imported is passed over);
#: pipeline_harness first: it makes ``import torchvision`` safe (tests/vision.py) before transformers
PRELOAD = ("pipeline_harness", "torch.distributed", "torch.distributed.pipelining", "torch.distributed.tensor",
           "torch.distributed.fsdp", "torch.distributed._tools.mem_tracker", "transformers",
           "transformers.modeling_utils", "transformers.models.llama.modeling_llama")


def start(worker: Callable, args: tuple, nprocs: int, join: bool = True):
    """``torch.multiprocessing.spawn(worker, args, nprocs, join)`` with the ranks forked by the server."""
    import multiprocessing

    import torch.multiprocessing as mp
    multiprocessing.set_forkserver_preload(list(PRELOAD))     # read when the server starts (once)
    return mp.start_processes(worker, args=args, nprocs=nprocs, join=join, start_method="forkserver")
