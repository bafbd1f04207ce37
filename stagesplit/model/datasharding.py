"""One data-parallel rank's profile: a one-device profile under DDP or ZeRO-1/2/3 (FSDP2).

Data parallelism replicates the step on ``dp`` ranks, each with its own micro-batch; what a rank
holds depends on how parameters, gradients and optimizer state are sharded. The rules, read from
torch's DDP and FSDP2 sources and written out with their reasons in docs/layouts.md, are:

* ``zero 0`` (DDP, ``gradient_as_bucket_view=False``): everything replicated, plus the reducer's
  gradient buckets: flat tensors, allocated when DDP is built and kept, holding a copy of every
  gradient (all-reduced in them, then copied back to ``.grad``). Modelled as one always-live
  variable per layer of that layer's gradient bytes.
* ``zero 1`` (optimizer state sharded: Megatron's distributed optimizer, DeepSpeed stage 1): each
  optimizer-state tensor, and every temporary of the optimizer step, becomes ``ceil(bytes/dp)``;
  scalar step counters (state named ``*.step``) stay whole, as torch's Adam keeps one per tensor.
* ``zero 2`` (gradients too): each gradient becomes ``ceil(bytes/dp)`` all step, and the layer's
  full gradients exist only while its backward runs (from its first backward operation to its
  last, when they are reduce-scattered and freed).
* ``zero 3`` (parameters too, FSDP2's ``fully_shard`` with one group per layer of the profile;
  parameters used by several layers, such as tied embeddings, belong to the root group, which is
  unsharded from the first operation to the end of the backward, as torch leaves the root):
  parameters, gradients and state ``ceil(bytes/dp)`` all step, plus per group ``g`` of ``P`` bytes
  of parameters: its unsharded parameters (``P``, during its forward and its backward; with
  ``reshard_after_forward`` off, all step), its all-gather output (``P``: in the forward from its
  forward's start to the next group's, kept for the overlap of the next all-gather; in the
  backward from the prefetch at the start of the next group's backward to its own start), its
  unsharded gradients (``P``, during its backward) and its reduce-scatter input (``P``, from the
  end of its backward to the end of the next group's, torch keeping one such buffer in flight).

With float32 master weights (a profile captured in that precision, ``precision.master_weights``),
``zero 3`` is FSDP2's mixed precision (``MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)``, torchtitan's default, Megatron's ``--use-torch-fsdp2 --bf16``): its sharded
parameter is the float32 master, so a parameter that has a master keeps no low-precision shard;
the groups' unsharded parameters and all-gathers are the low-precision ones, as captured, and so
are their unsharded gradients (autograd writes a gradient in its parameter's dtype: half the
captured float32 gradient's bytes), cast to float32 for the reduce-scatter (its input the float32
gradients' bytes).

``ceil(bytes/dp)`` is rank 0's share, the largest: FSDP2 pads each parameter's first dimension to a
multiple of ``dp``, so rank 0 holds ``ceil(rows/dp)`` rows (exact for the bytes when ``dp`` divides
the rows). A profile whose parameters, gradients and state are all multiples of 512 bytes was
captured rounded as the CUDA caching allocator rounds (``stagesplit capture``'s default): each
share is an allocation of its own, rounded up to 512 again. The rules need the variables' roles (the PyTorch capture records them) and, for
``zero`` 2 and 3, the operations' phases; a profile without them is refused with a one-line
error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError, ProfileError
from ..io.profile import ROLES, Liveness, Operations, Phase, Profile, Ragged, Variables
from ..layers import LayerAssignment

__all__ = ["ALLOCATOR_UNIT", "DataLayout", "ZERO_STAGES", "kept_unsharded", "parameter_bytes_by_layer", "role_bytes",
           "shard_profile", "zero_share"]

#: what each ZeRO stage shards, in words (the plan's text uses these)
ZERO_STAGES = {0: "DDP: parameters, gradients and optimizer state replicated, gradient buckets",
               1: "ZeRO-1: optimizer state sharded",
               2: "ZeRO-2: optimizer state and gradients sharded",
               3: "ZeRO-3 (FSDP2, one group per layer): parameters, gradients and optimizer state sharded"}

_PARAM, _GRAD, _STATE, _OTHER = (ROLES.index(r) for r in ("param", "grad", "state", "other"))
_ROOT = -2                          # the group of parameters used by several layers


@dataclass(frozen=True)
class DataLayout:
    """How the step is replicated: ``dp`` data-parallel ranks, the ZeRO stage, and whether FSDP2
    frees a group's unsharded parameters after its forward (``zero`` 3 only)."""

    dp: int = 1
    zero: int = 0
    reshard_after_forward: bool = True
    #: the step runs under torch's pipeline runtime (a schedule of micro-batches): an FSDP stage keeps
    #: its parameters and gradients unsharded, and its gradients unsynchronised, from its first backward
    #: until every micro-batch is done (torch.distributed.pipelining's stage.py: set_reshard_after_backward
    #: and set_requires_gradient_sync off but for the last, then perform_reduce_grad)
    pipelined: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.dp, bool) or not isinstance(self.dp, int) or self.dp < 1:
            raise OptionError("dp", f"expected an integer >= 1 (data-parallel ranks), got {self.dp!r}")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise OptionError("zero", f"expected one of 0, 1, 2, 3, got {self.zero!r}")
        if self.zero and self.dp < 2:
            raise OptionError("zero", f"ZeRO {self.zero} shards across data-parallel ranks: give dp >= 2 with it")

    @property
    def sharded(self) -> bool:
        """Whether a rank's figures differ from the one-device profile's."""
        return self.dp > 1

    def describe(self) -> str:
        """One line for the plan's text."""
        if not self.sharded:
            return "no data parallelism"
        extra = ""
        if self.zero >= 2 and self.pipelined:
            extra = (" (under the pipeline's micro-batches torch accumulates the gradients whole until the last "
                     "backward: priced as held all step, beside their shards)")
        elif self.zero == 3:
            extra = ", reshard after forward" if self.reshard_after_forward else ", no reshard after forward"
        elif self.zero in (1, 2):
            extra = " (rules composed from Megatron's and DeepSpeed's documented behaviour, not measured)"
        return f"{self.dp} data-parallel ranks, {ZERO_STAGES[self.zero]}{extra}; figures per rank"


