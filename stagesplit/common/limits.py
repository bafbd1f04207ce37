"""Every limit on untrusted input and on options, in one place, so the docs, the readers,
the options record and the tests agree on them."""

from __future__ import annotations

#: deepest nesting of lists/objects accepted in JSON and YAML (profiles need 5, plans 4)
MAX_DEPTH = 100
#: YAML aliases (``*name``) accepted in one document, and nodes after expanding them
MAX_YAML_ALIASES = 1000
MAX_YAML_NODES = 1_000_000
#: config, target, layer-compute and plan files are small; larger ones are refused
MAX_CONFIG_BYTES = 64 << 20
#: a profile read from a pipe, FIFO or device (no size known in advance) is capped at this
MAX_STREAM_BYTES = 512 << 20
#: seconds to wait for the first byte from a FIFO (no writer ever opening it would hang)
FIFO_WAIT_S = 5.0
#: limits on what a profile may declare, checked before anything is allocated from them
MAX_STEPS = 10_000_000
#: any one byte count, and the sum of a profile's byte counts (so that every stage sum, even
#: times the largest micro-batch count, stays far inside int64 and exact in float64)
MAX_BYTES = 1 << 50
#: compute figures (cycles, FLOPs, seconds...) in one profile sum to at most this
MAX_COMPUTE = 1e30
#: a time or compute figure a plan file records is at most this: far above any real plan's, and
#: far enough inside a float's range that a step of any micro-batch count on any number of
#: stages, in ms, cannot overflow to "inf"
MAX_PLAN_FIGURE = 1e100
#: tiles of one device (an IPU has 1,472; per-tile arrays are allocated from this)
MAX_TILES = 1 << 20
#: device counts, micro-batches and solver workers accepted on the command line
MAX_DEVICES = 1024
#: GPUs of a cluster the layout search lays out (its pipelines stay within MAX_DEVICES stages)
MAX_GPUS = 1 << 20
MAX_MICRO_BATCHES = 4096
#: chunks (virtual stages) per device
MAX_CHUNKS_PER_RANK = 64
MAX_WORKERS = 256
#: CP-SAT seconds per phase
MAX_TIME_LIMIT = 1e6
#: a compact (zip) profile may expand to at most max(this, EXPANSION_RATIO x its size)
MIN_EXPANDED_BYTES = 512 << 20
EXPANSION_RATIO = 100

__all__ = ["EXPANSION_RATIO", "FIFO_WAIT_S", "MAX_BYTES", "MAX_CHUNKS_PER_RANK", "MAX_COMPUTE", "MAX_CONFIG_BYTES",
           "MAX_DEPTH", "MAX_DEVICES", "MAX_GPUS", "MAX_MICRO_BATCHES", "MAX_PLAN_FIGURE", "MAX_STEPS",
           "MAX_STREAM_BYTES",
           "MAX_TILES", "MAX_TIME_LIMIT", "MAX_WORKERS", "MAX_YAML_ALIASES", "MAX_YAML_NODES", "MIN_EXPANDED_BYTES"]
