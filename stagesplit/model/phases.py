"""What a pipeline chunk needs in each phase of a training step, for the schedules' per-rank
memory and step time (solver/schedule_memory.py, solver/schedule_simulation.py).

A profile whose operations carry phases (a capture records forward, backward for inputs (B),
backward for weights (W), optimizer, recompute) is one micro-batch's whole step on one device.
For a chunk (a contiguous range of layers) this module reads off that timeline:

* ``resident``: bytes held all step (parameters, gradients, optimizer state, code);
* ``stash``: activations one micro-batch keeps from its forward to its backward (the stash rule
  of ``model/stash.py``);
* ``weight_stash``: what a micro-batch keeps from its B to its W where a schedule splits the
  backward: torch's split backward (``stage_backward_input``, then ``stage_backward_weight``)
  frees nothing at B, so the whole stash, plus the output gradients B made that W reads;
* the transient peak of one forward, one B, one W, one full backward and the optimizer step: the
  largest not-always-live bytes of the chunk at a step of that phase, which is what the action
  adds to the rank's state before it (the micro-batch's own stash, as far as it has been built
  or is still held, included);
* ``sent_forward`` / ``sent_backward``: the activation a forward sends on and the input gradient
  a backward sends back (what runtimes that keep sent tensors until the step ends hold);
* the time of each phase, from the operations' compute on the chosen target (seconds when the
  target can say, else the profile's compute unit).

Peaks over a phase are the same liveness peaks the cost model computes for a whole stage,
taken over the stage's columns of that phase only (``model/pricing.py`` on a view of the model
whose columns are masked), for every range at once. B's and W's are priced only when first read:
only a schedule that splits the backward reads them, and the others' chunks stand for them with
the whole backward's (``PhaseTable.chunks``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from ..io.profile import ROLES, Phase
from ..layers import one_stack
from .pricing import price_all_ranges
from .recompute import RecomputeTable, recompute_table
from .view import ModelView

# the cost model (model/costmodel.py) keeps its phase table and so imports this module: the model is
# read here through its structural view (model/view.py), not its class (no import circle)

_Model = TypeVar("_Model", bound=ModelView)

__all__ = ["ChunkCosts", "PHASE_KINDS", "PhaseTable", "has_phases", "phase_table", "producers"]

#: the kinds of action whose transient peaks a chunk has (``FULL``: B and W together)
PHASE_KINDS = ("forward", "backward_input", "backward_weight", "full_backward", "optimizer")

_PHASES_OF = {"forward": (Phase.FORWARD,), "backward_input": (Phase.BACKWARD_INPUT, Phase.RECOMPUTE),
              "backward_weight": (Phase.BACKWARD_WEIGHT,),
              "full_backward": (Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT, Phase.RECOMPUTE),
              "optimizer": (Phase.OPTIMIZER,)}


def has_phases(model: ModelView) -> bool:
    """Whether the profile says which phase each operation belongs to (a capture does)."""
    return model.phase_cols is not None


@dataclass(frozen=True)
class ChunkCosts:
    """The figures of chunks, one entry per chunk (see the module docstring); bytes as int64,
    times in ``time_unit``."""

    resident: np.ndarray
    stash: np.ndarray
    weight_stash: np.ndarray
    forward_peak: np.ndarray
    backward_input_peak: np.ndarray
    backward_weight_peak: np.ndarray
    full_backward_peak: np.ndarray
    optimizer_peak: np.ndarray
    sent_forward: np.ndarray
    sent_backward: np.ndarray
    #: what a micro-batch's forward leaves for the runtime to hold until its backward beyond the
    #: stash: the chunk's output (the last chunk's: the model's output, the loss's input)
    output: np.ndarray
    #: what a split backward's B frees when it ends (already taken off ``weight_stash``; still held
    #: at B's peak)
    input_backward_frees: np.ndarray
    #: parameter bytes a backward leaves unsharded until the chunk's next forward (FSDP2 under a
    #: pipeline schedule: model/datasharding.py's ``kept_unsharded``)
    unsharded_after_backward: np.ndarray
    forward_time: np.ndarray
    backward_input_time: np.ndarray
    backward_weight_time: np.ndarray
    optimizer_time: np.ndarray
    time_unit: str


@dataclass
class PhaseTable:
    """The figures of every layer range ``a..b`` (``[a, b]`` entries of (L, L) arrays, b >= a),
    from which ``chunks`` reads any split's chunks."""

    resident: np.ndarray
    stash: np.ndarray
    weight_stash: np.ndarray
    #: kind -> (L, L) transient peaks (``PHASE_KINDS``); a split backward's two are priced when first read
    peaks: Mapping[str, np.ndarray]
    model_output: int                  # bytes of the model's output (what the loss reads)
    forward_cut: np.ndarray            # (L + 1,) activation bytes crossing the cut before layer j
    backward_cut: np.ndarray           # (L + 1,) gradient bytes crossing it the other way
    layer_times: np.ndarray            # (L, 4): forward, B, W, optimizer time per layer
    time_unit: str
    #: what recomputing each layer saves and costs (None: the profile cannot say)
    recompute: RecomputeTable | None = None
    #: (L,) per chunk's last layer, the stash bytes a split backward's B frees as it ends
    input_backward_frees: np.ndarray | None = None
    #: (L,) per first layer ``a`` of the last chunk: the bytes held all step (a tied embedding and its
    #: gradient and optimizer state) that layer 0 and only layers from ``a`` on use, where stages are
    #: built from one stack's modules and so share one tensor between the first and last chunk of a
    #: rank (None: no such sharing)
    tied_with_first: np.ndarray | None = None
    #: (L + 1,) of ``forward_cut``, the bytes no layer's backward reads (not stashed): a block whose
    #: norm saves a float32 copy of a bfloat16 input keeps neither its input nor its output for the
    #: backward, so a chunk's stash holds neither (None: every crossing tensor is stashed)
    forward_cut_unstashed: np.ndarray | None = None
    #: (L,) per layer, the parameter bytes FSDP2 leaves unsharded after its backward under a pipeline
    #: schedule, until its next forward (None: none)
    unsharded_after_backward: np.ndarray | None = None
    #: what the solvers work out from this table and keep for their next search of it (CP-SAT's per-range
    #: chunk figures: solver/chunk_cpsat_tables.py), by what else they depend on; never part of a
    #: comparison (the table is not changed once built)
    memo: dict[object, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.resident)

    def chunks(self, bounds: Sequence[int] | np.ndarray, split_backward: bool = True) -> ChunkCosts:
        """The figures of the chunks ``bounds[i]..bounds[i+1]-1`` (a split's boundaries). Where the
        schedule does not split the backward (``split_backward`` False), B and W run as one action, so
        each of their peaks is given as the whole backward's: the split ones are then never priced."""
        b = np.asarray(bounds, np.int64)
        a, last = b[:-1], b[1:] - 1
        if np.any(last < a):
            raise ValueError("every chunk needs at least one layer")
        prefix = np.vstack([np.zeros((1, 4)), np.cumsum(self.layer_times, axis=0)])
        times = prefix[b[1:]] - prefix[b[:-1]]
        kept = np.zeros(len(a), np.int64)
        if self.unsharded_after_backward is not None:
            summed = np.concatenate([[0], np.cumsum(np.asarray(self.unsharded_after_backward, np.int64))])
            kept = (summed[b[1:]] - summed[b[:-1]]).astype(np.int64)
        first_chunk, last_chunk = a == 0, b[1:] == self.num_layers
        return ChunkCosts(
            resident=self.resident[a, last], stash=self.stash[a, last], weight_stash=self.weight_stash[a, last],
            forward_peak=self.peaks["forward"][a, last],
            backward_input_peak=self.peaks["backward_input" if split_backward else "full_backward"][a, last],
            backward_weight_peak=self.peaks["backward_weight" if split_backward else "full_backward"][a, last],
            full_backward_peak=self.peaks["full_backward"][a, last],
            optimizer_peak=self.peaks["optimizer"][a, last],
            sent_forward=np.where(last_chunk, 0, self.forward_cut[b[1:]]).astype(np.int64),
            sent_backward=np.where(first_chunk, 0, self.backward_cut[b[:-1]]).astype(np.int64),
            output=np.where(last_chunk, self.model_output, self.forward_cut[np.minimum(b[1:], self.num_layers)])
            .astype(np.int64),
            input_backward_frees=(np.zeros(len(a), np.int64) if self.input_backward_frees is None
                                  else self.input_backward_frees[last]),
            unsharded_after_backward=kept, forward_time=times[:, 0], backward_input_time=times[:, 1], backward_weight_time=times[:, 2],
            optimizer_time=times[:, 3], time_unit=self.time_unit)


