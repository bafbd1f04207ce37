"""Real data-parallel training steps for tests: a model runs on P processes (gloo on CPU, one per
rank) under torch's DDP or FSDP2 (``fully_shard``, one group per layer of a stagesplit profile,
the root last), with Adam, and each rank reports what torch's own memory trackers measured.

Per rank: the peak of live tensor bytes over one steady-state training step (forward, backward,
optimizer step) counted by torch's ``FSDPMemTracker`` for FSDP2 (by category: sharded and
unsharded parameters, gradients, all-gather and reduce-scatter buffers, optimizer state,
activations, temporaries) and by ``MemTracker`` for DDP, and the loss. The measured step comes
after an untracked warm-up step (the optimizer makes its state) and ``zero_grad(set_to_none=False)``,
so gradients exist when the step starts, as stagesplit's capture assumes (gradient accumulation).
The learning rate is 0, so every rank computes what the unparallelised model computes.

``run_fake_process_group`` measures rank 0 the same way on this process alone, under torch's fake
process group (FSDP2 only: DDP's reducer does not run under it).

Nothing here comes from stagesplit except the FSDP groups: each profile layer's module path
(``groups``), the other parameters left to the root, as the layout rules
(stagesplit/model/datasharding.py) say.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from vision import torchvision_model_code

# a spawned worker has the test process's path (with torchvision's folder) but not its modules
torchvision_model_code()

__all__ = ["DataParallelCase", "run_data_parallel", "run_fake_process_group", "single_process_loss", "sum_loss", "tiny_gpt", "tiny_llama"]


@dataclass(frozen=True)
class DataParallelCase:
    """``build()`` returns ``(model, inputs, loss_fn)`` on the CPU, the same on every call (seeded);
    ``mode`` is "ddp" or "fsdp"; ``groups`` the module path of each FSDP group (one per layer of the
    profile, in order); the rest of the parameters go to the root group."""

    build: Callable
    mode: str
    reshard_after_forward: bool = True
    groups: Sequence[str] = field(default_factory=tuple)
    #: FSDP2's mixed precision (bfloat16 parameters for compute, float32 shards and reductions)
    mixed_precision: bool = False


def _run(rank: int, devices: int, case: DataParallelCase, workdir: Path) -> None:
    (workdir / f"rank{rank}.json").write_text(json.dumps(_measure(devices, case)))


def _measure(devices: int, case: DataParallelCase) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model, inputs, loss_fn = case.build()
    if case.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (devices,))
        policy = {}
        if case.mixed_precision:
            from torch.distributed.fsdp import MixedPrecisionPolicy
            policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
        for path in case.groups:
            fully_shard(model.get_submodule(path), mesh=mesh, reshard_after_forward=case.reshard_after_forward,
                        **policy)
        wrapped = fully_shard(model, mesh=mesh, **policy)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=0.0)

    def step() -> float:
        loss = loss_fn(wrapped(inputs))
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    step()                                              # warm-up: the optimizer makes its state
    optimizer.zero_grad(set_to_none=False)
    dist.barrier()
    if case.mode == "ddp":
        tracker = MemTracker()
        tracker.track_external(wrapped, optimizer, inputs)
    else:
        tracker = FSDPMemTracker(wrapped, optimizer)
        tracker.track_inputs((inputs,))
    with tracker:
        loss = step()
    peak = tracker.get_tracker_snapshot("peak")
    by_device = {str(dev): {str(getattr(k, "value", k)): int(v) for k, v in snap.items()} for dev, snap in peak.items()}
    total = sum(snap.get("Total", 0) for snap in by_device.values())
    return {"peak": total, "categories": by_device, "loss": loss}


def _worker(rank: int, devices: int, case: DataParallelCase, workdir: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=devices,
                            timeout=timedelta(seconds=120))
    try:
        _run(rank, devices, case, Path(workdir))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_data_parallel(case: DataParallelCase, devices: int = 2) -> list[dict]:
    """Each rank's record, in rank order: ``peak`` (bytes), ``categories`` (per device, per
    category, at the peak) and ``loss``."""
    import ranks
    with tempfile.TemporaryDirectory(prefix="dp-harness-") as tmp:
        ranks.start(_worker, (devices, case, tmp), devices)
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(devices)]


def run_fake_process_group(case: DataParallelCase, devices: int = 2) -> dict:
    """Rank 0's record (as ``run_data_parallel``'s) from this process alone, under torch's fake
    process group (``torch.testing._internal.distributed.fake_pg``): its collectives return at
    once without moving data, so every buffer is allocated as on a real rank (the second oracle:
    FSDPMemTracker is meant to run this way). The process group is destroyed afterwards."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=devices)
    try:
        return _measure(devices, case)
    finally:
        dist.destroy_process_group()


def single_process_loss(build: Callable) -> float:
    """The loss of the same model and batch run whole on one process (the reference)."""
    import torch
    torch.manual_seed(0)
    model, inputs, loss_fn = build()
    return float(loss_fn(model(inputs)).detach())


def sum_loss(output):
    """The capture's default loss: the sum of the output (of its logits for a Hugging Face model)."""
    logits = getattr(output, "logits", output)
    return logits.sum()


def tiny_gpt(device: str = "cpu"):
    """examples/gpt.py's GPT, small: vocabulary 256, context 32, width 64, 4 heads, 2 blocks, batch 2."""
    import sys
    root = Path(__file__).resolve().parents[1]
    if str(root / "examples") not in sys.path:
        sys.path.insert(0, str(root / "examples"))
    import gpt
    import torch
    cfg = gpt.GPTConfig(vocab_size=256, context=32, d_model=64, heads=4, layers=2, batch=2)
    torch.manual_seed(0)
    with torch.device(device):
        model = gpt.GPT(cfg)
    return model, gpt.make_inputs(cfg, device), sum_loss


def tiny_llama(device: str = "cpu"):
    """A Hugging Face Llama from a config: hidden 64, 4 heads, 2 layers, vocabulary 256; batch 2 x 32."""
    import torch
    import transformers as tf
    config = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                            num_hidden_layers=2, vocab_size=256, max_position_embeddings=64,
                            tie_word_embeddings=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device(device):
        model = tf.LlamaForCausalLM(config)
    model.train()
    ids = (torch.arange(64, device=device).reshape(2, 32) * 7) % 256
    return model, ids, sum_loss