def role_bytes(profile: Profile) -> dict[str, int]:
    """Always-live bytes by role (``unknown`` where not recorded), and ``transient``: the bytes of
    the variables that are not always live, summed (what ``breakdown`` shows per layout)."""
    v = profile.variables
    role = np.zeros(len(v), np.int8) if v.role is None else np.asarray(v.role)
    out = {name: int(v.bytes[v.always_live & (role == k)].sum()) for k, name in enumerate(ROLES)}
    out["transient"] = int(v.bytes[~v.always_live].sum())
    return out


def _outside_to_root(profile: Profile, layers: LayerAssignment, role: np.ndarray, group: np.ndarray) -> None:
    """A parameter (its gradient, its state) of a layer with a module path but named outside it
    (an embedding or final norm grouped with the first or last block) is left to the root
    group, as ``fully_shard`` on the layer's module would leave it."""
    paths = layers.module_paths
    if not paths:
        return
    names = profile.names
    for i in np.flatnonzero(np.isin(role, (_PARAM, _GRAD, _STATE)) & (group >= 0)):
        path = paths[int(group[i])] if int(group[i]) < len(paths) else None
        if path is None or profile.variables.name[i] < 0:
            continue
        if not names[int(profile.variables.name[i])].startswith(path + "."):
            group[i] = _ROOT


#: the CUDA caching allocator's unit: a profile whose parameters, gradients and state are all
#: multiples of it was captured rounded to it, and a shard is an allocation of its own
ALLOCATOR_UNIT = 512