class _Peaks(Mapping[str, np.ndarray]):
    """A phase table's transient peaks by kind, those of a split backward (B's and W's) priced when
    first read: a sweep each, as long as the others', which only a schedule that splits the backward
    (zero bubble, DualPipeV) reads, while a layout search makes a table per combination and solves most
    under 1F1B and interleaved 1F1B. What is priced is kept, read-only."""

    def __init__(self, made: dict[str, np.ndarray], pending: dict[str, Callable[[], np.ndarray]]) -> None:
        self._made = dict(made)
        self._pending = dict(pending)
        for grid in self._made.values():
            grid.flags.writeable = False

    def __getitem__(self, kind: str) -> np.ndarray:
        if kind not in self._made:
            if kind not in self._pending:
                raise KeyError(kind)
            grid = self._pending.pop(kind)()
            grid.flags.writeable = False
            self._made[kind] = grid
        return self._made[kind]

    def __iter__(self) -> Iterator[str]:
        return iter([*self._made, *self._pending])

    def __len__(self) -> int:
        return len(self._made) + len(self._pending)

    @property
    def priced(self) -> tuple[str, ...]:
        """The kinds priced so far."""
        return tuple(self._made)


def _masked(model: _Model, columns: np.ndarray) -> _Model:
    """A shallow view of ``model`` whose stages hold only ``columns`` of the timeline: pricing
    it gives each range's liveness peak over those columns (the additive parts are unchanged)."""
    view = copy.copy(model)
    timeline = copy.copy(model.timeline)
    timeline.cover = model.timeline.cover & columns[None, :]
    view.timeline = timeline
    view.base_stage_cols = model.base_stage_cols & columns
    return view


