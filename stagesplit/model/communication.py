"""The time of one rank's collectives on a node's links, and how much of it the step waits for.

A ring collective of ``n`` ranks over a buffer of ``B`` bytes (the whole buffer: an all-gather's
output, a reduction's input) on a link of bandwidth ``bw`` (one direction) and per-step latency
``a`` takes (the standard ring algorithm, as NCCL runs it):

* all-reduce: ``2 (n - 1) a + 2 B (n - 1) / n / bw`` (a reduce-scatter then an all-gather);
* reduce-scatter, all-gather: ``(n - 1) a + B (n - 1) / n / bw``;
* point-to-point: ``a + B / bw``; one rank (``n = 1``): nothing.

What is overlapped (docs/layouts.md, "The layout search"):

* DDP (ZeRO 0): gradients are all-reduced bucket by bucket (25 MiB) while the backward goes on;
  the step waits for the last bucket (what is left after a first bucket of 1 MiB and buckets of
  25 MiB: ``last_bucket``) and for whatever the backward of the stage's last
  micro-batch did not hide: ``max(T(last bucket), T(all) - backward)``.
* ZeRO 1 and 2: the same with a reduce-scatter, then the updated parameters are all-gathered
  after the optimizer step, not overlapped.
* ZeRO 3 (FSDP2): per micro-batch, each layer's all-gather is prefetched under the previous
  layer's compute; the first is not hidden: ``T(first group) + max(0, T(the others) - compute)``
  in the forward (the first layer's group first), and again in the backward (the last layer's
  group first) when parameters are resharded after the forward; the gradients' reduce-scatter
  once, after the last micro-batch, overlapped as DDP's (the first layer's group reduced last).
* DDP's bucket copies: with ``gradient_as_bucket_view`` off (torch's default), each gradient is
  copied into its bucket as it is ready and back after the bucket's all-reduce, on the compute's
  own stream: ``4 B / memory bandwidth`` (two reads and two writes of the gradients) added to the
  last micro-batch's step, never hidden.
* Tensor-parallel collectives sit on the critical path of every layer (not overlapped).
* On a node whose collectives take the compute's own cores (``overlaps_compute: false``: a CPU
  rank on one core, gloo's threads on it) nothing above is hidden: every collective is added whole.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DDP_BUCKET_BYTES", "DDP_FIRST_BUCKET_BYTES", "DpExposed", "last_bucket", "all_gather", "all_reduce", "dp_exposed", "p2p", "reduce_scatter", "ring_time"]

#: DDP's default bucket (``bucket_cap_mb=25``, torch/nn/parallel/distributed.py)
DDP_BUCKET_BYTES = 25 * 1024 * 1024
#: DDP's first bucket (``_DEFAULT_FIRST_BUCKET_BYTES``: the gradients ready first, the last layers')
DDP_FIRST_BUCKET_BYTES = 1024 * 1024


def last_bucket(total: float) -> float:
    """The bytes of DDP's last bucket (the first layers' gradients, ready last): the first bucket
    takes 1 MiB, each other 25 MiB, the last what is left (tensors are not split across buckets
    in torch; here bytes are, a close approximation for layers of many tensors)."""
    if total <= DDP_FIRST_BUCKET_BYTES:
        return total
    rest = (total - DDP_FIRST_BUCKET_BYTES) % DDP_BUCKET_BYTES
    return rest if rest > 0 else float(DDP_BUCKET_BYTES)


def ring_time(kind: str, nbytes: float, ranks: int, bytes_per_s: float, latency_s: float) -> float:
    """Seconds of one ring collective of ``kind`` (all_reduce, reduce_scatter, all_gather,
    all_to_all, broadcast) over ``nbytes`` among ``ranks`` ranks (module docstring)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    share = nbytes * (ranks - 1) / ranks / bytes_per_s
    steps = ranks - 1
    if kind.startswith("all_reduce"):
        return 2 * steps * latency_s + 2 * share
    return steps * latency_s + share


