"""What the user would do otherwise: each training framework's default split, as its own code
computes it, so that a solve's ``compare`` can price it under the same cost model as the optimal
plan.

The rules (each tested against the framework's own code where it installs:
tests/plan/test_baselines.py):

- **Megatron's even layout** (megatron-core ``get_num_layers_to_build`` without the uneven or
  layout options): the decoder layers divided evenly over the pipeline ranks, the embedding on
  the first rank and the head and loss on the last; megatron-core refuses a decoder layer count
  not divisible by the number of ranks.
- **DeepSpeed** ``PipelineModule(partition_method=...)``: ``"uniform"`` is
  ``ds_utils.partition_uniform`` over every layer spec (embedding and head included);
  ``"parameters"`` (DeepSpeed's default) is ``ds_utils.partition_balanced`` of each layer's
  trainable parameter count: the linear-partition DP that minimises the spread (largest stage
  minus smallest) of the per-stage sums.
- **torchtitan's default split** (``_generate_llm_fqn_per_model_part`` with its default
  ``pipeline_parallel_first_stage_less_layers = 1`` and ``..._last_stage_less_layers = 1``): the
  embedding and the norm+head each weigh one layer, ``blocks + 2`` weights are divided evenly,
  the first stages taking the remainder.
- **torch pipelining's equal split** (the ``split_spec`` of torch's pipelining examples:
  ``{f"layers.{i * (n // stages)}": SplitPoint.BEGINNING for i in range(1, stages)}``): split
  points every ``n // stages`` decoder layers, the last stage taking the remainder.

A profile's layers map onto a framework's as the exporters map them: the first layer is the
embedding and the last the head when their names match the plan's first-/last-layer regexes
(``embed_tokens``, ``lm_head``); otherwise every layer is a decoder layer (a captured model's
embedding and head are folded into its first and last blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["Baseline", "LABELS", "deepspeed_parameters", "deepspeed_uniform", "framework_baselines",
           "layer_roles", "megatron_even", "torch_pipelining_equal", "torchtitan_default"]

#: each baseline's key (a plan's ``method``) -> how a sentence names it
LABELS = {
    "megatron-even": "Megatron's even layout",
    "deepspeed-parameters": 'DeepSpeed partition_method="parameters"',
    "deepspeed-uniform": 'DeepSpeed partition_method="uniform"',
    "torchtitan-default": "torchtitan's default split",
    "torch-pipelining-equal": "torch pipelining's equal split",
    "uniform": "an even split of the layers",
}


@dataclass(frozen=True)
class Baseline:
    """A framework's split of the profile's layers over ``devices`` stages: ``bounds`` (the
    first layer of each stage, then the layer count) or, where the framework refuses this model,
    ``reason``."""

    key: str
    bounds: tuple[int, ...] | None
    reason: str = ""

    @property
    def label(self) -> str:
        return LABELS.get(self.key, self.key)


# -- the frameworks' rules, in their own terms ----------------------------------------------------

def megatron_even(decoder_layers: int, stages: int) -> list[int] | str:
    """Decoder layers per pipeline rank, or why megatron-core refuses the count."""
    if decoder_layers % stages:
        return (f"megatron-core needs the decoder layer count divisible by the pipeline size "
                f"({decoder_layers} layers on {stages} ranks); its uneven options are a different layout")
    return [decoder_layers // stages] * stages


def deepspeed_uniform(num_items: int, num_parts: int) -> list[int]:
    """Stage boundaries (``num_parts + 1`` of them) as ``partition_uniform`` returns them: equal
    counts, the first ``num_items % num_parts`` stages one larger; with fewer items than parts,
    one item per stage and the rest empty."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


def deepspeed_parameters(weights: Sequence[float] | np.ndarray, num_parts: int) -> list[int]:
    """Stage boundaries as ``partition_balanced`` returns them: the contiguous split into
    ``num_parts`` non-empty parts whose largest minus smallest part sum is least (among equals,
    each boundary as late as possible, as DeepSpeed's ``>=`` keeps the last candidate); with no
    more weights than parts, the uniform boundaries."""
    n, m = len(weights), num_parts
    if n <= m:
        return deepspeed_uniform(n, m)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=np.float64))])
    inf = np.inf
    high = np.full((n + 1, m + 1), inf)       # largest part sum of the best split of the first i into j
    low = np.full((n + 1, m + 1), inf)        # its smallest part sum
    cost = np.full((n + 1, m + 1), inf)
    cut = np.zeros((n + 1, m + 1), np.int64)
    high[0, 0], cost[0, 0] = 0.0, 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            k = np.arange(i)
            part = prefix[i] - prefix[k]
            hi = np.maximum(high[k, j - 1], part)
            lo = np.minimum(low[k, j - 1], part)
            with np.errstate(invalid="ignore"):
                spread = hi - lo
            spread = np.where(np.isnan(spread), inf, spread)
            best = spread.min()
            last = int(np.flatnonzero(spread == best)[-1]) if np.isfinite(best) else i - 1
            cost[i, j], high[i, j], low[i, j], cut[i, j] = spread[last], hi[last], lo[last], last
    bounds = [n]
    for j in range(m, 0, -1):
        bounds.append(int(cut[bounds[-1], j]))
    return bounds[::-1]