#: the phases a split backward runs as torch's ``stage_backward_input`` / ``stage_backward_weight`` do
_SPLIT_KINDS = ("backward_input", "backward_weight")


def _held_through_backward(model: ModelView, columns: dict[Phase, np.ndarray], entries: _Entries) -> ModelView | None:
    """A view of ``model`` whose stash (variables a forward operation made that a backward one reads)
    and output gradients W reads (made by B, read by W) live on to the backward's end: torch's
    ``stage_backward_input`` runs the autograd graph with ``retain_graph=True``, so no saved tensor is
    freed during B, and the gradients W reads stay until W. Priced on B's columns this is B's peak as
    the runtime holds it (the stash, the W gradients made so far, B's own transient gradients); on W's
    columns, W's with everything B kept (what B frees as it ends, ``input_backward_frees``, is taken off
    by the caller). None where the profile has no backward."""
    backward_cols = columns[Phase.BACKWARD_INPUT] | columns[Phase.BACKWARD_WEIGHT]
    if not backward_cols.any():
        return None
    first_col = int(np.argmax(backward_cols))
    end_col = int(len(backward_cols) - np.argmax(backward_cols[::-1]))
    p = model.profile
    ops = p.operations
    producer, entry_op, entry_var = entries.producer, entries.entry_op, entries.entry_var
    phase_of_entry = ops.phase[entry_op]
    read_back = np.zeros(len(p.variables.bytes), bool)
    read_back[entry_var[(phase_of_entry == Phase.BACKWARD_INPUT) | (phase_of_entry == Phase.BACKWARD_WEIGHT)]] = True
    read_by_w = np.zeros(len(p.variables.bytes), bool)
    read_by_w[entry_var[entries.weight_reads]] = True
    made = np.full(len(p.variables.bytes), -1, np.int64)
    known = producer >= 0
    made[known] = ops.phase[producer[known]]
    # the gradients W reads: only what one layer's B makes for its own W (a gradient that crosses a cut is
    # the receive buffer, held as such). The stash: every tensor a forward made that a backward reads,
    # a block's output read back by the next block included (a chunk's inner cut, held through B); the
    # caller takes off the one the chunk's last layer sends on, which no backward of the chunk reads
    op_layer = model.layers.op_layer
    backward_entry = (phase_of_entry == Phase.BACKWARD_INPUT) | (phase_of_entry == Phase.BACKWARD_WEIGHT)
    L = model.num_layers
    low = np.full(len(p.variables.bytes), L, np.int64)
    high = np.full(len(p.variables.bytes), -1, np.int64)
    np.minimum.at(low, entry_var[backward_entry], op_layer[entry_op[backward_entry]])
    np.maximum.at(high, entry_var[backward_entry], op_layer[entry_op[backward_entry]])
    maker_layer = np.where(known, op_layer[np.maximum(producer, 0)], -1)
    local = (low == high) & (low == maker_layer) & (low >= 0)
    held = model.var_nal & (((made == Phase.FORWARD) & read_back) |
                            ((made == Phase.BACKWARD_INPUT) & read_by_w & local))
    timeline = model.timeline
    rows = held[timeline.row_var] & (timeline.row_col_end > first_col) & (timeline.row_col_end < end_col)
    if not rows.any():
        return model
    view = copy.copy(model)
    extended = copy.copy(timeline)
    extended.row_col_end = np.where(rows, end_col, timeline.row_col_end)
    view.timeline = extended
    return view