def all_reduce(nbytes: float, ranks: int, bytes_per_s: float, latency_s: float) -> float:
    return ring_time("all_reduce", nbytes, ranks, bytes_per_s, latency_s)


def reduce_scatter(nbytes: float, ranks: int, bytes_per_s: float, latency_s: float) -> float:
    return ring_time("reduce_scatter", nbytes, ranks, bytes_per_s, latency_s)


def all_gather(nbytes: float, ranks: int, bytes_per_s: float, latency_s: float) -> float:
    return ring_time("all_gather", nbytes, ranks, bytes_per_s, latency_s)


def p2p(nbytes: float, bytes_per_s: float, latency_s: float) -> float:
    """One point-to-point send of ``nbytes``."""
    return latency_s + nbytes / bytes_per_s if nbytes > 0 else 0.0


@dataclass(frozen=True)
class DpExposed:
    """What one stage's data-parallel communication adds to the step, and its parts (seconds)."""

    gradients: float        # the gradients' all-reduce or reduce-scatter the backward did not hide
    parameters: float       # ZeRO 1-2: the all-gather after the optimizer step
    gathers: float          # ZeRO 3: the per-micro-batch all-gathers compute did not hide, all micro-batches
    copies: float = 0.0     # DDP: the gradients copied into their buckets and back, on the compute's stream

    @property
    def total(self) -> float:
        return self.gradients + self.parameters + self.gathers + self.copies


def dp_exposed(zero: int, dp: int, layer_params: list[int], forward_s: float, backward_s: float,
               micro_batches: int, bytes_per_s: float, latency_s: float,
               reshard_after_forward: bool = True, *, memory_bytes_per_s: float = 0.0,
               overlaps_compute: bool = True) -> DpExposed:
    """The data-parallel communication one stage (layers with ``layer_params`` bytes of
    parameters each, in forward order) exposes in a step under ZeRO ``zero`` with ``dp`` ranks:
    ``forward_s`` and ``backward_s`` are one micro-batch's compute on the stage (module
    docstring's rules); ``memory_bytes_per_s``, the device's, prices DDP's bucket copies (0: not
    priced); ``overlaps_compute`` false: the node's collectives hide under nothing."""
    if dp <= 1:
        return DpExposed(0.0, 0.0, 0.0)
    total = float(sum(layer_params))
    if not overlaps_compute:
        backward_s = forward_s = 0.0

    def hidden(kind: str, last: float) -> float:
        whole = ring_time(kind, total, dp, bytes_per_s, latency_s)
        return max(ring_time(kind, last, dp, bytes_per_s, latency_s), whole - backward_s)
    last = last_bucket(total)
    if zero == 0:
        copies = 4 * total / memory_bytes_per_s if memory_bytes_per_s > 0 else 0.0
        return DpExposed(hidden("all_reduce", last), 0.0, 0.0, copies)
    if zero in (1, 2):
        return DpExposed(hidden("reduce_scatter", last), all_gather(total, dp, bytes_per_s, latency_s), 0.0)
    nonzero = [p for p in layer_params if p > 0]
    first = float(nonzero[0]) if nonzero else 0.0        # gathered first in the forward, reduced last
    final = float(nonzero[-1]) if nonzero else 0.0       # gathered first in the backward

    def gathers(lead: float, compute: float) -> float:
        """The pass's first all-gather in full, the others as far as compute does not hide them."""
        rest = all_gather(total - lead, dp, bytes_per_s, latency_s) if total > lead else 0.0
        return all_gather(lead, dp, bytes_per_s, latency_s) + max(0.0, rest - compute)
    per_mb = gathers(first, forward_s)
    if reshard_after_forward:
        per_mb += gathers(final, backward_s)
    return DpExposed(hidden("reduce_scatter", first), 0.0, micro_batches * per_mb)