def _share(nbytes: np.ndarray, dp: int, unit: int = 1) -> np.ndarray:
    share = -(-np.asarray(nbytes, np.int64) // dp)
    return -(-share // unit) * unit


class _Additions:
    """New variables: bytes, intervals, name, role, and the operations that use them."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, list[tuple[int, int]] | None, str, np.ndarray, int]] = []

    def add(self, nbytes: int, intervals: list[tuple[int, int]] | None, name: str, ops: np.ndarray,
            role: int = _OTHER) -> None:
        """``intervals`` None: always live. Empty intervals are dropped; nothing of 0 bytes is added.
        ``role``: what the variable is (``ROLES``), given for those live part of the step (an unsharded
        gradient, FSDP's parameters): no stage of a pipeline sends them (model/phases.py); the
        always-live additions stay ``other``, as ``role_bytes`` has always counted them."""
        if nbytes <= 0:
            return
        if intervals is not None:
            intervals = _merge([iv for iv in intervals if iv[1] > iv[0]])
            if not intervals:
                return
        self.rows.append((int(nbytes), intervals, name, ops, role if intervals is not None else _OTHER))


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _variable_groups(profile: Profile, layers: LayerAssignment, role: np.ndarray, pipelined: bool = False) -> np.ndarray:
    """Each variable's FSDP group: the one layer whose operations use it, _ROOT for several (and
    for parameters of a layer named outside its module, but under a pipeline, where each stage is a
    root of its own and the export shards every module holding parameters on its own: there they
    go with their layer), -1 for none."""
    v, ops = profile.variables, profile.operations
    op_of = ops.vars.row_ids()
    var_ids = ops.vars.values.astype(np.int64)
    op_layer = np.asarray(layers.op_layer, np.int64)
    used_layer = op_layer[op_of]
    has = used_layer >= 0
    low = np.full(len(v), np.iinfo(np.int64).max)
    high = np.full(len(v), -1, np.int64)
    np.minimum.at(low, var_ids[has], used_layer[has])
    np.maximum.at(high, var_ids[has], used_layer[has])
    group: np.ndarray = np.where(high < 0, -1, np.where(low == high, high, _ROOT))
    if not pipelined:
        _outside_to_root(profile, layers, role, group)
    return group


def zero_share(roles: Mapping[str, Any], ranks: int, zero: int) -> Any:
    """One rank's share of the parameters, gradients and optimizer state of ``roles`` (bytes by role,
    numbers or per-layer arrays) where ZeRO ``zero`` shards them over ``ranks``: state from stage 1,
    gradients from 2, parameters at 3 (the real shares round up: a floor)."""
    return (roles["param"] / (ranks if zero >= 3 else 1) + roles["grad"] / (ranks if zero >= 2 else 1)
            + roles["state"] / (ranks if zero >= 1 else 1))


def always_live_by_layer(profile: Profile, layers: LayerAssignment) -> dict[str, np.ndarray]:
    """Each layer's always-live bytes by role (``param``, ``grad``, ``state``, and ``other`` for the
    rest): the variables only that layer's operations use, which a pipeline's stage holding the layer
    holds (as a pipeline groups them: a parameter named outside its layer's module goes with it).
    Those several layers use are left out: a lower bound on what any stage of the layers holds."""
    v = profile.variables
    role = np.zeros(len(v), np.int8) if v.role is None else np.asarray(v.role)
    group = _variable_groups(profile, layers, role, pipelined=True)
    mine = v.always_live & (group >= 0)
    out = {}
    for name, kinds in (("param", (_PARAM,)), ("grad", (_GRAD,)), ("state", (_STATE,))):
        keep = mine & np.isin(role, kinds)
        out[name] = np.bincount(group[keep], weights=v.bytes[keep].astype(np.float64), minlength=layers.num_layers)
    rest = mine & ~np.isin(role, (_PARAM, _GRAD, _STATE))
    out["other"] = np.bincount(group[rest], weights=v.bytes[rest].astype(np.float64), minlength=layers.num_layers)
    return {k: a[:layers.num_layers] for k, a in out.items()}


def parameter_bytes_by_layer(profile: Profile, layers: LayerAssignment) -> tuple[np.ndarray, int]:
    """Each layer's parameter bytes (its FSDP group's, what its gradients all-reduce moves) and
    the root group's (parameters used by several layers, or named outside their layer's
    module): what the communication model prices a stage's gradient synchronisation from."""
    v = profile.variables
    if v.role is None:
        where = profile.info.path or profile.info.name or "the profile"
        raise ProfileError(where, "variables.role", "the roles of its variables (parameter, gradient, optimizer "
                           "state) to price gradient synchronisation; capture it again with this version")
    role = np.asarray(v.role)
    group = _variable_groups(profile, layers, role)
    out = np.zeros(layers.num_layers, np.int64)
    pl = (role == _PARAM) & (group >= 0)
    np.add.at(out, group[pl], v.bytes[pl].astype(np.int64))
    root = int(v.bytes[(role == _PARAM) & (group == _ROOT)].sum())
    return out, root