def phase_table(model: ModelView) -> PhaseTable:
    """Every range's figures (see the module docstring). One pricing sweep per phase kind; a split
    backward's two (B's and W's) when a schedule that splits it first reads them (``_Peaks``)."""
    L = model.num_layers
    columns = model.phase_cols
    if columns is None:
        raise ValueError("the profile does not say which phase each operation belongs to")
    none = np.zeros(model.num_columns, bool)
    base = price_all_ranges(_masked(model, none), (1, 2))
    plain = base.worst_bytes[base.k_index(1)]
    stash = base.worst_bytes[base.k_index(2)] - plain
    forward_cut, backward_cut, unstashed = _cut_directions(model)
    entries = _Entries.of(model)
    # the split kinds are priced later from a view of the model's own: the model keeps this table
    # (costmodel.py's cached ``phase_table``), which then holds no path back to it (no reference cycle
    # keeping a rank's arrays until the collector runs)
    source = copy.copy(model)

    @functools.cache
    def held() -> ModelView | None:
        """The view B's and W's sweeps both price (made once, at the first of them)."""
        return _held_through_backward(source, columns, entries)

    def priced(kind: str, model: ModelView = source) -> np.ndarray:
        """The (L, L) transient peaks of ``kind``: one pricing sweep over its phases' columns."""
        phases = _PHASES_OF[kind]
        mask = np.logical_or.reduce([columns[p] for p in phases]) if phases else none
        if kind not in _SPLIT_KINDS:
            return np.triu(price_all_ranges(_masked(model, mask), (1,)).worst_bytes[0] - plain)
        view = held()
        if view is None:
            return np.triu(price_all_ranges(_masked(model, mask), (1,)).worst_bytes[0] - plain)
        # the held view keeps a range's output (read back only by the next layer) through its B and W:
        # not the chunk's, which the runtime detaches (held_output, the receive buffers count it)
        sent_on = np.maximum(forward_cut[1:] - unstashed[1:], 0)
        sent_on[-1] = 0
        return np.triu(price_all_ranges(_masked(view, mask), (1,)).worst_bytes[0] - plain - sent_on[None, :])
    peaks = _Peaks({kind: priced(kind) for kind in PHASE_KINDS if kind not in _SPLIT_KINDS},
                   {kind: functools.partial(priced, kind) for kind in _SPLIT_KINDS})
    frees = _freed_at_input_backward(model)
    weight_extra = _weight_gradients(model, entries) - frees[None, :]
    per_op, unit = _op_times(model)
    times = _layer_phase_times(model, per_op)
    diagonal = np.arange(L)
    recompute = recompute_table(model, entries.producer, peaks["forward"][diagonal, diagonal],
                                peaks["full_backward"][diagonal, diagonal], per_op, unit)
    return PhaseTable(resident=np.triu(plain), stash=np.triu(stash), weight_stash=np.triu(stash + weight_extra),
                      peaks=peaks, model_output=_model_output(model), forward_cut=forward_cut,
                      backward_cut=backward_cut, layer_times=times, time_unit=unit, recompute=recompute,
                      input_backward_frees=frees, tied_with_first=_tied_with_first(model),
                      forward_cut_unstashed=unstashed,
                      unsharded_after_backward=getattr(model, "kept_unsharded", None))


#: how a capture names the loss's operations (``capturing/profilebuild.py``: "loss/aten.sum")
LOSS_PREFIX = "loss/"


def _model_output(model: ModelView) -> int:
    """Bytes of the model's output: the not-always-live variables the loss's forward reads that
    an operation before the loss made (0 where the profile names no loss)."""
    p = model.profile
    ops = p.operations
    loss = np.array([name.startswith(LOSS_PREFIX) for name in ops.name], bool) & (ops.phase == Phase.FORWARD)
    if not loss.any():
        return 0
    producer = _producers(model)
    entry_op = np.repeat(np.arange(len(ops)), ops.vars.lengths())
    read = np.unique(ops.vars.values[loss[entry_op]])
    read = read[model.var_nal[read] & (producer[read] >= 0)]
    read = read[~loss[producer[read]]]
    return int(p.variables.bytes[read].sum())


