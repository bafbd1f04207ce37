"""One expert-parallel rank of a mixture-of-experts training step, composed from rules on the capture.

torch ships no expert parallelism of its own (torchtitan's ``ExpertParallel`` style runs on
torchtitan's grouped-experts modules only, and transformers' on its distributed runtime), so a capture
at expert-parallel degree N records the step on one device under fake tensors, as a plain capture
does, and then turns it into rank 0's by these rules (docs/layouts.md):

- **Experts split N ways.** Every module whose path has a component ``experts`` (transformers'
  ``MixtralExperts``, ``Qwen2MoeExperts``...: the routed experts; a ``shared_expert`` is not one) holds
  ``E`` experts (its ``num_experts``, else its config's ``num_local_experts``/``num_experts``, else
  its length as a module list); a rank holds ``E / N`` of them, so its parameters, their gradients
  and their optimizer state are ``ceil(bytes / N)`` (the optimizer's step counters stay whole). A
  degree that does not divide ``E`` is refused in one line naming the module and the count.
- **Tokens exchanged twice each way.** The router sends each of the rank's ``T`` tokens to its
  ``k`` experts (``num_experts_per_tok``/``top_k``): the dispatch all-to-all moves ``T x k x hidden``
  elements, the combine all-to-all brings as many back; the backward mirrors both. Each exchange's
  receive buffer (``T x k x hidden`` in the activations' dtype) is allocated beside its send buffer:
  the dispatch's at the experts' first forward operation, the combine's at their last, and the two
  gradient exchanges at the experts' first and last backward operations. The four all-to-alls are
  recorded as collectives of the ``ep`` group.
- **Balanced routing.** With tokens spread evenly the rank's experts receive ``T x k`` token slots in
  all, as the whole set of experts does on one device: the experts' activations and FLOPs are the
  one-device capture's. Uneven routing (a rank receiving more) is not modelled.

Megatron's and torchtitan's convention is followed for the layout: expert-parallel ranks are taken from
the data-parallel (and context-parallel) ranks, not multiplied into the world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import OptionError
from .tensorparallel import configured_count

__all__ = ["ExpertParallel", "apply_expert_parallel", "describe", "exchange_shape", "expert_modules"]


@dataclass(frozen=True)
class ExpertParallel:
    """An expert-parallel capture's facts: the degree, each experts module with its expert count,
    and the exchange's shape (tokens per rank, top-k, hidden size, bytes per element)."""

    degree: int
    experts: tuple[tuple[str, int], ...]
    tokens: int = 0
    top_k: int = 0
    hidden: int = 0
    itemsize: int = 0

    @property
    def exchange_bytes(self) -> int:
        """One all-to-all's buffer: ``tokens x top_k x hidden`` elements."""
        return self.tokens * self.top_k * self.hidden * self.itemsize


def expert_modules(torch, model, degree: int) -> tuple[tuple[str, int], ...]:
    """(module path, experts) of every routed-experts module, each count checked against ``degree``."""
    found = []
    config = getattr(model, "config", None)
    for path, module in model.named_modules():
        if path.rpartition(".")[2] != "experts" or not any(True for _ in module.parameters()):
            continue
        count = configured_count(module, ("num_experts", "num_local_experts"))
        if count is None and isinstance(module, torch.nn.ModuleList):
            count = len(module)
        if count is None and config is not None:
            count = configured_count(config, ("num_local_experts", "num_experts"))
        if count is None:
            raise OptionError("ep", f"{path}: cannot tell how many experts it holds (no num_experts)")
        if count % degree:
            raise OptionError("ep", f"{path} has {count} experts, not divisible by {degree} expert-parallel ranks")
        found.append((path, count))
    if not found:
        raise OptionError("ep", f"{type(model).__name__} has no mixture-of-experts module (a module named experts "
                          "holding parameters); expert parallelism applies to mixture-of-experts models")
    return tuple(found)


def exchange_shape(torch, model, inputs, dtype) -> tuple[int, int, int, int]:
    """(tokens, top-k, hidden size, bytes per element) of the router's exchange: the tokens are
    the inputs' first two dimensions (batch x sequence), the rest from the model's config."""
    config = getattr(model, "config", None)
    top_k = configured_count(config, ("num_experts_per_tok", "top_k", "moe_topk")) if config is not None else None
    hidden = configured_count(config, ("hidden_size", "d_model", "n_embd")) if config is not None else None
    if top_k is None or hidden is None:
        raise OptionError("ep", f"{type(model).__name__}'s config says no num_experts_per_tok and hidden_size: the "
                          "exchange's size is not known")
    tensors = list(inputs.values()) if isinstance(inputs, dict) else list(inputs) if isinstance(
        inputs, (tuple, list)) else [inputs]
    first = next((t for t in tensors if isinstance(t, torch.Tensor) and t.dim() >= 2), None)
    if first is None:
        raise OptionError("ep", "the inputs have no batch x sequence tensor to count the tokens of")
    return int(first.shape[0]) * int(first.shape[1]), top_k, hidden, torch.empty((), dtype=dtype).element_size()


def apply_expert_parallel(rec, ep: ExpertParallel, storage_type, collective_type) -> None:
    """Turn the recorder's one-device record into rank 0's (module docstring): the experts'
    always-live storages divided, the exchanges' receive buffers and all-to-alls added."""
    prefixes = tuple(path + "." for path, _ in ep.experts)
    for st in rec.storages:
        if st.kind in ("param", "grad", "state") and st.name.startswith(prefixes) and not st.name.endswith(".step"):
            st.nbytes = math.ceil(st.nbytes / ep.degree)
    nbytes = ep.exchange_bytes
    for path, _ in ep.experts:
        inside = [i for i, op in enumerate(rec.ops) if op.label is not None
                  and (op.label == path or op.label.startswith(path + "."))]
        for phase, what in (("forward", "dispatch"), ("backward", "gradient")):
            steps = [i for i in inside if rec.ops[i].phase == phase]
            if not steps:
                continue
            for at, name in ((steps[0], f"{what} receive"), (steps[-1], f"{what} return")):
                where = path if phase == "forward" else f"{path}/backward"
                index = len(rec.storages)
                rec.storages.append(storage_type(nbytes, at, "activation", where,
                                                 f"{where}/all_to_all_single:{name.replace(' ', '_')}", at + 1))
                rec.ops[at].storages.append(index)
                rec.collectives.append(collective_type(at, "all_to_all_single", nbytes, ep.degree, phase, "ep"))
    rec.collectives.sort(key=lambda c: c.op)


def describe(ep: ExpertParallel) -> str:
    """The profile description's words for the rank."""
    counts = sorted({e for _, e in ep.experts})
    return (f"rank 0 of {ep.degree} expert-parallel ranks ({'/'.join(map(str, counts))} experts per module, "
            f"{'/'.join(str(e // ep.degree) for e in counts)} per rank; composed from rules: docs/layouts.md)")