def shard_profile(profile: Profile, layers: LayerAssignment, layout: DataLayout) -> Profile:
    """The profile one data-parallel rank (rank 0, the largest share) runs under ``layout``: the
    same operations and steps, its variables' bytes sharded and the runtime's buffers added as
    variables of the layer they belong to (module docstring). ``profile`` itself is unchanged."""
    if not layout.sharded:
        return profile
    v = profile.variables
    where = profile.info.path or profile.info.name or "the profile"
    if v.role is None or not np.any(np.isin(v.role, (_PARAM, _GRAD, _STATE))):
        raise ProfileError(where, "variables.role", "the roles of its variables (parameter, gradient, optimizer "
                           "state) to shard them across data-parallel ranks; capture it again with this version")
    ops = profile.operations
    if layout.zero >= 2 and not np.any(ops.phase != Phase.UNKNOWN):
        raise ProfileError(where, "operations.phase", f"the operations' phases (forward, backward) for ZeRO "
                           f"{layout.zero}'s gradient and parameter buffers")
    role = np.asarray(v.role)
    dp = layout.dp
    nbytes = v.bytes.astype(np.int64).copy()
    add = _Additions()

    group = _variable_groups(profile, layers, role, layout.pipelined)
    op_of = ops.vars.row_ids()
    var_ids = ops.vars.values.astype(np.int64)

    step_names = np.asarray(profile.names, dtype=object) if profile.names else np.zeros(0, dtype=object)
    names = v.name
    is_step = np.zeros(len(v), bool)
    state_idx = np.flatnonzero(role == _STATE)
    for i in state_idx:
        if names[i] >= 0 and str(step_names[names[i]]).endswith(".step"):
            is_step[i] = True

    L = layers.num_layers
    ops_of_layer = [layers.ops_in(k) for k in range(L)]
    grad_of_layer = np.zeros(L, np.int64)
    param_of_layer = np.zeros(L, np.int64)
    gl = (role == _GRAD) & (group >= 0)
    np.add.at(grad_of_layer, group[gl], nbytes[gl])
    pl = (role == _PARAM) & (group >= 0)
    np.add.at(param_of_layer, group[pl], nbytes[pl])

    if layout.zero == 0:
        for k in range(L):
            add.add(int(grad_of_layer[k]), None, f"ddp/gradient buckets/{layers.names[k]}", ops_of_layer[k])
        shared = np.flatnonzero((role == _GRAD) & (group == _ROOT))
        add.add(int(nbytes[shared].sum()), None, "ddp/gradient buckets/shared parameters", _ops_using(profile, shared))
        return _rebuild(profile, nbytes, add)

    # zero >= 1: optimizer state (not the step counters) and the optimizer step's temporaries
    state = (role == _STATE) & ~is_step
    held = v.bytes[np.isin(role, (_PARAM, _GRAD, _STATE)) & v.always_live]
    unit = ALLOCATOR_UNIT if len(held) and not np.any(held % ALLOCATOR_UNIT) else 1
    nbytes[state] = _share(nbytes[state], dp, unit)
    optimizer_only = _optimizer_temporaries(profile)
    nbytes[optimizer_only] = _share(nbytes[optimizer_only], dp, unit)
    if layout.zero == 1:
        return _rebuild(profile, nbytes, add)
    if layout.pipelined:
        # torch's pipeline runtime accumulates each gradient whole and unsynchronised until the last
        # micro-batch (then reduce-scatters it): the whole gradients stay as they are, held all step, and
        # each layer holds its gradient shard beside them
        for k in range(L):
            add.add(int(_share(np.array([grad_of_layer[k]]), dp, unit)[0]), None, f"gradient shards/{layers.names[k]}",
                    ops_of_layer[k])
        shared = np.flatnonzero((role == _GRAD) & (group == _ROOT))
        add.add(int(_share(nbytes[shared], dp, unit).sum()), None, "gradient shards/shared parameters",
                _ops_using(profile, shared))
        if layout.zero == 2:
            return _rebuild(profile, nbytes, add)
        bounds = _layer_bounds(profile, layers)
        params = role == _PARAM
        nbytes[params] = _share(nbytes[params], dp, unit)
        nbytes[_with_masters(profile, params)] = 0
        _fsdp_buffers(profile, layers, layout, bounds, param_of_layer, v.bytes[params & (group == _ROOT)].sum(),
                      _ops_using(profile, np.flatnonzero(params & (group == _ROOT))), ops_of_layer, add)
        return _rebuild(profile, nbytes, add)
    bounds = _layer_bounds(profile, layers)
    grads = role == _GRAD
    nbytes[grads] = _share(nbytes[grads], dp, unit)
    # FSDP2's mixed precision (ZeRO 3 with master weights): the captured gradients are the float32 ones;
    # autograd writes each in its parameter's dtype (half the bytes), cast to float32 to reduce-scatter
    autograd_ratio = 2 if layout.zero == 3 and _master_weights(profile) else 1
    # each full gradient from the step autograd first writes it (an accumulation: a backward
    # operation using the gradient and no parameter) to the end of its group's backward
    first = _first_accumulation(profile, role, op_of, var_ids)
    for i in np.flatnonzero(grads & (group != -1)):
        g = int(group[i])
        if g >= 0:
            if bounds.b1[g] < 0:
                continue
            start, end, users = int(bounds.b0[g]), int(bounds.b1[g]) + 1, ops_of_layer[g]
        else:
            users = _ops_using(profile, np.array([i]))
            start, end = _first_backward_step(profile, users), bounds.backward_end
        if first[i] >= 0:
            start = max(start, int(first[i])) if g >= 0 else int(first[i])
        label = profile.names[int(v.name[i])] if v.name[i] >= 0 else f"var#{i}"
        add.add(int(v.bytes[i]) // autograd_ratio, [(start, max(end, start + 1))], f"unsharded gradients/{label}", users,
                _GRAD)
    if layout.zero == 2:
        return _rebuild(profile, nbytes, add)

    params = role == _PARAM
    nbytes[params] = _share(nbytes[params], dp, unit)
    nbytes[_with_masters(profile, params)] = 0
    _fsdp_buffers(profile, layers, layout, bounds, param_of_layer, v.bytes[params & (group == _ROOT)].sum(),
                  _ops_using(profile, np.flatnonzero(params & (group == _ROOT))), ops_of_layer, add,
                  grad_of_layer if autograd_ratio > 1 else None)
    return _rebuild(profile, nbytes, add)