@dataclass(frozen=True)
class _Entries:
    """What the backward rules read of the capture, worked out once per phase table: each
    variable's producer, and per (operation, variable) entry its operation, its variable and whether
    W reads it under torch's split backward (``_weight_reads``)."""

    producer: np.ndarray
    entry_op: np.ndarray
    entry_var: np.ndarray
    weight_reads: np.ndarray

    @classmethod
    def of(cls, model: ModelView) -> _Entries:
        ops = model.profile.operations
        producer = _producers(model)
        entry_op = np.repeat(np.arange(len(ops)), ops.vars.lengths())
        entry_var = ops.vars.values
        return cls(producer, entry_op, entry_var, _weight_reads(model, producer, entry_op, entry_var))


def _producers(model: ModelView) -> np.ndarray:
    """The operation that allocated each variable (whose first step is the variable's first
    live step), -1 where none or unknown."""
    p = model.profile
    v, ops = p.variables, p.operations
    nv = len(v)
    producer = np.full(nv, -1, np.int64)
    intervals = p.liveness.intervals
    has = v.live_class >= 0
    starts = np.full(nv, -1, np.int64)
    cls = v.live_class[has]
    nonempty = intervals.lengths()[cls] > 0
    idx = np.flatnonzero(has)[nonempty]
    starts[idx] = intervals.values[intervals.offsets[v.live_class[idx]], 0]
    known = ops.first_step >= 0
    by_step = np.full(max(p.num_steps, 1) + 1, -1, np.int64)
    order = np.flatnonzero(known)
    by_step[ops.first_step[order]] = order
    ok = starts >= 0
    producer[ok] = by_step[starts[ok]]
    return producer


def producers(model: ModelView) -> np.ndarray:
    """The operation that allocated each variable (-1: none or unknown): ``_producers``, for the
    allocator's replay of recompute (solver/schedule_allocator.py)."""
    return _producers(model)


def _weight_gradients(model: ModelView, entries: _Entries) -> np.ndarray:
    """Per range, the bytes of output gradients a split backward's B makes and its W reads:
    not-always-live variables allocated by a B operation of the range and used by a W
    operation of the range (torch's split backward keeps them from B to W). (Counting the gradient
    into every weight-using node instead, as torch's ``stage_backward_input`` keeps it, was measured
    closer on a Hugging Face GPT-2 but 6% over on the example GPT, whose residual gradients torch
    does not hold twice: this rule is within 3% of both.)"""
    L = model.num_layers
    p = model.profile
    ops = p.operations
    op_layer = model.layers.op_layer
    producer, entry_op, entry_var, w_entry = entries.producer, entries.entry_op, entries.entry_var, entries.weight_reads
    nal = model.var_nal
    # each variable's lowest and highest W reader layer, over the entries W reads
    w_var, w_layer = entry_var[w_entry], op_layer[entry_op[w_entry]]
    w_var, w_layer = w_var[w_layer >= 0], w_layer[w_layer >= 0]
    nv = len(p.variables.bytes)
    low, high = np.full(nv, L, np.int64), np.full(nv, -1, np.int64)
    np.minimum.at(low, w_var, w_layer)
    np.maximum.at(high, w_var, w_layer)
    cand = np.flatnonzero(nal & (producer >= 0) & (high >= 0))
    cand = cand[ops.phase[producer[cand]] == Phase.BACKWARD_INPUT]
    made = op_layer[producer[cand]]
    cand, made = cand[made >= 0], made[made >= 0]
    lo, hi = np.minimum(made, low[cand]), np.maximum(made, high[cand])
    # a variable counts for the ranges a..b holding both its maker and its readers (a <= lo, b >= hi):
    # its bytes at (lo, hi), summed over rows from below and over columns from the left
    out = np.zeros((L, L), np.int64)
    np.add.at(out, (lo, hi), p.variables.bytes[cand].astype(np.int64))
    out = np.cumsum(np.cumsum(out[::-1], axis=0)[::-1], axis=1)
    return np.triu(out)


