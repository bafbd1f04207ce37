"""torch's CUDA caching allocator replayed on one stream's sequence of allocations and frees: the
bytes it reserves from the device (``reserved``) beside the bytes the program holds (``allocated``).

A plan that "fits" on a GPU must fit what the allocator reserves, not what the tensors hold: the
allocator rounds every request, packs small ones into 2 MiB segments, serves mid-sized ones from
20 MiB segments and keeps freed blocks cached, so a segment split for one tensor may be too small
for the next and a new one is reserved. For one stream the rules are deterministic, so replaying
the sequence gives the reserved bytes exactly (up to the order of equal-sized cached blocks, whose
addresses come from cudaMalloc: here later segments get higher addresses).

What is implemented, with the names of torch's ``c10/cuda/CUDACachingAllocator.cpp`` (class
``DeviceCachingAllocator``) and ``c10/core/AllocatorConfig.cpp``:

* ``round_size``: a request under ``kMinBlockSize`` (512 B) takes 512 B, any other is rounded up to
  a multiple of 512 B; with ``roundup_power2_divisions`` set for the request's power-of-two
  interval (16 intervals from 1 MiB to 64 GiB, ``AllocatorConfig::roundup_power2_divisions``),
  a request above 512 B x divisions is rounded up to the next of the interval's equal divisions
  (``roundup_power2_next_division``; a power of two stays as it is).
* ``get_pool``: rounded sizes up to ``kSmallSize`` (1 MiB) go to the small pool, larger ones to
  the large pool; the pools never share blocks.
* ``get_allocation_size``: a new segment is ``kSmallBuffer`` (2 MiB) for the small pool,
  ``kLargeBuffer`` (20 MiB) for a request under ``kMinLargeAlloc`` (10 MiB), else the request
  rounded up to ``kRoundLarge`` (2 MiB).
* ``get_free_block``: the cached block that fits best: smallest size, then lowest address
  (``BlockComparatorSize``, ``lower_bound``); with ``max_split_size_mb`` set, a request under it
  never takes an oversize block (>= max_split_size), and a request at or above it takes one only
  if the block is under request + ``max_non_split_rounding_mb`` (default ``kLargeBuffer``).
* ``should_split``: the rest of the block is split off when, in the small pool (or with
  expandable segments), at least 512 B would remain; in the large pool, when the request is under
  max_split_size and more than ``kSmallSize`` (1 MiB) would remain. Otherwise the request gets
  the whole block (counted whole in ``allocated_bytes``).
* ``free_block`` / ``try_merge_blocks``: a freed block merges with its free neighbours of the
  same segment and goes back to its pool's cache; segments are never returned to the device
  (that happens on ``empty_cache`` or, before an out-of-memory error, in
  ``release_cached_blocks``; see ``capacity`` below).
* ``expandable_segments:True``: one segment per pool (per stream) whose mapped size grows in
  pages of 2 MiB (small pool) or 20 MiB (large pool) (``ExpandableSegment``, segment_size); a
  request no cached block holds is served at the segment's end, the free block there (if any)
  extended by as many pages as are missing (``find_expandable_block``, ``map_block``,
  ``try_allocate_expandable_block``); ``get_free_block`` prefers any fitting block to the one at
  the end (its "expandable size" is the address space behind it).
* ``capacity`` (optional): the device bytes the allocator may reserve. When a new segment would
  pass it, the allocator first releases cached oversize blocks (``release_available_cached_blocks``,
  with max_split_size set), then every cached block that is a whole segment
  (``release_cached_blocks``), and retries; if that fails too the replay records an
  out-of-memory at that event. Without it the replay reserves as if memory had no end, the
  reserved peak a run needs to avoid every retry.

Not modelled: ``garbage_collection_threshold`` (it acts only under a per-process memory
fraction, ``set_fraction``), ``backend:cudaMallocAsync`` (a different allocator), several
streams, CUDA graphs' private pools, ``recordStream``; those options are refused by
``parse_alloc_conf``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError

__all__ = ["K_LARGE_BUFFER", "K_MIN_BLOCK_SIZE", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE", "K_SMALL_BUFFER",
           "K_SMALL_SIZE", "AllocatorOptions", "Replay", "allocation_size", "parse_alloc_conf", "replay",
           "round_size"]

MiB = 1 << 20
K_MIN_BLOCK_SIZE = 512            #: every size is rounded to at least 512 B
K_SMALL_SIZE = MiB                #: the largest "small" allocation
K_SMALL_BUFFER = 2 * MiB          #: small allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 * MiB         #: allocations between 1 and 10 MiB may use 20 MiB segments
K_MIN_LARGE_ALLOC = 10 * MiB      #: ... up to this size
K_ROUND_LARGE = 2 * MiB           #: larger segments are the request rounded up to 2 MiB
#: roundup_power2_divisions has one setting per power-of-two interval from 1 MiB (2^20) to 64 GiB
_INTERVALS = 16
_INTERVAL_START = 20
_NO_LIMIT = 1 << 63               #: torch's SIZE_MAX for an unset max_split_size
_SHIFT = 64                       #: a cached block's sort key: size << 64 | address


@dataclass(frozen=True)
class AllocatorOptions:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` settings the replay models (torch's defaults when unset).

    ``max_split_size``: bytes (``max_split_size_mb`` x 1 MiB), None for no limit;
    ``roundup_power2_divisions``: 16 divisions, one per power-of-two interval from 1 MiB (0: plain
    512 B rounding); ``capacity``: the bytes the allocator may reserve, None for no limit."""

    expandable_segments: bool = False
    max_split_size: int | None = None
    max_non_split_rounding: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * _INTERVALS
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.max_split_size is not None and self.max_split_size < K_LARGE_BUFFER:
            raise OptionError("max_split_size", f"expected at least {K_LARGE_BUFFER} bytes (20 MiB, torch's "
                              f"minimum for max_split_size_mb), got {self.max_split_size}")
        if self.max_non_split_rounding < K_LARGE_BUFFER:
            raise OptionError("max_non_split_rounding", f"expected at least {K_LARGE_BUFFER} bytes (20 MiB)")
        divisions = tuple(int(d) for d in self.roundup_power2_divisions)
        if len(divisions) != _INTERVALS or any(d < 0 or d & (d - 1) for d in divisions):
            raise OptionError("roundup_power2_divisions", f"expected {_INTERVALS} divisions, each 0 or a power "
                              f"of 2, got {self.roundup_power2_divisions}")
        object.__setattr__(self, "roundup_power2_divisions", divisions)
        if self.capacity is not None and self.capacity < 0:
            raise OptionError("capacity", "expected a byte count >= 0")
        if self.capacity is not None and self.expandable_segments:
            raise OptionError("capacity", "a capacity with expandable segments is not modelled (torch unmaps "
                              "their free pages before an out-of-memory error); leave one of them out")

    @property
    def split_limit(self) -> int:
        """max_split_size, or torch's SIZE_MAX when unset."""
        return _NO_LIMIT if self.max_split_size is None else self.max_split_size


