"""One context-parallel rank of a training step: the sequence sharded, attention as torch's ring.

A capture at context-parallel degree N runs the step as rank 0 of N under fake tensors and torch's
fake process group, as a tensor-parallel capture does (``tensorparallel``). What runs is torch's own
context parallelism (``torch.distributed.tensor.experimental``, the code behind ``context_parallel``
and torchtitan's ``context_parallel_degree``):

- the inputs' sequence dimension is sharded by torch's ``_context_parallel_buffers`` (every input
  tensor of two or more dimensions whose dimension 1 is the sequence: token ids, labels, position
  ids), with torch's default load balancing: its head-tail balancer where ``2 N`` divides the
  sequence (each rank a chunk from the head and one from the tail, so causal attention's work is
  even), else plain contiguous shards;
- scaled dot-product attention runs as torch's ring attention: query, key and value become
  DTensors sharded on the sequence (``Shard(2)``, as torch's ``sdpa_input_fn`` makes them), and the
  attention kernel's DTensor handler (``_enable_cp_dtensor_dispatcher``) runs
  ``_templated_ring_attention`` on the rank's blocks: the key/value exchange (torch's default
  rotation, one all-gather of the blocks; a rank's key/value buffers are the gathered blocks), the
  kernel once per block and the log-sum-exp merge, and in the backward the same with the
  key/value gradients sent back around the ring. The recorder sees each of these as torch
  allocates it, and each collective (kind, bytes, group).

torch's ring has handlers for the CUDA attention kernels only (flash, memory-efficient, cuDNN);
on the CPU, attention runs ``_scaled_dot_product_flash_attention_for_cpu``, for which DTensor has
no sharding rule (``NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu
.default does not have a sharding strategy registered.``). So a context-parallel capture runs
attention as the target GPU's kernel (``kernels``: the capture's ``kernels="cuda"``), through
torch's fake kernels; where that is the math kernel (an explicit mask, a head dimension the fused
kernels refuse) the capture is refused: torch's ring has no math path.

Before anything runs the degree is checked against the sequence: a degree that does not divide
it is refused in one line naming the input and its length.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError, StagesplitError

__all__ = ["ContextParallel", "check_degree", "fake_meshes", "ring_attention", "ring_inputs", "sequence_length",
           "shard_inputs"]


@dataclass(frozen=True)
class ContextParallel:
    """A context-parallel capture's facts: the degree, the whole sequence, whether torch's
    head-tail load balancing shards it, and the process groups by name (``tp``/``cp``)."""

    degree: int
    sequence: int
    load_balanced: bool
    groups: dict[str, str] = field(default_factory=dict, compare=False)


def _tensors(torch, inputs) -> list[tuple[str, Any]]:
    if isinstance(inputs, dict):
        return [(str(k), v) for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    if isinstance(inputs, (tuple, list)):
        return [(f"input {i}", v) for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
    return [("the input", inputs)] if isinstance(inputs, torch.Tensor) else []


def sequence_length(torch, inputs) -> tuple[str, int]:
    """(the input that says it, the sequence length): dimension 1 of the first input of two or
    more dimensions (the token ids of a language model's batch)."""
    for name, t in _tensors(torch, inputs):
        if t.dim() >= 2:
            return name, int(t.shape[1])
    raise OptionError("cp", "context parallelism shards the sequence (dimension 1 of the inputs); the model's "
                      "inputs have no tensor of two or more dimensions")


def check_degree(torch, inputs, degree: int) -> tuple[int, bool]:
    """(sequence length, load-balanced) for ``degree`` ranks, or a one-line refusal: the degree
    must divide the sequence; torch balances the load (head and tail chunks) where ``2 x degree``
    divides it, as its ``_create_default_load_balancer`` does."""
    if isinstance(degree, bool) or not isinstance(degree, int) or not 1 <= degree <= 4096:
        raise OptionError("cp", f"expected a whole number of ranks in 1..4096, got {degree!r}")
    name, seq = sequence_length(torch, inputs)
    if seq % degree:
        raise OptionError("cp", f"{name} has a sequence of {seq} tokens, not divisible by {degree} context-parallel "
                          "ranks")
    return seq, seq % (2 * degree) == 0


@contextlib.contextmanager
def fake_meshes(torch, tp: int, cp: int) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A fake process group of ``cp x tp`` ranks (this process rank 0) and its (cp, tp) device
    mesh, as torchtitan builds it (tensor parallelism innermost): yields the tensor-parallel
    submesh (None at tp 1), the context-parallel one, and each group's name -> ``tp``/``cp``.
    Torn down afterwards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        raise StagesplitError("a torch.distributed process group is already initialised in this process; a "
                              "context-parallel capture sets up its own fake one")
    hook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp * cp)
    try:
        mesh = init_device_mesh("cpu", (cp, tp), mesh_dim_names=("cp", "tp"))
        groups = {str(mesh["cp"].get_group().group_name): "cp"}
        if tp > 1:
            groups[str(mesh["tp"].get_group().group_name)] = "tp"
        yield (mesh["tp"] if tp > 1 else None), mesh["cp"], groups
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def shard_inputs(torch, inputs, mesh, sequence: int, load_balanced: bool):
    """The rank's inputs: each tensor of two or more dimensions whose dimension 1 is the sequence
    replaced by rank 0's shard as torch's ``_context_parallel_buffers`` cuts it (head and tail
    chunks where load-balanced); the others as they are."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _context_parallel_buffers
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer
    named = [(k, t) for k, t in _tensors(torch, inputs) if t.dim() >= 2 and int(t.shape[1]) == sequence]
    balancer = _HeadTailLoadBalancer(sequence, mesh.size(), "cpu") if load_balanced else None
    shards = _context_parallel_buffers(mesh, [t for _, t in named], [1] * len(named), balancer)
    by_id = {id(t): s for (_, t), s in zip(named, shards)}

    def conv(x):
        return by_id.get(id(x), x) if isinstance(x, torch.Tensor) else x
    if isinstance(inputs, dict):
        return {k: conv(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return tuple(conv(v) for v in inputs)
    return conv(inputs)


@contextlib.contextmanager
def ring_attention(load_balanced: bool) -> Iterator[None]:
    """While open, the attention kernels' DTensor handlers are torch's ring attention (its
    ``_enable_cp_dtensor_dispatcher``), with torch's load-balancing option set as the sharding
    was made; both put back afterwards."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    was = cp._cp_options.enable_load_balance
    cp._cp_options.enable_load_balance = load_balanced
    cp._enable_cp_dtensor_dispatcher()
    try:
        yield
    finally:
        cp._disable_cp_dtensor_dispatcher()
        cp._cp_options.enable_load_balance = was


def ring_inputs(torch, mesh, tensors):
    """Query, key and value as torch's ``sdpa_input_fn`` hands them to the ring: DTensors of the
    rank's local blocks, sharded on the sequence (dimension 2)."""
    from torch.distributed.tensor import DTensor, Shard
    return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in tensors)