def _master_weights(profile: Profile) -> bool:
    """Whether the profile was captured with float32 master weights (``precision.master_weights``)."""
    precision = profile.info.precision
    return precision is not None and precision.master_weights


def _with_masters(profile: Profile, params: np.ndarray) -> np.ndarray:
    """The parameters (of mask ``params``) that have a float32 master copy (a state named after them,
    ``NAME.master``) in a profile captured with master weights: FSDP2's mixed precision shards the
    float32 parameter itself, and holds no low-precision shard of it."""
    out = np.zeros(len(params), bool)
    if not _master_weights(profile):
        return out
    v = profile.variables
    assert v.role is not None                     # shard_profile refuses a profile without roles
    names = profile.names
    masters = {names[n][:-len(".master")] for n in v.name[np.asarray(v.role) == _STATE]
               if n >= 0 and names[n].endswith(".master")}
    for i in np.flatnonzero(params):
        n = int(v.name[i])
        out[i] = n >= 0 and names[n].split(" [")[0] in masters
    return out


@dataclass
class _Bounds:
    """Each layer's first and last forward and backward steps (where FSDP2's buffers live)."""

    f0: np.ndarray          # per layer: first and last forward step (-1: none)
    f1: np.ndarray
    b0: np.ndarray          # first and last backward step (B, W or recompute; -1: none)
    b1: np.ndarray
    forward_start: int
    forward_end: int        # one past the last forward step
    backward_start: int
    backward_end: int       # one past the last backward step