def _weight_reads(model: ModelView, producer: np.ndarray, entry_op: np.ndarray, entry_var: np.ndarray) -> np.ndarray:
    """Per (operation, variable) entry, whether W reads the variable under torch's split backward: a W
    operation's reads, and the reads of a B operation that itself makes a weight's gradient (a
    variable a W operation reads: a fused kernel such as LayerNorm's backward computes the input's and
    the weight's gradients at once). W runs that node again for the weight, from the gradient that
    came into it, so that gradient stays from B to W too."""
    ops = model.profile.operations
    phase_of_entry = ops.phase[entry_op]
    w_entry = phase_of_entry == Phase.BACKWARD_WEIGHT
    made_here = producer[entry_var] == entry_op
    nv = len(model.profile.variables.bytes)
    read_by_w = np.zeros(nv, bool)
    read_by_w[entry_var[w_entry]] = True
    read_by_other_b = np.zeros(nv, bool)
    read_by_other_b[entry_var[(phase_of_entry == Phase.BACKWARD_INPUT) & ~made_here]] = True
    # a weight's gradient: what a B operation makes that only W operations read
    weight_gradient = read_by_w & ~read_by_other_b
    fused = np.zeros(len(ops), bool)
    fused[entry_op[(phase_of_entry == Phase.BACKWARD_INPUT) & made_here & weight_gradient[entry_var]]] = True
    # the weight's gradient such a kernel makes in the capture is not made in B under torch's split
    # backward (autograd asks B for the inputs' gradients only): W makes it when it runs the node again
    made_by_fused = np.zeros(nv, bool)
    made_by_fused[entry_var[made_here & fused[entry_op]]] = True
    out: np.ndarray = (w_entry & ~(made_by_fused[entry_var] & weight_gradient[entry_var])) | (fused[entry_op] & ~made_here)
    return out


def _tied_with_first(model: ModelView) -> np.ndarray | None:
    """``PhaseTable.tied_with_first``: for each ``a`` >= 1, the always-live bytes of variables layer 0
    uses with layers ``a`` or later only (None unless the layers are one stack's blocks: a traced
    pipeline holds a copy per stage)."""
    L = model.num_layers
    if L < 2 or not one_stack(model.layers.module_paths):
        return None
    items = model.var_items
    held = ~model.var_nal & (items.group >= 0)
    nbytes = np.bincount(items.group[held], weights=model.profile.variables.bytes[held],
                         minlength=len(items.group_layers))
    out = np.zeros(L, np.int64)
    for layers, total in zip(items.group_layers, nbytes):
        layers = np.asarray(layers)
        if total and len(layers) > 1 and layers.min() == 0:
            out[1:int(np.sort(layers)[1]) + 1] += int(total)
    return out if out.any() else None


def _freed_at_input_backward(model: ModelView) -> np.ndarray:
    """Per layer ``b``, the stash bytes a split backward's B frees when ``b`` is its chunk's last layer.
    torch's ``stage_backward_input`` keeps, for W, the autograd nodes that use a weight and every node
    their gradients flow on to (toward the inputs), and lets go of the rest when it detaches the chunk's
    output or loss: the nodes only the output's gradient reaches before any weight does (the loss's
    saved log-softmax on the last chunk; in a mixture-of-experts block, the routing weights, the expert
    outputs they scale and the shared expert's gated output, beside branches that do use weights). In
    the capture's backward that is: a layer's B operation is kept when it reads a weight or a gradient a
    kept B operation of the layer made; a stash variable read back only in that layer, by no kept B
    operation and no W operation, is freed at B."""
    L = model.num_layers
    p = model.profile
    ops, v = p.operations, p.variables
    out = np.zeros(L, np.int64)
    if not len(ops):
        return out
    producer = _producers(model)
    op_layer = model.layers.op_layer
    entry_op = np.repeat(np.arange(len(ops)), ops.vars.lengths())
    entry_var = ops.vars.values
    backward = (ops.phase[entry_op] == Phase.BACKWARD_INPUT)
    kept_op = _kept_input_backward(model, producer, entry_op, entry_var)
    made_forward = np.zeros(len(v.bytes), bool)
    known = producer >= 0
    made_forward[known] = ops.phase[producer[known]] == Phase.FORWARD
    # per variable: whether a kept B or any W operation reads it, and the layers its B readers are in
    kept_var = np.zeros(len(v.bytes), bool)
    kept_var[entry_var[(backward & kept_op[entry_op]) | (ops.phase[entry_op] == Phase.BACKWARD_WEIGHT)]] = True
    read_back = np.zeros(len(v.bytes), bool)
    read_back[entry_var[backward]] = True
    low = np.full(len(v.bytes), L, np.int64)
    high = np.full(len(v.bytes), -1, np.int64)
    np.minimum.at(low, entry_var[backward], op_layer[entry_op[backward]])
    np.maximum.at(high, entry_var[backward], op_layer[entry_op[backward]])
    freed = model.var_nal & made_forward & read_back & ~kept_var & (low == high) & (low >= 0)
    np.add.at(out, low[freed], v.bytes[freed].astype(np.int64))
    return out


