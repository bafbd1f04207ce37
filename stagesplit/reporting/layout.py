"""The line ``capture`` prints about a tensor-parallel rank: which plan torch applied, what the
rank holds of the attention heads, and what it communicates in one step.

Every figure comes from the profile's ``info.parallel_layout`` (what the capture recorded), so
the line says only what was measured under fake tensors."""

from __future__ import annotations

from collections import Counter

from ..io.profile import ParallelLayout, loss_parallel_of

__all__ = ["context_parallel_line", "expert_parallel_line", "tensor_parallel_line"]


def _bytes_text(nbytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:,.1f} {unit}"
    return f"{nbytes:,} bytes"


def tensor_parallel_line(layout: ParallelLayout) -> str:
    """``rank 0 of 2 tensor-parallel ranks, sequence parallel, the loss on logits split over the vocabulary
    (loss_parallel); plan: ...; 7 modules split; per rank 2
    attention heads and 1 KV head; 17 collectives per step (16 all_reduce, 1 all_gather_into_tensor),
    80.0 KiB``."""
    sp = ", sequence parallel" if layout.sequence_parallel else ""
    if loss_parallel_of(layout.styles):
        sp += ", the loss on logits split over the vocabulary (loss_parallel)"
    text = (f"rank 0 of {layout.tensor_parallel} tensor-parallel ranks{sp}; plan: {layout.plan}, "
            f"{len(layout.styles)} module{'s' if len(layout.styles) != 1 else ''} planned")
    heads = sorted({(h, kv) for _, h, kv in layout.heads})
    if heads:
        text += "; per rank " + ", ".join(f"{h} attention head{'s' if h != 1 else ''} and {kv} KV head"
                                          f"{'s' if kv != 1 else ''}" for h, kv in heads)
    return text + _collectives_text([c for c in layout.collectives if c.group == "tp"])


def _collectives_text(collectives) -> str:
    kinds = Counter(c.kind for c in collectives)
    total = sum(c.bytes for c in collectives)
    count = len(collectives)
    text = f"; {count} collective{'s' if count != 1 else ''} per step"
    if kinds:
        text += " (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + f"), {_bytes_text(total)}"
    return text


def context_parallel_line(layout: ParallelLayout) -> str:
    """``rank 0 of 2 context-parallel ranks, the sequence in head and tail chunks; ring attention:
    6 collectives per step (2 all_gather_into_tensor, 4 all_to_all_single), 48.0 KiB``."""
    chunks = "in head and tail chunks" if layout.cp_load_balanced else "in contiguous shards"
    return (f"rank 0 of {layout.context_parallel} context-parallel ranks, the sequence {chunks}; ring attention"
            + _collectives_text([c for c in layout.collectives if c.group == "cp"]).replace("; ", ": ", 1))


def expert_parallel_line(layout: ParallelLayout) -> str:
    """``rank 0 of 2 expert-parallel ranks: 2 of 4 experts in each of 2 experts modules; 8 all-to-alls per
    step, 128.0 KiB (composed from rules)``."""
    counts = sorted({e for _, e in layout.experts})
    per = "/".join(str(e // layout.expert_parallel) for e in counts)
    modules = len(layout.experts)
    exchanges = [c for c in layout.collectives if c.group == "ep"]
    return (f"rank 0 of {layout.expert_parallel} expert-parallel ranks: {per} of {'/'.join(map(str, counts))} "
            f"experts in each of {modules} experts module{'s' if modules != 1 else ''}; {len(exchanges)} "
            f"all-to-all{'s' if len(exchanges) != 1 else ''} per step, {_bytes_text(sum(c.bytes for c in exchanges))} "
            "(composed from rules)")
