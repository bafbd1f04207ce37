"""What activation recompute (checkpointing) saves and costs, per layer, from one capture.

A layer's *own* stash is what its forward makes and only its backward reads: the stashed
variables (model/stash.py) whose producing operation is one of the layer's forward operations
and that no other layer's operations use. Its input and output are not its own (the layers
before and after hold them), so every stashed byte belongs to at most one layer.

* ``full`` (checkpoint the block: torch.utils.checkpoint, Megatron's full/block): the forward
  keeps none of the layer's own stash; before the layer's backward the forward runs again, so
  the backward adds the layer's forward time and holds that stash again while it runs (with
  the rerun forward's own transient where it is larger than the backward's).
* ``selective`` (torch's selective activation checkpointing with the usual policy: keep the
  outputs of the compute-heavy operations - matrix products, convolutions, attention - and
  recompute the rest): drops the own stash made by the cheap operations (elementwise,
  activations, normalisation, softmax, dropout) and adds their forward time to the backward.
  torch keeps *every* output of a kept operation until the block's backward, also those the
  backward never reads (a projection's output that only a residual add reads): they are held
  beyond the layer's stash, so they are taken off what it saves. Its backward holds the dropped
  bytes again, and the output of the block's last kept operation, which torch's re-run (stopped
  early once the backward's tensors are back) still references when the backward starts.

A chunk (a range of layers) with choices ``o_i`` holds, per micro-batch in flight, its stash
less ``sum saved[o_i, i]``; its B time grows by ``sum added[o_i, i]``. The transients depend on
where in the chunk the recomputed layers are, because the forward makes the layers' own stashes
in order and the backward frees them in reverse (``chunk_changes``). With ``U`` the chunk's own
stash (every layer's ``saved`` under full) and ``N_i`` the own bytes that layers up to ``i``
still hold under their options:

* the forward, while layer ``i`` runs, holds what the earlier layers kept and all of layer
  ``i``'s own intermediates: the chunk's forward transient changes by ``max_i(N_{i-1} +
  own_i) - U``;
* the backward of layer ``i`` runs when the later layers' stashes are already freed, holding
  what the earlier layers kept and layer ``i``'s rerun: it changes by ``max(N_last, max over
  recomputed i of (N_i + rerun_i)) - U``.

Recomputing a chunk's *first* layers therefore costs least: their rerun comes when little else
is held (measured: 20% of a rank's peak between a chunk recomputing its first and its second
layer, tests/exporters/test_export_recompute_torch.py). Where a schedule splits the backward,
what B re-materialises stays for W: the weight stash is not reduced (solver/chunk_problem.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..io.profile import Phase
from .view import ModelView

# the cost model (model/costmodel.py) keeps its phase table and so imports this module: the model is
# read here through its structural view (model/view.py), not its class (no import circle)

__all__ = ["EXPENSIVE_OPERATIONS", "Recompute", "RecomputeTable", "recompute_table", "recomputed_variables"]


class Recompute(str, Enum):
    """A layer's recompute option (the index is its row in ``RecomputeTable``)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"

    @property
    def index(self) -> int:  # type: ignore[override]  # the option's row: shadows str.index, a public name
        return _INDEX[self]


_INDEX = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}

#: operations whose outputs selective recompute keeps (matched against the operation's last
#: path component, e.g. ``aten.mm``)
EXPENSIVE_OPERATIONS = re.compile(
    r"aten\.(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_?convolution\w*|conv\w*|_grouped_mm|"
    r"_?scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*|_cudnn_attention\w*)")