_IGNORED_KEYS = ("pinned_use_cuda_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
                 "release_lock_on_cudamalloc", "pinned_reserve_segment_size_mb", "pinned_use_background_threads")


def parse_alloc_conf(text: str, capacity: int | None = None, parameter: str = "PYTORCH_CUDA_ALLOC_CONF"
                     ) -> AllocatorOptions:
    """Options from a ``PYTORCH_CUDA_ALLOC_CONF`` string (``key:value`` pairs separated by commas;
    ``roundup_power2_divisions`` also as ``[256:1,512:2,>:4]``, boundaries in MiB), read as torch's
    ``AllocatorConfig::parseArgs`` reads them. Settings the replay does not model are refused."""
    where = parameter
    tokens: list[str] = []
    buf = ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append(buf)
                buf = ""
            tokens.append(ch)
        elif ch != " ":
            buf += ch
    if buf:
        tokens.append(buf)
    values: dict[str, object] = {}
    i = 0

    def take(expected: str | None = None) -> str:
        nonlocal i
        i += 1
        if i >= len(tokens) or (expected is not None and tokens[i] != expected):
            raise OptionError(where, f"expected {expected or 'a value'} after {tokens[i - 1]!r} in {text!r}")
        return tokens[i]

    def number(token: str) -> int:
        if not token.isdigit():
            raise OptionError(where, f"expected a whole number, got {token!r} in {text!r}")
        return int(token)

    while i < len(tokens):
        key = tokens[i]
        take(":")
        if key == "max_split_size_mb":
            values["max_split_size"] = number(take()) * MiB
        elif key == "max_non_split_rounding_mb":
            values["max_non_split_rounding"] = number(take()) * MiB
        elif key == "expandable_segments":
            flag = take()
            if flag not in ("True", "False"):
                raise OptionError(where, f"expected expandable_segments:True or False, got {flag!r}")
            values["expandable_segments"] = flag == "True"
        elif key == "roundup_power2_divisions":
            values["roundup_power2_divisions"] = _divisions(take, number, text, where)
        elif key == "backend":
            if take() != "native":
                raise OptionError(where, "only backend:native (the caching allocator) can be replayed")
        elif key in _IGNORED_KEYS:
            take()
        elif key == "garbage_collection_threshold":
            raise OptionError(where, "garbage_collection_threshold is not modelled (it acts only under a "
                              "per-process memory fraction); leave it out")
        else:
            raise OptionError(where, f"unknown setting {key!r}")
        i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise OptionError(where, f"expected ',' between settings in {text!r}")
            i += 1
    try:
        return AllocatorOptions(capacity=capacity, **values)  # type: ignore[arg-type]  # keys checked above
    except OptionError as e:
        raise OptionError(where, f"{e.detail} (in {text!r})") from None