def _layer_bounds(profile: Profile, layers: LayerAssignment) -> _Bounds:
    ops = profile.operations
    L = layers.num_layers
    big = np.iinfo(np.int64).max
    f0, b0 = np.full(L, big), np.full(L, big)
    f1, b1 = np.full(L, -1, np.int64), np.full(L, -1, np.int64)
    layer = np.asarray(layers.op_layer, np.int64).copy()
    # a layer with a module path runs as an FSDP group where its module runs: its operations named
    # inside the module (not the embedding, head or loss grouped with the first or last block)
    for k, path in enumerate(layers.module_paths or ()):
        if path is None:
            continue
        mine = np.flatnonzero(layer == k)
        outside = [i for i in mine if not ops.name[i].startswith((path + "/", path + "."))]
        if len(outside) < len(mine):
            layer[outside] = -1
    known = ops.first_step >= 0
    phase = np.asarray(ops.phase)
    fwd = known & (phase == Phase.FORWARD)
    bwd = known & np.isin(phase, (Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT, Phase.RECOMPUTE))
    for mask, lo, hi in ((fwd, f0, f1), (bwd, b0, b1)):
        m = mask & (layer >= 0)
        np.minimum.at(lo, layer[m], ops.first_step[m])
        np.maximum.at(hi, layer[m], ops.last_step[m])
    f0[f0 == big] = -1
    b0[b0 == big] = -1
    forward = ops.first_step[fwd]
    backward = ops.first_step[bwd]
    return _Bounds(f0, f1, b0, b1,
                   int(forward.min()) if len(forward) else 0, int(ops.last_step[fwd].max()) + 1 if len(forward) else 0,
                   int(backward.min()) if len(backward) else 0,
                   int(ops.last_step[bwd].max()) + 1 if len(backward) else 0)


def _ops_using(profile: Profile, variables: np.ndarray) -> np.ndarray:
    ops = profile.operations
    hit = np.isin(ops.vars.values, variables)
    return np.unique(ops.vars.row_ids()[hit])


def _first_accumulation(profile: Profile, role: np.ndarray, op_of: np.ndarray, var_ids: np.ndarray) -> np.ndarray:
    """Per variable: the first step of a backward operation that uses it and no parameter (-1: none)."""
    ops = profile.operations
    with_param = np.zeros(len(ops), bool)
    with_param[op_of[role[var_ids] == _PARAM]] = True
    phase = np.asarray(ops.phase)
    backward = np.isin(phase, (Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT)) & ~with_param & (ops.first_step >= 0)
    hit = backward[op_of] & (role[var_ids] == _GRAD)
    first = np.full(len(profile.variables), np.iinfo(np.int64).max)
    np.minimum.at(first, var_ids[hit], ops.first_step[op_of[hit]])
    first[first == np.iinfo(np.int64).max] = -1
    return first


def _first_backward_step(profile: Profile, op_ids: np.ndarray) -> int:
    ops = profile.operations
    phase = np.asarray(ops.phase)[op_ids]
    back = op_ids[np.isin(phase, (Phase.BACKWARD_INPUT, Phase.BACKWARD_WEIGHT)) & (ops.first_step[op_ids] >= 0)]
    return int(ops.first_step[back].min()) if len(back) else 0


def _optimizer_temporaries(profile: Profile) -> np.ndarray:
    """Variables, not always live, used only by optimizer operations: the optimizer works on the
    rank's shard, so its temporaries shrink with the state."""
    ops = profile.operations
    v = profile.variables
    opt = np.asarray(ops.phase) == Phase.OPTIMIZER
    rows = ops.vars.row_ids()
    by_opt = np.zeros(len(v), bool)
    by_other = np.zeros(len(v), bool)
    by_opt[ops.vars.values[opt[rows]]] = True
    by_other[ops.vars.values[~opt[rows]]] = True
    out: np.ndarray = by_opt & ~by_other & ~v.always_live
    return out