@dataclass(frozen=True)
class RecomputeTable:
    """Per layer and option (rows: none, selective, full): ``saved`` stash bytes one micro-batch
    no longer holds from forward to backward, ``rerun`` bytes its backward holds again while it
    runs, ``added`` forward time the backward repeats (``time_unit``)."""

    saved: np.ndarray          # (3, L) int64
    rerun: np.ndarray          # (3, L) int64
    added: np.ndarray          # (3, L) float64
    time_unit: str

    @property
    def num_layers(self) -> int:
        return int(self.saved.shape[1])

    def chunk_effect(self, bounds: Sequence[int] | np.ndarray, choice: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per chunk of ``bounds`` with per-layer options ``choice`` (L,): bytes saved, largest
        rerun (held again in the backward), time added."""
        b = np.asarray(bounds, np.int64)
        cols = np.arange(self.num_layers)
        chunk = np.searchsorted(b, cols, side="right") - 1
        C = len(b) - 1
        s = np.bincount(chunk, weights=self.saved[choice, cols], minlength=C).astype(np.int64)
        t = np.bincount(chunk, weights=self.added[choice, cols], minlength=C)
        x = np.zeros(C, np.int64)
        np.maximum.at(x, chunk, self.rerun[choice, cols])
        return s, x, t

    def chunk_changes(self, bounds: Sequence[int] | np.ndarray, choice: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per chunk of ``bounds`` with per-layer options ``choice`` (L,): bytes saved from the
        stash, the change of the forward transient, the change of the backward transient (see the
        module docstring: both depend on where the recomputed layers are), and time added."""
        b = np.asarray(bounds, np.int64)
        choice = np.asarray(choice, np.int64)
        L = self.num_layers
        cols = np.arange(L)
        own = self.saved[2]
        saved = self.saved[choice, cols]
        rerun = self.rerun[choice, cols]
        chunk = np.searchsorted(b, cols, side="right") - 1
        C = len(b) - 1
        kept = own - saved
        cum = np.cumsum(kept)
        before = np.concatenate([[0], cum])[b[:-1]]
        held = cum - before[chunk]                       # N_i: own bytes kept by the chunk's layers up to i
        whole = np.bincount(chunk, weights=own, minlength=C).astype(np.int64)
        total_saved = np.bincount(chunk, weights=saved, minlength=C).astype(np.int64)
        forward = np.zeros(C, np.int64)
        np.maximum.at(forward, chunk, held - kept + own)
        backward = whole - total_saved
        recomputed = choice > 0
        np.maximum.at(backward, chunk[recomputed], (held + rerun)[recomputed])
        added = np.bincount(chunk, weights=self.added[choice, cols], minlength=C)
        return total_saved, forward - whole, backward - whole, added


def recompute_table(model: ModelView, producer: np.ndarray, forward_peak: np.ndarray,
                    backward_peak: np.ndarray, op_times: np.ndarray, time_unit: str) -> RecomputeTable:
    """The options' figures for every layer of a profile with phases. ``producer``: the
    operation that made each variable (-1: none); ``forward_peak`` and ``backward_peak``: each
    single layer's transient figures (the phase table's diagonals); ``op_times``: every
    operation's time."""
    p = model.profile
    ops = p.operations
    L = model.num_layers
    op_layer = model.layers.op_layer
    owner, own, cheap_var, in_block, expensive_op, forward_made = _dropped(model, producer)
    made = producer >= 0
    nbytes = p.variables.bytes.astype(np.int64)
    full = np.bincount(owner[own], weights=nbytes[own], minlength=L).astype(np.int64)[:L]
    selective = np.bincount(owner[cheap_var], weights=nbytes[cheap_var], minlength=L).astype(np.int64)[:L]
    # selective checkpointing keeps every output of a kept operation until the block's backward,
    # also those the backward would not have read (a projection's output that only a residual
    # add reads): held beyond what the layer stashes without recompute
    maker = np.maximum(producer, 0)
    kept_extra = made & forward_made & expensive_op[maker] & in_block[maker] & ~model.var_stashed & model.var_nal
    selective = selective - np.bincount(op_layer[maker[kept_extra]], weights=nbytes[kept_extra],
                                        minlength=L).astype(np.int64)[:L]
    # torch stops the re-run once the backward's tensors are back; the output of the block's last
    # kept operation, handed back from the cache, stays referenced while the backward starts
    # (measured: 1 x (B, T, D) on the GPT and the Llama, tests/model/test_recompute_torch.py)
    kept_op = np.flatnonzero((ops.phase == Phase.FORWARD) & (op_layer >= 0) & in_block & expensive_op)
    last_kept = np.full(L, -1, np.int64)
    if len(kept_op):
        order = kept_op[np.argsort(ops.first_step[kept_op], kind="stable")]
        last_kept[op_layer[order]] = order            # the later assignment wins: each layer's last
    left = kept_extra & (maker == last_kept[np.where(made, op_layer[maker], 0)])
    left_over = np.bincount(op_layer[maker[left]], weights=nbytes[left], minlength=L).astype(np.int64)[:L]
    forward = (ops.phase == Phase.FORWARD) & (op_layer >= 0) & in_block
    full_time = np.bincount(op_layer[forward], weights=op_times[forward], minlength=L)[:L]
    cheap_forward = forward & ~expensive_op
    cheap_time = np.bincount(op_layer[cheap_forward], weights=op_times[cheap_forward], minlength=L)[:L]
    zeros = np.zeros(L, np.int64)
    rerun_full = full + np.maximum(np.asarray(forward_peak, np.int64) - np.asarray(backward_peak, np.int64), 0)
    # an option that saves nothing is no option: it costs its time for no memory
    cheap_time = np.where(selective > 0, cheap_time, 0.0)
    full_time = np.where(full > 0, full_time, 0.0)
    rerun_selective = np.where(selective > 0, selective + left_over, 0)
    return RecomputeTable(saved=np.vstack([zeros, selective, full]),
                          rerun=np.vstack([zeros, rerun_selective, np.where(full > 0, rerun_full, 0)]),
                          added=np.vstack([np.zeros(L), cheap_time, full_time]), time_unit=time_unit)


def recomputed_variables(model: ModelView, producer: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per variable: the layer whose stash it is (``owner``, -1: none), whether full recompute of that
    layer drops it (``own``) and whether selective recompute does (the cheap operations' outputs), as
    ``recompute_table`` counts them (for a replay of the allocations, solver/schedule_allocator.py)."""
    owner, own, cheap, *_ = _dropped(model, producer)
    return owner, own, cheap


def _dropped(model: ModelView, producer: np.ndarray) -> tuple[np.ndarray, ...]:
    """``recomputed_variables`` and what ``recompute_table`` reads besides: which operations run in their
    layer's block, which are compute-heavy, which variables a forward operation made."""
    p = model.profile
    ops = p.operations
    op_layer = model.layers.op_layer
    nv = len(p.variables)
    # the layers that use each variable: one owner, or -2 for several
    entry_op = np.repeat(np.arange(len(ops)), ops.vars.lengths())
    entry_var = ops.vars.values
    # an operation outside its layer's block (the head reading the last block's output) uses
    # the variable as another layer would: the block's checkpoint does not drop it
    in_block = _in_block(ops.name, op_layer, model.layers.module_paths)
    entry_layer = np.where(in_block[entry_op], op_layer[entry_op], -1)
    owner = np.full(nv, -1, np.int64)
    first = np.full(nv, np.iinfo(np.int64).max, np.int64)
    last = np.full(nv, -1, np.int64)
    np.minimum.at(first, entry_var, np.where(entry_layer >= 0, entry_layer, np.iinfo(np.int64).max))
    np.maximum.at(last, entry_var, entry_layer)
    used_outside = np.zeros(nv, bool)
    np.logical_or.at(used_outside, entry_var, entry_layer < 0)
    single = (first == last) & (last >= 0) & ~used_outside
    owner[single] = last[single]
    made = producer >= 0
    forward_made = np.zeros(nv, bool)
    forward_made[made] = ops.phase[producer[made]] == Phase.FORWARD
    own = model.var_stashed & single & forward_made & (owner == np.where(made, op_layer[np.maximum(producer, 0)], -3))
    own &= in_block[np.maximum(producer, 0)]
    leaf = np.array([name.rsplit("/", 1)[-1] for name in ops.name], dtype=object)
    expensive_op = np.array([bool(EXPENSIVE_OPERATIONS.fullmatch(n)) for n in leaf], bool)
    cheap_var = own & ~expensive_op[np.maximum(producer, 0)]
    return owner, own, cheap_var, in_block, expensive_op, forward_made


def _in_block(names: Sequence[str], op_layer: np.ndarray, module_paths: Sequence[str | None]) -> np.ndarray:
    """Whether each operation runs inside its layer's module (its name starts with the layer's
    module path and a separator: ``transformer.h.3.mlp/aten.mm``, ``transformer.h.3/aten.add``);
    every operation of a layer without a module path counts as inside."""
    out = op_layer >= 0
    paths = list(module_paths) if module_paths else []
    for i in np.flatnonzero(out):
        layer = int(op_layer[i])
        path = paths[layer] if layer < len(paths) else None
        if path is None:
            continue
        name = names[int(i)]
        out[i] = name.startswith(path) and len(name) > len(path) and name[len(path)] in "./"
    return out