def torchtitan_default(decoder_layers: int, stages: int, input_weight: int = 1,
                       output_weight: int = 1) -> list[int] | str:
    """Decoder layers per stage as torchtitan's default split gives them, or why it refuses."""
    if stages == 1:
        return [decoder_layers]
    effective = decoder_layers + input_weight + output_weight
    if stages > effective:
        return f"torchtitan refuses more stages ({stages}) than weighted layers ({effective})"
    per_stage, extra = divmod(effective, stages)
    if input_weight > per_stage or output_weight > per_stage:
        return (f"torchtitan refuses first/last-stage weights ({input_weight}, {output_weight}) above the layers "
                f"per stage ({per_stage})")
    counts, left = [], decoder_layers
    for s in range(stages):
        share = per_stage + (1 if s < extra else 0)
        share -= input_weight if s == 0 else output_weight if s == stages - 1 else 0
        take = max(0, min(share, left))
        counts.append(take)
        left -= take
    return counts


def torch_pipelining_equal(decoder_layers: int, stages: int) -> list[int] | str:
    """Decoder layers per stage with a split point every ``decoder_layers // stages`` layers."""
    step = decoder_layers // stages
    if step == 0:
        return f"fewer decoder layers ({decoder_layers}) than stages ({stages})"
    return [step] * (stages - 1) + [decoder_layers - step * (stages - 1)]


# -- on a profile ---------------------------------------------------------------------------------

class _Pattern(Protocol):
    """A compiled regex (re's or RE2's)."""

    def search(self, text: str) -> object: ...


def layer_roles(names: Sequence[str], first_regex: _Pattern, last_regex: _Pattern) -> tuple[bool, bool]:
    """Whether the first layer is the embedding and the last the head (compiled regexes with
    ``search``), as the exporters decide it."""
    if len(names) < 2:
        return False, False
    return bool(first_regex.search(names[0])), bool(last_regex.search(names[-1]))


def _from_counts(key: str, counts: list[int] | str, embedding: bool, head: bool, num_layers: int) -> Baseline:
    if isinstance(counts, str):
        return Baseline(key, None, counts)
    counts = list(counts)
    counts[0] += int(embedding)
    counts[-1] += int(head)
    bounds = tuple(int(x) for x in np.concatenate([[0], np.cumsum(counts)]))
    assert bounds[-1] == num_layers, (key, counts, num_layers)
    return Baseline(key, bounds)


def framework_baselines(num_layers: int, devices: int, parameter_bytes: Sequence[float] | np.ndarray, embedding: bool,
                        head: bool) -> list[Baseline]:
    """The GPU frameworks' default splits of ``num_layers`` layers over ``devices`` stages.
    ``parameter_bytes``: each layer's own parameter memory (DeepSpeed balances parameter counts;
    bytes are proportional to them where every parameter has the same dtype and optimizer)."""
    decoders = num_layers - int(embedding) - int(head)
    out = []
    if decoders < 1:
        reason = "the profile has no decoder layers between its embedding and head"
        return [Baseline(key, None, reason) for key in ("megatron-even", "deepspeed-parameters", "deepspeed-uniform",
                                                          "torchtitan-default", "torch-pipelining-equal")]
    out.append(_from_counts("megatron-even", megatron_even(decoders, devices), embedding, head, num_layers))
    out.append(Baseline("deepspeed-parameters", tuple(deepspeed_parameters(parameter_bytes, devices))))
    out.append(Baseline("deepspeed-uniform", tuple(deepspeed_uniform(num_layers, devices))))
    out.append(_from_counts("torchtitan-default", torchtitan_default(decoders, devices), embedding, head, num_layers))
    out.append(_from_counts("torch-pipelining-equal", torch_pipelining_equal(decoders, devices), embedding, head,
                            num_layers))
    return out
