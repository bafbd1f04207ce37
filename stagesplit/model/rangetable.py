"""The priced layer ranges, on the band the search reads.

A stage's memory only grows with its range (more layers bring more items, more columns and more
live bytes), so for each first layer ``a`` the ranges that fit a device of ``capacity`` bytes per
tile are ``a..a+j`` for ``j`` below some bound. The table stores those ranges only: entry
``[a, j]`` of a band is the range ``a..a+j``, for ``j < width``, where ``width`` is the longest
range that fits anywhere (with the fewest micro-batches in flight, the widest band). A range
outside the band does not fit a device of ``capacity`` bytes: it reads as ``OVER``.

Two storages, one meaning (the worst tile's bytes of range ``a..b`` with ``k`` micro-batches in
flight):

* **per in-flight count**: a band per ``k`` (multi-tile profiles, where the worst tile depends on
  ``k``), with the worst tile of each range;
* **linear**: on one tile the bytes are ``once + (k - 1) x stash`` exactly, so two bands serve
  every ``k`` (a 1000-layer, 1F1B table with 128 in-flight counts is two bands, not 128).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["OVER", "RangeTable", "band_width"]

#: the bytes of a range outside the band (or past the last layer): more than any device holds
OVER = np.iinfo(np.int64).max // 4


def band_width(once: np.ndarray, capacity: int | None) -> int:
    """The band width that keeps every range of a (L, W) band of bytes that fits ``capacity``
    (at least 1; all of it for None)."""
    if capacity is None or once.shape[1] == 0:
        return int(max(once.shape[1], 1))
    fits = (once <= capacity).any(axis=0)
    return int(np.flatnonzero(fits)[-1]) + 1 if fits.any() else 1


@dataclass(frozen=True, eq=False)
class RangeTable:
    """Worst-tile bytes of the layer ranges up to ``width`` layers long (see the module
    docstring). ``capacity``: every range that fits a device of this many bytes per tile, with
    any of ``in_flight`` in flight, is in the band (None: every range is)."""

    in_flight: tuple[int, ...]
    capacity: int | None
    #: (K, L, W) bytes per in-flight count, or (1, L, W) ``once`` bytes of the linear form
    bands: np.ndarray
    #: (L, W) stashed bytes of the linear form (one tile); None: a band per in-flight count
    stash: np.ndarray | None = None
    #: (K, L, W) worst tile per in-flight count; None: one tile (tile 0)
    tiles: np.ndarray | None = None
    #: (L + 1,) prefix sums of layer compute (``compute`` gives a range's)
    compute_prefix: np.ndarray | None = None

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def dense(cls, in_flight: Iterable[int], worst_bytes: np.ndarray, worst_tile: np.ndarray | None = None,
              capacity: int | None = None, compute_prefix: np.ndarray | None = None) -> RangeTable:
        """From full (K, L, L) arrays (entry [k, a, b] the range a..b; b < a unused), cut to the band
        of ``capacity``."""
        ks = tuple(int(k) for k in in_flight)
        worst_bytes = np.asarray(worst_bytes, np.int64)
        L = worst_bytes.shape[1]
        a = np.arange(L)[:, None]
        b = a + np.arange(L)[None, :]
        real = b < L
        bands = np.where(real[None], worst_bytes[:, a, np.minimum(b, L - 1)], OVER)
        tiles = None
        if worst_tile is not None:
            tiles = np.where(real[None], np.asarray(worst_tile, np.int64)[:, a, np.minimum(b, L - 1)], 0)
        width = band_width(bands[int(np.argmin(ks))], capacity) if L else 0
        bands = np.ascontiguousarray(bands[:, :, :width])
        tiles = None if tiles is None or not tiles.any() else np.ascontiguousarray(tiles[:, :, :width])
        return cls(ks, capacity, bands, None, tiles, compute_prefix)

    @classmethod
    def linear(cls, in_flight: Iterable[int], once: np.ndarray, stash: np.ndarray, capacity: int | None,
               compute_prefix: np.ndarray | None = None) -> RangeTable:
        """One tile: (L, W) bands of the bytes held once and the bytes stashed per extra
        micro-batch in flight (OVER past the last layer)."""
        return cls(tuple(int(k) for k in in_flight), capacity, once[None], stash, None, compute_prefix)

    # -- shape ----------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return int(self.bands.shape[1])

    @property
    def width(self) -> int:
        """The longest range stored (layers)."""
        return int(self.bands.shape[2])

    @property
    def one_tile(self) -> bool:
        return self.tiles is None

    def supports(self, in_flight: Iterable[int]) -> bool:
        """Whether the table prices every one of these in-flight counts."""
        ks = {int(k) for k in in_flight}
        return all(k >= 1 for k in ks) if self.stash is not None else ks <= set(self.in_flight)

    def covers(self, capacity: int) -> bool:
        """Whether every range that fits ``capacity`` bytes per tile is in the band."""
        return self.capacity is None or self.width >= self.num_layers or int(capacity) <= self.capacity

    def k_index(self, in_flight: int) -> int:
        """Index of an in-flight count in ``in_flight``."""
        return self.in_flight.index(in_flight)

    # -- reading --------------------------------------------------------------------------------
    def band(self, in_flight: int, columns: int | None = None) -> np.ndarray:
        """(L, W): bytes of range a..a+j with ``in_flight`` micro-batches in flight (OVER past
        the last layer); ``columns``: the first ``columns`` of them only (j < columns)."""
        w = self.width if columns is None else max(min(int(columns), self.width), 0)
        if self.stash is None:
            return self.bands[self.k_index(in_flight), :, :w]
        if in_flight == 1:
            return self.bands[0, :, :w]
        once, stash = self._linear_parts
        band: np.ndarray = once[:, :w] + (int(in_flight) - 1) * stash[:, :w]
        return band

    @cached_property
    def _linear_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """The linear form's (once, stash) with ``once`` at most OVER and ``stash`` 0 where
        ``once`` is OVER, so that ``once + (k - 1) x stash`` is a band with no masking."""
        once, stash = self.bands[0], self.stash
        assert stash is not None
        over = once >= OVER
        if over.any():
            once, stash = np.where(over, OVER, once), np.where(over, 0, stash)
        return once, stash

    def most_in_flight(self, capacity: int) -> np.ndarray | None:
        """(L, W) of the linear form: the most micro-batches in flight with which each range of the
        band fits ``capacity`` (0: none; the int64 maximum: any number), so that ``band(k) <=
        capacity`` is ``most_in_flight(capacity) >= k``; None for a band per count (or a negative
        stash, which the linear form never has)."""
        if self.stash is None:
            return None
        once, stash = self._linear_parts
        if (stash < 0).any():
            return None
        room = int(capacity) - once
        most = np.where(stash > 0, room // np.maximum(stash, 1) + 1, np.iinfo(np.int64).max)
        return np.where(room >= 0, most, 0)

    def fit_counts(self, capacity: int) -> np.ndarray | None:
        """(W,) of the linear form: entry j the most micro-batches in flight with which some range
        a..a+i, i >= j, fits ``capacity`` (as ``most_in_flight``), so that ``width_for(k, capacity)``
        is the number of entries >= k; None for a band per count."""
        most = self.most_in_flight(capacity)
        if most is None:
            return None
        if self.width == 0:
            return np.zeros(0, np.int64)
        counts: np.ndarray = np.maximum.accumulate(most.max(axis=0)[::-1])[::-1]
        return counts

    def widths_for(self, in_flight: Iterable[int], capacity: int) -> np.ndarray:
        """``width_for`` of each in-flight count, at once."""
        ks = np.array([int(k) for k in in_flight], np.int64)
        counts = self.fit_counts(capacity) if self.stash is not None and len(ks) > 1 else None
        if counts is None:
            return np.array([self.width_for(int(k), capacity) for k in ks], np.int64)
        widths: np.ndarray = (counts[None, :] >= ks[:, None]).sum(axis=1).astype(np.int64)
        return widths

    def tile_band(self, in_flight: int) -> np.ndarray:
        """(L, W): the worst tile of each range of the band."""
        if self.tiles is None:
            return np.zeros(self.bands.shape[1:], np.int64)
        result: np.ndarray = self.tiles[self.k_index(in_flight)]
        return result

    def bytes_of(self, in_flight: int, first: int, last: int) -> int:
        """Worst-tile bytes of layers first..last (OVER outside the band)."""
        j = last - first
        if not 0 <= j < self.width or last >= self.num_layers:
            return int(OVER)
        if self.stash is None:
            return int(self.bands[self.k_index(in_flight), first, j])
        return int(self.bands[0, first, j]) + (int(in_flight) - 1) * int(self.stash[first, j])

    def tile_of(self, in_flight: int, first: int, last: int) -> int:
        """The worst tile of layers first..last (0 outside the band)."""
        j = last - first
        if self.tiles is None or not 0 <= j < self.width:
            return 0
        return int(self.tiles[self.k_index(in_flight), first, j])

    def single(self, in_flight: int = 1) -> np.ndarray:
        """(L,) bytes of each layer alone."""
        return self.band(in_flight)[:, 0].copy() if self.width else np.zeros(self.num_layers, np.int64)

    def width_for(self, in_flight: int, capacity: int) -> int:
        """The longest stage that fits ``capacity`` with ``in_flight`` in flight (0: none)."""
        fits = (self.band(in_flight) <= capacity).any(axis=0)
        return int(np.flatnonzero(fits)[-1]) + 1 if fits.any() else 0

    def reach(self, in_flight: int, capacity: int) -> np.ndarray:
        """(L,) for each first layer a, the end (exclusive) of the longest stage from a that fits
        ``capacity`` (a itself when none does)."""
        if not self.covers(capacity):
            raise ValueError(f"the table's band covers {self.capacity} bytes per tile, not {capacity}")
        fits = self.band(in_flight) <= capacity
        length = np.where(fits.all(axis=1), self.width, np.argmin(fits, axis=1))
        return np.arange(self.num_layers) + length

    @property
    def compute(self) -> np.ndarray:
        """(L, L) dense compute of every range a..b (0 for b < a; small tables only)."""
        prefix = self.compute_prefix if self.compute_prefix is not None else np.zeros(self.num_layers + 1)
        return np.triu(prefix[None, 1:] - prefix[:-1, None])

    # -- dense views (small tables: tests, tools) ------------------------------------------------
    def dense_bytes(self, in_flight: int) -> np.ndarray:
        """(L, L): entry [a, b] the bytes of a..b (0 for b < a, OVER outside the band)."""
        L, W = self.num_layers, self.width
        out = np.zeros((L, L), np.int64)
        a, b = np.triu_indices(L)
        j = b - a
        inside = j < W
        out[a, b] = OVER
        band = self.band(in_flight)
        out[a[inside], b[inside]] = band[a[inside], j[inside]]
        return out

    @property
    def worst_bytes(self) -> np.ndarray:
        """(K, L, L) dense form of every in-flight count (small tables only)."""
        return np.stack([self.dense_bytes(k) for k in self.in_flight]) if self.in_flight else \
            np.zeros((0, self.num_layers, self.num_layers), np.int64)

    @property
    def worst_tile(self) -> np.ndarray:
        """(K, L, L) dense worst tiles (0 outside the band; small tables only)."""
        L, W = self.num_layers, self.width
        a, b = np.triu_indices(L)
        j = b - a
        inside = j < W
        out = np.zeros((len(self.in_flight), L, L), np.int64)
        for i, k in enumerate(self.in_flight):
            out[i, a[inside], b[inside]] = self.tile_band(k)[a[inside], j[inside]]
        return out