def _fsdp_buffers(profile: Profile, layers: LayerAssignment, layout: DataLayout, bounds: _Bounds,
                  param_of_layer: np.ndarray, root_params: int, root_ops: np.ndarray,
                  ops_of_layer: list[np.ndarray], add: _Additions, reduced_of_layer: np.ndarray | None = None) -> None:
    """FSDP2's unsharded parameters, all-gather outputs and reduce-scatter inputs, per group; each
    reduce-scatter input is ``reduced_of_layer``'s bytes where given (the float32 gradients of mixed
    precision), else the parameters' (a gradient has its parameter's dtype)."""
    groups = [k for k in range(layers.num_layers) if param_of_layer[k] > 0 and bounds.f0[k] >= 0]
    groups.sort(key=lambda k: int(bounds.f0[k]))
    has_root = root_params > 0
    end = max(bounds.backward_end, bounds.forward_end)
    if has_root:                        # the root: unsharded from its pre-forward to its post-backward
        first_group = int(bounds.f0[groups[0]]) if groups else bounds.forward_end
        add.add(int(root_params), [(bounds.forward_start, end)], "fsdp/unsharded parameters/shared parameters", root_ops,
                _PARAM)
        add.add(int(root_params), [(bounds.forward_start, max(first_group, bounds.forward_start + 1))],
                "fsdp/all-gather/shared parameters", root_ops, _PARAM)
    for i, k in enumerate(groups):
        name = layers.names[k]
        P = int(param_of_layer[k])
        f0, f1, b0, b1 = (int(x) for x in (bounds.f0[k], bounds.f1[k], bounds.b0[k], bounds.b1[k]))
        nxt = groups[i + 1] if i + 1 < len(groups) else None
        prev = groups[i - 1] if i > 0 else None
        ops_k = ops_of_layer[k]
        # unsharded parameters
        if layout.reshard_after_forward and b0 >= 0:
            add.add(P, [(f0, f1 + 1), (b0, b1 + 1)], f"fsdp/unsharded parameters/{name}", ops_k, _PARAM)
        else:                           # held from the forward to the backward: across micro-batches too
            add.add(P, None, f"fsdp/unsharded parameters/{name}", ops_k)
        # all-gather output in the forward: freed at the next group's copy-out
        fwd_end = int(bounds.f0[nxt]) if nxt is not None else bounds.forward_end
        intervals = [(f0, max(fwd_end, f0 + 1))]
        if layout.reshard_after_forward and b0 >= 0:
            # in the backward: prefetched when the group after it (in forward order) starts its
            # backward (by the root for the last group), freed at its own copy-out
            if nxt is not None and bounds.b0[nxt] >= 0:
                start = int(bounds.b0[nxt])
            else:
                start = bounds.backward_start if has_root else b0
            intervals.append((min(start, b0), b0))        # its copy-out at b0 frees it
        add.add(P, intervals, f"fsdp/all-gather/{name}", ops_k, _PARAM)
        # reduce-scatter input: from the end of its backward to the end of the next group's
        if b1 >= 0:
            until = int(bounds.b1[prev]) + 1 if prev is not None and bounds.b1[prev] >= 0 else bounds.backward_end
            reduced = int(reduced_of_layer[k]) if reduced_of_layer is not None else P
            add.add(reduced, [(b1 + 1, until)], f"fsdp/reduce-scatter/{name}", ops_k, _GRAD)


def kept_unsharded(profile: Profile, layers: LayerAssignment, layout: DataLayout | None) -> np.ndarray | None:
    """Per layer, the parameter bytes FSDP2 leaves unsharded after each backward under a pipeline
    schedule, until the layer's next forward reshards them (None where nothing is so kept).

    torch's pipeline runtime turns ``reshard_after_backward`` off for every backward of a stage
    (``stage.py``, ``backward_maybe_with_nosync``), and reshards only once the last micro-batch is
    done; a forward's ``post_forward`` still reshards each group after it (``reshard_after_forward``).
    So a chunk's groups stay whole from the end of its backward to its next forward: measured on the
    exported pipeline (tests/exporters/test_export_tensor_parallel.py). ``profile`` is the
    one-device profile (whole parameter bytes); without resharding after the forward the
    parameters are held whole all step already."""
    if layout is None or not (layout.pipelined and layout.zero == 3 and layout.reshard_after_forward):
        return None
    v = profile.variables
    if v.role is None:
        return None
    role = np.asarray(v.role)
    group = _variable_groups(profile, layers, role, pipelined=True)
    out = np.zeros(layers.num_layers, np.int64)
    pl = (role == _PARAM) & (group >= 0)
    np.add.at(out, group[pl], v.bytes[pl].astype(np.int64))
    return out


