"""Low-precision parameters with float32 master weights: the precision large models train in.

Megatron (``--bf16``), DeepSpeed (``bf16.enabled``) and FSDP2 with
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` run the forward and the
backward on bfloat16 (or float16) parameters, with no autocast: nothing casts a weight per
micro-batch, so no low-precision copy of a weight is saved for the backward. The gradients are
accumulated in float32 (Megatron's ``main_grad`` buffer: each low-precision gradient autograd writes
is added into it and freed at once), and the optimizer updates float32 master copies of the
parameters, which are copied back into the low-precision ones after its step.

A capture with ``master_weights`` records that step: per parameter a float32 gradient (the
profile's gradient, always live), a float32 master copy (optimizer state, as Megatron's
distributed optimizer and DeepSpeed's ZeRO shard it), the optimizer's state for the master, and the
copy back. Per parameter that is ``2 + 4 + 4 + 8`` bytes with Adam in bfloat16, against ``4 + 4 +
8`` with float32 parameters under autocast; the difference that matters is in the activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MasterWeights", "attach", "owners", "register", "step"]


@dataclass
class MasterWeights:
    """Per parameter (by ``id``): its float32 gradient and its float32 master copy."""

    gradients: dict[int, Any]
    masters: dict[int, Any]


def attach(torch, params: dict[int, Any], shaped: dict[int, Any]) -> tuple[MasterWeights, list]:
    """Make each trainable parameter's float32 gradient (shaped as ``shaped`` says its gradient is,
    where it says) and master copy, and hook its gradient's accumulation: the low-precision gradient
    autograd writes is added into the float32 one and dropped, as Megatron's ``main_grad`` hook
    does. Returns the tensors and the hooks' handles."""
    gradients: dict[int, Any] = {}
    masters: dict[int, Any] = {}
    handles = []
    for key, p in params.items():
        if not p.requires_grad:
            continue
        main = gradients[key] = torch.zeros_like(shaped.get(key, p), dtype=torch.float32)
        masters[key] = p.detach().to(torch.float32, copy=True)

        def accumulate(param, main=main):
            if param.grad is not None:
                main.add_(param.grad)
                param.grad = None

        handles.append(p.register_post_accumulate_grad_hook(accumulate))
    return MasterWeights(gradients, masters), handles


def register(rec, params: dict[int, Any], weights: MasterWeights) -> None:
    """The float32 gradients as their parameters' gradients, the masters as their optimizer state
    (both live from step 0; ``register_model`` has registered the parameters)."""
    for key in params:
        idx = rec.param_storage.get(key)
        if idx is None or key not in weights.masters:
            continue
        module = rec.param_module.get(key)
        name = rec.storages[idx].name.split(" [")[0]
        for kind, tensor, suffix in (("grad", weights.gradients[key], ".grad"),
                                     ("state", weights.masters[key], ".master")):
            sidx = rec.tensor(tensor, kind, module, name + suffix)
            if sidx is not None:
                rec.param_of_record[sidx] = idx


def step(torch, opt, params: dict[int, Any], weights: MasterWeights) -> None:
    """The optimizer's step on the masters, then each master copied back into its parameter."""
    opt.step()
    with torch.no_grad():
        for key, p in params.items():
            if key in weights.masters:
                p.copy_(weights.masters[key])


def owners(weights: MasterWeights) -> dict[int, int]:
    """Each master's parameter (by ``id``): the optimizer's state of a master is its parameter's."""
    return {id(m): key for key, m in weights.masters.items()}
