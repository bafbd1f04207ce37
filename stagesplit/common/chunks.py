"""Bulk passes over the per-program code arrays (tens of millions of entries) go in pieces of
``CHUNK`` entries: temporaries of a few MB are reused by the allocator, while ones of tens of MB
are mapped afresh and faulted in page by page on every pass, which is slow on virtual machines
(measured here: 1.3-2.2 ms per MB; pricing 96 layers took 1.66 s with pieces of 4 M entries,
1.36 s with pieces of 1 M)."""

__all__ = ["CHUNK"]

CHUNK = 1 << 20