def _rebuild(profile: Profile, nbytes: np.ndarray, add: _Additions) -> Profile:
    """A copy of ``profile`` with variable bytes ``nbytes`` and the added variables."""
    v = profile.variables
    names = list(profile.names)
    intervals = profile.liveness.intervals
    n0, k0 = len(v), len(intervals)
    new_bytes, new_always, new_class, new_name = [], [], [], []
    new_intervals: list[list[tuple[int, int]]] = []
    extra_ops: list[np.ndarray] = []
    extra_vars: list[np.ndarray] = []
    new_role = [row[4] for row in add.rows]
    for j, (b, lives, name, op_ids, _) in enumerate(add.rows):
        new_bytes.append(b)
        new_always.append(lives is None)
        if lives is None:
            new_class.append(-1)
        else:
            new_class.append(k0 + len(new_intervals))
            new_intervals.append(lives)
        new_name.append(len(names))
        names.append(name)
        ids = np.asarray(op_ids, np.int64).reshape(-1)
        extra_ops.append(ids)
        extra_vars.append(np.full(len(ids), n0 + j, np.int64))
    # the added classes after the profile's own, in the same CSR form
    added = Ragged.from_lists(new_intervals, dtype=np.int64, width=2)
    liveness = Liveness(Ragged(np.concatenate([intervals.offsets, intervals.offsets[-1] + added.offsets[1:]]),
                               np.concatenate([np.asarray(intervals.values, np.int64).reshape(-1, 2), added.values])))
    role = np.asarray(v.role, np.int8) if v.role is not None else np.zeros(n0, np.int8)
    variables = Variables(
        bytes=np.concatenate([nbytes, np.asarray(new_bytes, np.int64)]),
        tile=np.concatenate([v.tile, np.zeros(len(new_bytes), v.tile.dtype)]),
        always_live=np.concatenate([v.always_live, np.asarray(new_always, bool)]),
        live_class=np.concatenate([v.live_class, np.asarray(new_class, np.int64)]).astype(np.int64),
        name=np.concatenate([v.name, np.asarray(new_name, np.int64)]).astype(np.int64),
        role=np.concatenate([role, np.asarray(new_role, np.int8)]))
    ops = profile.operations
    extra_op = np.concatenate(extra_ops) if extra_ops else np.zeros(0, np.int64)
    if len(extra_op):                   # each operation's variables, then the ones added for it in their order
        extra_var = np.concatenate(extra_vars)
        keys = np.concatenate([ops.vars.row_ids(), extra_op])
        order = np.argsort(keys, kind="stable")
        values = np.concatenate([ops.vars.values.astype(np.int64), extra_var])[order]
        offsets = np.zeros(len(ops) + 1, np.int64)
        np.cumsum(np.bincount(keys, minlength=len(ops)), out=offsets[1:])
        vars_ = Ragged(offsets, values)
    else:
        vars_ = ops.vars
    operations = Operations(name=ops.name, debug_id=ops.debug_id, inputs=ops.inputs, first_step=ops.first_step,
                            last_step=ops.last_step, vars=vars_, programs=ops.programs, compute=ops.compute,
                            layer=ops.layer, bytes_accessed=ops.bytes_accessed, phase=ops.phase)
    out = Profile(target=profile.target, steps=profile.steps, names=names, variables=variables, liveness=liveness,
                  programs=profile.programs, operations=operations, compute_unit=profile.compute_unit,
                  ground_truth=None, info=profile.info)
    return out.validate(profile.info.path)