def _divisions(take: Callable[..., str], number: Callable[[str], int], text: str, where: str) -> tuple[int, ...]:
    """``roundup_power2_divisions``'s value, as ``parseRoundUpPower2Divisions`` fills the 16 entries."""
    first = take()
    if first != "[":
        d = number(first)
        return (d,) * _INTERVALS
    out = [0] * _INTERVALS
    last = 0
    first_value = True
    while True:
        boundary = take()
        if boundary == "]":
            break
        take(":")
        value = number(take())
        if boundary == ">":
            out[last + 1:] = [value] * (_INTERVALS - last - 1)
        else:
            b = number(boundary)
            if b <= 0 or b & (b - 1):
                raise OptionError(where, f"roundup_power2_divisions boundaries are powers of 2 "
                                  f"(MiB), got {boundary!r}")
            index = min(b.bit_length() - 1, _INTERVALS - 1)
            if first_value:
                out[:index] = [value] * index
                first_value = False
            out[index] = value
            last = index
        nxt = take()
        if nxt == "]":
            break
        if nxt != ",":
            raise OptionError(where, f"expected ',' or ']' in {text!r}")
    return tuple(out)


def round_size(size: int, options: AllocatorOptions = AllocatorOptions()) -> int:
    """The bytes torch's ``round_size`` makes of a request of ``size`` bytes."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    index = min(max(size.bit_length() - 1 - _INTERVAL_START, 0), _INTERVALS - 1)
    divisions = options.roundup_power2_divisions[index]
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        base = size & ~(step - 1)
        return size if base == size else base + step
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """The segment torch's ``get_allocation_size`` asks cudaMalloc for, for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(frozen=True)
class Replay:
    """What a replay found. Peaks are over the whole sequence; ``allocated`` counts blocks as
    torch's ``allocated_bytes`` does (rounded, and whole where a block was not split),
    ``requested`` the bytes asked for. ``segments``: the size of each segment reserved (for
    expandable segments, each pool's mapped size at the end), in the order they were made;
    ``oom_event``: the index of the event that ran out of ``capacity`` (-1: none; the replay
    stops there)."""

    allocated_peak: int
    requested_peak: int
    reserved_peak: int
    reserved_at_end: int
    segments: tuple[int, ...] = field(repr=False)
    small_reserved_peak: int
    large_reserved_peak: int
    oom_event: int = -1
    #: the bytes asked for and still held when the sequence ends
    requested_at_end: int = 0
    #: how many times a new segment would have passed ``capacity`` and cached blocks were released first
    #: (torch's out-of-memory retry: a synchronising cudaFree and cudaMalloc, slow)
    retries: int = 0

    @property
    def ratio(self) -> float:
        """Reserved over allocated peak (1.0 for an empty sequence)."""
        return self.reserved_peak / self.allocated_peak if self.allocated_peak else 1.0