def _kept_input_backward(model: ModelView, producer: np.ndarray, entry_op: np.ndarray,
                         entry_var: np.ndarray) -> np.ndarray:
    """Per operation, whether it is a B operation torch's split backward keeps for W when its layer
    ends a chunk: one that reads a weight (an always-live variable it did not make: the node uses a
    weight) or a variable another kept B operation of the same layer made (the gradient flows on from
    such a node). An operation that reads no gradient (one a node runs on its saved tensors alone, as
    GELU's backward squares its saved input before the gradient comes in) belongs to the node of the
    operations that read what it makes: kept when one of them is. The backward's first operation (the
    loss's gradient) starts the gradient. Two passes over the backward's own topological order (steps)."""
    ops = model.profile.operations
    op_layer = model.layers.op_layer
    is_b = (ops.phase == Phase.BACKWARD_INPUT) & (op_layer >= 0) & (ops.first_step >= 0)
    in_b = is_b[entry_op]
    kept = np.zeros(len(ops), bool)
    kept[entry_op[in_b & ~model.var_nal[entry_var] & (producer[entry_var] != entry_op)]] = True
    backward = np.flatnonzero((ops.phase == Phase.BACKWARD_INPUT) & (ops.first_step >= 0))
    root = int(backward[np.argmin(ops.first_step[backward])]) if len(backward) else -1
    order = np.flatnonzero(is_b)
    order = order[np.argsort(ops.first_step[order], kind="stable")].tolist()
    offsets = ops.vars.offsets.tolist()
    var_list, producer_list, layer_list = entry_var.tolist(), producer.tolist(), op_layer.tolist()
    is_b_list = (ops.phase == Phase.BACKWARD_INPUT).tolist()
    kept_list = kept.tolist()
    no_gradient = [False] * len(ops)
    for o in order:
        layer = layer_list[o]
        reads_gradient = o == root
        for k in range(offsets[o], offsets[o + 1]):
            maker = producer_list[var_list[k]]
            if maker < 0 or maker == o or not is_b_list[maker]:
                continue
            if not no_gradient[maker]:
                reads_gradient = True
            if kept_list[maker] and layer_list[maker] == layer:
                kept_list[o] = True
        no_gradient[o] = not reads_gradient
    for o in reversed(order):
        if not kept_list[o]:
            continue
        layer = layer_list[o]
        for k in range(offsets[o], offsets[o + 1]):
            maker = producer_list[var_list[k]]
            if maker >= 0 and maker != o and no_gradient[maker] and layer_list[maker] == layer:
                kept_list[maker] = True
    return np.array(kept_list, bool)


def stages_from_modules(model: ModelView) -> bool:
    """Whether a torch-pipelining export builds this model's stages from its modules: its layers are one
    stack's blocks, and its capture did not find that the export traces them instead."""
    grouping = model.profile.info.layer_grouping
    return one_stack(model.layers.module_paths) and not (grouping is not None and grouping.traced_stages)


def cut_bytes(model: ModelView) -> tuple[np.ndarray, np.ndarray]:
    """(L + 1,) bytes crossing each cut forward and backward, as the phase table's ``forward_cut`` and
    ``backward_cut`` (without pricing any range: what a stage's receive buffers hold)."""
    forward, backward, _ = _cut_directions(model)
    return forward, backward