class _Pool:
    """One pool's cached blocks, kept sorted by (size, address) as ints ``size << 64 | address``."""

    __slots__ = ("keys", "small", "tail", "mapped", "base")

    def __init__(self, small: bool):
        self.keys: list[int] = []
        self.small = small
        self.tail = -1         # expandable: the address of the block ending at the mapped end (-1: none)
        self.mapped = 0        # expandable: the segment's mapped bytes
        self.base = -1         # expandable: the segment's address


class _Allocator:
    """The replay's state: blocks by address (size, neighbours, allocated), the two pools, and
    the counters torch keeps as ``allocated_bytes``, ``requested_bytes`` and ``reserved_bytes``."""

    def __init__(self, options: AllocatorOptions):
        self.o = options
        self.limit = options.split_limit
        self.small = _Pool(True)
        self.large = _Pool(False)
        self.size: dict[int, int] = {}
        self.prev: dict[int, int] = {}
        self.next: dict[int, int] = {}
        self.busy: set[int] = set()
        self.pool_at: dict[int, _Pool] = {}    # each block's pool
        self.segment_of: dict[int, int] = {}   # a segment's first address -> its size (not expandable)
        self.top = 1 << 12                     # the next segment's address
        self.allocated = self.requested = self.reserved = 0
        self.pool_reserved = [0, 0]            # small, large
        self.pool_peak = [0, 0]
        self.segments: list[int] = []
        self.retries = 0                       # times cached blocks were released to stay within the capacity

    # -- cached blocks -------------------------------------------------------------------------
    def _cache(self, pool: _Pool, addr: int) -> None:
        bisect.insort(pool.keys, self.size[addr] << _SHIFT | addr)

    def _uncache(self, pool: _Pool, addr: int) -> None:
        key = self.size[addr] << _SHIFT | addr
        i = bisect.bisect_left(pool.keys, key)
        del pool.keys[i]

    def _free_block(self, pool: _Pool, size: int) -> int:
        """``get_free_block``: the address of the cached block to use, or -1."""
        keys = pool.keys
        i = bisect.bisect_left(keys, size << _SHIFT)
        if i == len(keys):
            return -1
        addr = keys[i] & ((1 << _SHIFT) - 1)
        if self.o.expandable_segments and addr == pool.tail and i + 1 < len(keys):
            addr = keys[i + 1] & ((1 << _SHIFT) - 1)      # any fitting block before the segment's end
            i += 1
        have = keys[i] >> _SHIFT
        if size < self.limit and have >= self.limit:
            return -1
        if size >= self.limit and have >= size + self.o.max_non_split_rounding:
            return -1
        del keys[i]
        return addr

    # -- new memory ----------------------------------------------------------------------------
    def _reserve(self, pool: _Pool, nbytes: int) -> None:
        k = 0 if pool.small else 1
        self.reserved += nbytes
        self.pool_reserved[k] += nbytes
        self.pool_peak[k] = max(self.pool_peak[k], self.pool_reserved[k])

    def _new_segment(self, pool: _Pool, size: int) -> int:
        """``alloc_block``: a fresh segment for a rounded request; -1 past the capacity."""
        nbytes = allocation_size(size)
        if not self._room(nbytes, pool, size):
            return -1
        addr = self.top
        self.top += nbytes
        self.size[addr] = nbytes
        self.prev[addr] = self.next[addr] = -1
        self.segment_of[addr] = nbytes
        self.pool_at[addr] = pool
        self.segments.append(nbytes)
        self._reserve(pool, nbytes)
        return addr

    def _room(self, nbytes: int, pool: _Pool, size: int) -> bool:
        cap = self.o.capacity
        if cap is None or self.reserved + nbytes <= cap:
            return True
        self.retries += 1
        if self.o.max_split_size is not None:
            self._release_oversize(pool, size)
            if self.reserved + nbytes <= cap:
                return True
        for p in (self.large, self.small):       # release_cached_blocks: every whole cached segment
            for key in list(p.keys):
                addr = key & ((1 << _SHIFT) - 1)
                if self.prev[addr] == -1 and self.next[addr] == -1:
                    self._release(p, addr)
        return self.reserved + nbytes <= cap

    def _release(self, pool: _Pool, addr: int) -> None:
        self._uncache(pool, addr)
        nbytes = self.size.pop(addr)
        del self.prev[addr], self.next[addr], self.segment_of[addr], self.pool_at[addr]
        self.reserved -= nbytes
        self.pool_reserved[0 if pool.small else 1] -= nbytes

    def _release_oversize(self, pool: _Pool, size: int) -> None:
        """``release_available_cached_blocks``: the smallest cached oversize block that covers the
        request, else the largest ones until their sizes add up to it."""
        key_size = max(size, self.limit)
        keys = pool.keys
        i = bisect.bisect_left(keys, key_size << _SHIFT)
        if i < len(keys):
            self._release(pool, keys[i] & ((1 << _SHIFT) - 1))
            return
        released = 0
        j = len(keys) - 1
        while j >= 0 and released < key_size and keys[j] >> _SHIFT >= self.limit:
            addr = keys[j] & ((1 << _SHIFT) - 1)
            released += self.size[addr]
            self._release(pool, addr)
            j -= 1

    def _expand(self, pool: _Pool, size: int) -> int:
        """``try_allocate_expandable_block``: the block at the segment's end, grown by whole pages."""
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        if pool.base < 0:
            pool.base = self.top
            self.top += 1 << 48                      # address space (1.125 x the device's in torch)
        tail = pool.tail
        have = 0
        if tail >= 0 and tail not in self.busy:
            have = self.size[tail]
            self._uncache(pool, tail)
        grow = -(-(size - have) // page) * page
        if not self._room(grow, pool, size):
            if have:
                self._cache(pool, tail)
            return -1
        self._reserve(pool, grow)
        if have:
            self.size[tail] += grow
            addr = tail
        else:
            addr = pool.base + pool.mapped
            self.size[addr] = grow
            self.pool_at[addr] = pool
            self.prev[addr] = tail
            self.next[addr] = -1
            if tail >= 0:
                self.next[tail] = addr
        pool.mapped += grow
        pool.tail = addr
        return addr

    # -- the two calls -------------------------------------------------------------------------
    def malloc(self, nbytes: int, size: int) -> int:
        """A request of ``nbytes`` (``size`` rounded)'s block address (-1: out of capacity)."""
        pool = self.small if size <= K_SMALL_SIZE else self.large
        addr = self._free_block(pool, size)
        if addr < 0:
            addr = self._expand(pool, size) if self.o.expandable_segments else self._new_segment(pool, size)
            if addr < 0:
                return -1
        remaining = self.size[addr] - size
        if pool.small or self.o.expandable_segments:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = size < self.limit and remaining > K_SMALL_SIZE
        if split:
            rest = addr + size
            self.size[addr] = size
            self.size[rest] = remaining
            nxt = self.next[addr]
            self.prev[rest], self.next[rest] = addr, nxt
            self.pool_at[rest] = pool
            if nxt >= 0:
                self.prev[nxt] = rest
            self.next[addr] = rest
            if pool.tail == addr:
                pool.tail = rest
            self._cache(pool, rest)
        self.busy.add(addr)
        self.allocated += self.size[addr]
        self.requested += nbytes
        return addr

    def _absorb(self, pool: _Pool, left: int, right: int) -> None:
        """Merge the free block ``right`` into its left neighbour ``left`` (torch's merge of adjacent free
        blocks of one segment): ``left`` grows, ``right`` leaves the segment's list."""
        self.size[left] += self.size.pop(right)
        nxt = self.next.pop(right)
        del self.prev[right], self.pool_at[right]
        self.next[left] = nxt
        if nxt >= 0:
            self.prev[nxt] = left
        if pool.tail == right:
            pool.tail = left

    def free(self, addr: int, nbytes: int) -> None:
        pool = self.pool_at[addr]
        self.busy.discard(addr)
        self.allocated -= self.size[addr]
        self.requested -= nbytes
        for neighbour in (self.prev[addr], self.next[addr]):
            if neighbour < 0 or neighbour in self.busy:
                continue
            self._uncache(pool, neighbour)
            if neighbour == self.prev[addr]:                 # [neighbour addr]
                self._absorb(pool, neighbour, addr)
                addr = neighbour
            else:                                            # [addr neighbour]
                self._absorb(pool, addr, neighbour)
        self._cache(pool, addr)


def _rounded(sizes: np.ndarray, options: AllocatorOptions) -> np.ndarray:
    """``round_size`` of every size: at once where no power-of-two division is set, else per distinct size."""
    if not any(options.roundup_power2_divisions):
        out: np.ndarray = np.maximum(-(-sizes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE, K_MIN_BLOCK_SIZE)
        return out
    distinct, inverse = np.unique(sizes, return_inverse=True)
    result: np.ndarray = np.array([round_size(int(n), options) for n in distinct], np.int64)[inverse]
    return result


def replay(sizes: np.ndarray, events: np.ndarray, options: AllocatorOptions = AllocatorOptions()) -> Replay:
    """Replay one stream's allocations and frees.

    ``sizes[k]``: the bytes allocation ``k`` asks for; ``events``: in program order, ``k`` (>= 0)
    allocates ``k`` and ``~k`` (``-k - 1``) frees it. An allocation may be made again once freed;
    a free of something not allocated is refused. Allocations still held at the end stay held. A request
    of 0 bytes takes no memory (torch's allocator returns no block for it)."""
    sizes = np.asarray(sizes, np.int64)
    events = np.asarray(events, np.int64)
    if sizes.ndim != 1 or events.ndim != 1:
        raise OptionError("events", "expected one-dimensional arrays of sizes and events")
    if len(sizes) and int(sizes.min()) < 0:
        raise OptionError("sizes", "expected byte counts >= 0")
    if len(events) and (int(events.max()) >= len(sizes) or int(events.min()) < -len(sizes)):
        raise OptionError("events", f"expected allocation numbers below {len(sizes)} (or their ~ for a free)")
    rounded = _rounded(sizes, options).tolist()
    if not options.expandable_segments and options.capacity is None:
        return _replay_segments(sizes.tolist(), rounded, events.tolist(), options)
    return _replay_general(sizes.tolist(), rounded, events.tolist(), options)


def _replay_general(size_list: list[int], rounded: list[int], events: list[int], options: AllocatorOptions) -> Replay:
    """Every rule (expandable segments, a capacity), through ``_Allocator``."""
    a = _Allocator(options)
    where = [-1] * len(size_list)
    alloc_peak = req_peak = res_peak = 0
    oom = -1
    for i, e in enumerate(events):
        if e >= 0:
            if where[e] >= 0:
                raise OptionError("events", f"allocation {e} made again at event {i} before it was freed")
            n = size_list[e]
            if not n:                           # torch hands out no memory for 0 bytes
                where[e] = 0
                continue
            addr = a.malloc(n, rounded[e])
            if addr < 0:
                oom = i
                break
            where[e] = addr
            if a.allocated > alloc_peak:
                alloc_peak = a.allocated
            if a.requested > req_peak:
                req_peak = a.requested
            if a.reserved > res_peak:
                res_peak = a.reserved
        else:
            k = ~e
            addr = where[k]
            if addr < 0:
                raise OptionError("events", f"allocation {k} freed at event {i} while not allocated")
            where[k] = -1
            if addr:
                a.free(addr, size_list[k])
    if options.expandable_segments:
        segments = tuple(p.mapped for p in (a.small, a.large) if p.mapped)
    else:
        segments = tuple(a.segments)
    return Replay(alloc_peak, req_peak, res_peak, a.reserved, segments, a.pool_peak[0], a.pool_peak[1], oom,
                  a.requested, a.retries)


def _replay_segments(size_list: list[int], rounded: list[int], events: list[int], options: AllocatorOptions
                     ) -> Replay:
    """The same rules as ``_Allocator`` without expandable segments or a capacity (the common case), written
    out in one loop over local names: a plan's replay runs ~10^5 events per rank, and this loop takes a
    third of the time of the method calls (tests/model/test_allocator.py checks the two agree)."""
    mask = (1 << _SHIFT) - 1
    limit, rounding = options.split_limit, options.max_non_split_rounding
    small_keys: list[int] = []
    large_keys: list[int] = []
    bsize: dict[int, int] = {}
    bprev: dict[int, int] = {}
    bnext: dict[int, int] = {}
    bkeys: dict[int, list[int]] = {}
    busy: set[int] = set()
    where = [-1] * len(size_list)
    top = 1 << 12
    allocated = requested = reserved = small_reserved = large_reserved = 0
    alloc_peak = req_peak = res_peak = small_peak = large_peak = 0
    segments: list[int] = []
    find, insort = bisect.bisect_left, bisect.insort
    for i, e in enumerate(events):
        if e >= 0:
            if where[e] >= 0:
                raise OptionError("events", f"allocation {e} made again at event {i} before it was freed")
            if not size_list[e]:                # torch hands out no memory for 0 bytes
                where[e] = 0
                continue
            size = rounded[e]
            small = size <= K_SMALL_SIZE
            keys = small_keys if small else large_keys
            j = find(keys, size << _SHIFT)
            addr = -1
            if j < len(keys):                                     # get_free_block
                key = keys[j]
                have = key >> _SHIFT
                if not ((size < limit <= have) or (size >= limit and have >= size + rounding)):
                    del keys[j]
                    addr = key & mask
            if addr < 0:                                          # alloc_block
                nbytes = allocation_size(size)
                addr = top
                top += nbytes
                bsize[addr] = nbytes
                bprev[addr] = bnext[addr] = -1
                bkeys[addr] = keys
                segments.append(nbytes)
                reserved += nbytes
                if reserved > res_peak:
                    res_peak = reserved
                if small:
                    small_reserved += nbytes
                    small_peak = max(small_peak, small_reserved)
                else:
                    large_reserved += nbytes
                    large_peak = max(large_peak, large_reserved)
            have = bsize[addr]
            remaining = have - size
            if (remaining >= K_MIN_BLOCK_SIZE) if small else (size < limit and remaining > K_SMALL_SIZE):
                rest = addr + size                                # should_split
                bsize[addr] = size
                bsize[rest] = remaining
                nxt = bnext[addr]
                bprev[rest], bnext[rest], bkeys[rest] = addr, nxt, keys
                if nxt >= 0:
                    bprev[nxt] = rest
                bnext[addr] = rest
                insort(keys, remaining << _SHIFT | rest)
                have = size
            busy.add(addr)
            where[e] = addr
            allocated += have
            requested += size_list[e]
            if allocated > alloc_peak:
                alloc_peak = allocated
            if requested > req_peak:
                req_peak = requested
        else:
            k = ~e
            addr = where[k]
            if addr < 0:
                raise OptionError("events", f"allocation {k} freed at event {i} while not allocated")
            where[k] = -1
            if not addr:
                continue
            keys = bkeys[addr]
            busy.discard(addr)
            allocated -= bsize[addr]
            requested -= size_list[k]
            before = bprev[addr]                                  # free_block: merge [before addr]
            if before >= 0 and before not in busy:
                del keys[find(keys, bsize[before] << _SHIFT | before)]
                bsize[before] += bsize.pop(addr)
                nxt = bnext.pop(addr)
                del bprev[addr], bkeys[addr]
                bnext[before] = nxt
                if nxt >= 0:
                    bprev[nxt] = before
                addr = before
            after = bnext[addr]                                   # ... and [addr after]
            if after >= 0 and after not in busy:
                del keys[find(keys, bsize[after] << _SHIFT | after)]
                bsize[addr] += bsize.pop(after)
                nxt = bnext.pop(after)
                del bprev[after], bkeys[after]
                bnext[addr] = nxt
                if nxt >= 0:
                    bprev[nxt] = addr
            insort(keys, bsize[addr] << _SHIFT | addr)
    return Replay(alloc_peak, req_peak, res_peak, reserved, tuple(segments), small_peak, large_peak, -1, requested)