def _cut_directions(model: ModelView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes crossing each cut forward (made before it: activations), backward (made after it:
    gradients), and of the forward ones those no backward reads (not stashed), from the traffic
    model's variables. Where the layers are one stack's blocks, the
    stages are built from the model's modules (exporters/templates/stage_modules.py): each stage
    computes again what the model computes once for all its blocks (the rotary tables, the mask,
    the labels it is given), so only a tensor no more than two neighbouring layers use (the
    hidden state) crosses a cut; the others stay in each chunk's own stash. A model whose stages are
    traced although its layers are one stack's blocks (``LayerGrouping.traced_stages``: BERT, MPNet)
    sends every tensor its layers share across each cut it spans (the export relays it)."""
    from .traffic import layer_traffic
    tr = layer_traffic(model)
    L = model.num_layers
    fwd = np.zeros(L + 1, np.int64)
    bwd = np.zeros(L + 1, np.int64)
    unstashed = np.zeros(L + 1, np.int64)
    stashed = np.asarray(model.var_stashed, bool)[tr.var_index]
    near = tr.var_max_layer - tr.var_min_layer <= 1
    if stages_from_modules(model):
        neighbours = near
    elif one_stack(model.layers.module_paths):
        # traced stages relay what the step's tensors carry between layers (activations and their
        # gradients); a parameter's gradient, state or buffer that layers far apart use (a tied
        # embedding's, a data-parallel layout's unsharded gradient) is each stage's own, never sent
        v = model.profile.variables
        role = np.zeros(len(v.bytes), np.int8) if v.role is None else np.asarray(v.role)
        neighbours = near | np.isin(role[tr.var_index], (ROLES.index("unknown"), ROLES.index("other")))
    else:
        neighbours = np.ones(len(tr.var_bytes), bool)
    for j in range(1, L):
        crosses = (tr.var_min_layer < j) & (j <= tr.var_max_layer) & neighbours
        forward = crosses & (tr.var_producer < j)
        fwd[j] = int(tr.var_bytes[forward].sum())
        bwd[j] = int(tr.var_bytes[crosses & ~forward].sum())
        unstashed[j] = int(tr.var_bytes[forward & ~stashed].sum())
    return fwd, bwd, unstashed


def _op_times(model: ModelView) -> tuple[np.ndarray, str]:
    """Every operation's time: seconds on the chosen target where the roofline gives them, else
    the profile's compute unit; each layer's operations scaled to the layer's total (a layer
    whose compute was given by hand, ``layer_compute``, keeps its operations' shares)."""
    L = model.num_layers
    r = getattr(model, "roofline", None)
    if r is not None:
        per_op, unit = np.asarray(r.op_seconds, float), "seconds"
    else:
        per_op, unit = np.nan_to_num(np.asarray(model.op_compute, float), nan=0.0), model.profile.compute_unit
    lay = model.layers.op_layer
    inside = lay >= 0
    summed = np.bincount(lay[inside], weights=per_op[inside], minlength=L)[:L]
    total = model.layer_time_s if (unit == "seconds" and model.layer_time_s is not None) else \
        (np.asarray(r.layer_seconds) if r is not None else np.nan_to_num(model.layer_compute, nan=0.0))
    scale = np.divide(total, summed, out=np.ones(L), where=summed > 0)
    out = per_op.copy()
    out[inside] *= scale[lay[inside]]
    _share_by_phase(model, out, np.asarray(total, float))
    return out, unit


def _share_by_phase(model: ModelView, per_op: np.ndarray, total: np.ndarray) -> None:
    """Where a layer's figure was given by phase (``layer_phase_share``), its operations of each phase
    scaled, in place, so that they add up to that phase's share of the layer's time (each keeps its
    share of its phase); its operations of no known phase take none: the three parts are the layer."""
    shares = np.asarray(getattr(model, "layer_phase_share", np.empty((0, 3))), float)
    given = np.flatnonzero(~np.isnan(shares).any(axis=1)) if len(shares) else np.empty(0, np.int64)
    if not len(given):
        return
    from .figurephases import figure_phase_of
    lay = np.asarray(model.layers.op_layer)
    phase = figure_phase_of(np.asarray(model.profile.operations.phase))
    for layer in given:
        per_op[(lay == layer) & (phase < 0)] = 0.0
        for k in range(3):
            ops = (lay == layer) & (phase == k)
            summed = per_op[ops].sum()
            if summed > 0:
                per_op[ops] *= shares[layer, k] * total[layer] / summed
            elif ops.any():       # operations the unit does not count (an optimizer's FLOPs): alike
                per_op[ops] = shares[layer, k] * total[layer] / ops.sum()


def _layer_phase_times(model: ModelView, per_op: np.ndarray) -> np.ndarray:
    """(L, 4) forward, B, W and optimizer time of each layer. Recompute counts as B's (it runs
    inside the backward)."""
    L = model.num_layers
    ops = model.profile.operations
    column = np.full(len(ops), -1, np.int64)
    column[ops.phase == Phase.FORWARD] = 0
    column[(ops.phase == Phase.BACKWARD_INPUT) | (ops.phase == Phase.RECOMPUTE)] = 1
    column[ops.phase == Phase.BACKWARD_WEIGHT] = 2
    column[ops.phase == Phase.OPTIMIZER] = 3
    lay = model.layers.op_layer
    keep = (lay >= 0) & (column >= 0)
    times = np.zeros((L, 4))
    np.add.at(times, (lay[keep], column[keep]), per_op[keep])
    # operations of no phase: their time shared out over the layer's phases
    inside = lay >= 0
    total = np.bincount(lay[inside], weights=per_op[inside], minlength=L)[:L]
    summed = times.sum(axis=1)
    result: np.ndarray = times * np.divide(total, summed, out=np.ones(L), where=summed > 0)[:, None]
    return result
