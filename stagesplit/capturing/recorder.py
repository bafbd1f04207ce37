"""The recorder: what one training step does, operation by operation, under fake tensors.

A ``TorchDispatchMode`` on top of ``FakeTensorMode`` sees every aten operation; each one is one
program step. Every tensor storage it meets becomes one record: its bytes, the step that
allocated it and, through a weak reference whose callback fires when the storage is freed, the
step after which it died. An operation's records are the storages it reads and those it writes;
its FLOPs come from ``flops.flop_counter``. Parameters, buffers, gradients, inputs (counted by
storage: a tensor passed twice is one record) and optimizer states are registered as such
(``register_model``, ``register_optimizer_state``).

Each operation is placed where it ran: in the forward pass the innermost running module (module
hooks keep the stack, ``module_hooks``), in the backward the module whose forward created the
autograd node (found through the node's sequence number), a forward re-run inside the backward
(activation checkpointing) as recompute, and an optimizer operation by the parameter it updates
(resolved when the profile is built). Backward operations are split into B and W from the data
flow (``backward_phases``): the gradients autograd hands from one node to the next are the
activations' gradients (``hook_gradients``), and an operation is B when one of its results reaches
one of them. The first failure is noted where it was seen (the operation, or the innermost
module an exception left), so that the error names it.

torch is passed in, never imported at module level (it is an optional extra).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..io.profile import Phase
from .flops import flop_counter
from .runtime import first_line

__all__ = ["ROOT", "LOSS", "FakeOpError", "make_recorder", "hook_gradients", "backward_phases", "register_model",
           "register_optimizer_state", "module_hooks"]

ROOT = "<root>"
LOSS = "loss"


@dataclass
class _Storage:
    nbytes: int
    start: int
    kind: str                      # param, buffer, grad, state, input, activation
    label: str                     # module path running when it was allocated
    name: str
    end: int = -1                  # exclusive; -1 while alive
    ref: Any = None


@dataclass
class _Op:
    func: str                      # aten.mm
    phase: str                     # forward, loss, backward, recompute, optimizer
    label: str | None              # module path (None: optimizer op, resolved at the end)
    anchor: int | None             # the forward op whose layer an unplaced op takes
    storages: list[int]            # read and written, in order, each once
    flops: float
    bytes_accessed: int
    accumulate: bool = False       # autograd accumulating into a parameter's .grad
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()


@dataclass
class _Collective:
    """One collective a rank ran (``_c10d_functional``): the operation it is, its kind
    (all_reduce, all_gather_into_tensor, ...), the bytes of the whole buffer (an all-gather's
    output, a reduction's input), the group's size and the phase it ran in."""

    op: int
    kind: str
    nbytes: int
    group_size: int
    phase: str
    group: str = ""                #: the process group's name (which mesh dimension: the capture maps it)


class FakeOpError(Exception):
    def __init__(self, func: str, label: str, exc: BaseException):
        super().__init__(f"{func} in {label}")
        self.func, self.label, self.exc = func, label, exc


@dataclass
class _Failure:
    """Where an exception was first seen: the operation that raised it, or the innermost module
    whose forward it left (module hooks run as it unwinds, innermost first). The exception is
    known by identity, type and message, never held: its traceback would keep the tensors of
    the frames it left alive (checkpointing stops every re-run with an exception)."""

    key: tuple
    func: str | None = None
    label: str | None = None
    dtypes: tuple = ()

    def of(self, exc: BaseException) -> bool:
        return self.key == _exception_key(exc)


def _exception_key(exc: BaseException) -> tuple:
    return id(exc), type(exc), first_line(exc)


@dataclass
class _State:
    phase: str = "setup"
    stack: list[str] = field(default_factory=list)
    paused: bool = False


def _fake_exception_types(torch) -> tuple[type, ...]:
    from torch._subclasses import fake_tensor
    types = [v for v in vars(fake_tensor).values()
             if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == fake_tensor.__name__]
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
        types.append(GuardOnDataDependentSymNode)
    except ImportError:
        pass
    return tuple(types)


def make_recorder(torch, allocator_round: int):
    """A TorchDispatchMode class recording ops and storages (built lazily: torch is optional)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    fake_errors = _fake_exception_types(torch)
    count_flops = flop_counter(torch)
    from torch._guards import active_fake_mode
    DTensor: Any = None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:                                   # a torch built without distributed
        pass

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.state = _State()
            self.storages: list[_Storage] = []
            self.live: dict[int, int] = {}                 # id(storage) -> record, while alive
            self.ops: list[_Op] = []
            self.now = 0                                   # ops begun
            self.seq_label: dict[int, tuple[str, int]] = {}
            self.param_module: dict[int, str] = {}          # id(param) -> module path
            self.param_storage: dict[int, int] = {}         # id(param) -> record
            self.param_first_use: dict[int, int] = {}       # record -> first forward op using it
            self.param_records: set[int] = set()
            self.param_of_record: dict[int, int] = {}       # record of a param/grad/state -> param record
            self.last_backward: tuple[str, int | None] = (LOSS, None)
            self.accumulating = False
            self.activation_grads: set[int] = set()         # records autograd handed between nodes
            self.derived: set[int] = set()                  # records computed from the inputs (data)
            self.data_ops: set[int] = set()                 # forward ops writing such records
            self.failure: _Failure | None = None
            self.collectives: list[_Collective] = []
            self.fake_mode = None                           # the fake mode the step runs under, when entered

        def __enter__(self):
            self.fake_mode = active_fake_mode()
            return super().__enter__()

        @staticmethod
        def local(t):
            """A DTensor's local shard (what the rank holds), any other tensor itself."""
            return t._local_tensor if DTensor is not None and isinstance(t, DTensor) else t

        # -- storages ------------------------------------------------------------------------
        def record(self, st, kind: str, label: str, name: str, start: int | None = None) -> int:
            key = id(st)
            idx = self.live.get(key)
            if idx is not None:
                rec = self.storages[idx]
                rec.nbytes = max(rec.nbytes, int(st.nbytes()))
                return idx
            idx = len(self.storages)
            rec = _Storage(int(st.nbytes()), self.now - 1 if start is None else start, kind, label, name)
            rec.start = max(rec.start, 0)

            def freed(_ref, idx=idx, key=key):
                r = self.storages[idx]
                if r.end < 0:
                    r.end = max(self.now, r.start + 1)
                if self.live.get(key) == idx:
                    del self.live[key]

            rec.ref = weakref.ref(st, freed)
            self.storages.append(rec)
            self.live[key] = idx
            return idx

        def tensor(self, t, kind: str, label: str, name: str) -> int | None:
            try:
                st = self.local(t).untyped_storage()
            except Exception:
                return None
            return self.record(st, kind, label, name, start=0)

        def gradient_prehook(self, grad_outputs) -> None:
            """Autograd node pre-hook: the gradients handed to a node are activation (or input)
            gradients. Only record indices are kept, never the tensors."""
            for g in grad_outputs:
                if isinstance(g, torch.Tensor):
                    try:
                        idx = self.live.get(id(self.local(g).untyped_storage()))
                    except Exception:
                        idx = None
                    if idx is not None:
                        self.activation_grads.add(idx)

        # -- context -------------------------------------------------------------------------
        def context(self, index: int) -> tuple[str, str | None, int | None]:
            """(phase, module path, anchor) of the operation about to run."""
            phase = self.state.phase
            if phase == "forward":
                return phase, (self.state.stack[-1] if self.state.stack else ROOT), index
            if phase == "loss":
                return phase, LOSS, index
            if phase == "backward":
                node = torch._C._current_autograd_node()
                if node is None:
                    return phase, LOSS, None
                if torch.is_grad_enabled():             # a checkpointed forward re-run to unpack saved tensors
                    found = self.seq_label.get(node._sequence_nr(), self.last_backward)
                    label = self.state.stack[-1] if self.state.stack else found[0]
                    return "recompute", label, found[1]
                if node.name().endswith("AccumulateGrad"):
                    self.accumulating = True
                    var = getattr(node, "variable", None)
                    idx = self.param_storage.get(id(var)) if var is not None else None
                    if idx is not None:
                        return phase, self.param_module.get(id(var), ROOT), self.param_first_use.get(idx)
                    return (phase, *self.last_backward)
                labelled = self.seq_label.get(node._sequence_nr())
                if labelled is not None:
                    self.last_backward = labelled
                    return (phase, *labelled)
                return (phase, *self.last_backward)
            return phase, None, None

        # -- dispatch ------------------------------------------------------------------------
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if DTensor is not None and any(t is DTensor for t in types):
                return NotImplemented       # DTensor runs its local operations, which come back here
            if self.state.paused or func.namespace in ("prim", "profiler") or active_fake_mode() is not self.fake_mode:
                return func(*args, **kwargs)        # (DTensor's sharding propagation runs in a fake mode of its own)
            index = len(self.ops)
            self.now = index + 1
            self.accumulating = False
            phase, label, anchor = self.context(index)
            name = f"{func.namespace}.{func._overloadpacket.__name__}"
            flat_in, _ = tree_flatten((args, kwargs))
            try:
                if func is torch.ops._c10d_functional.wait_tensor.default:
                    out = args[0]           # fake wait_tensor returns a new tensor; a real one returns its input
                else:
                    out = func(*args, **kwargs)
            except fake_errors as exc:
                raise FakeOpError(name, label or "the optimizer step", exc) from None
            except Exception as exc:
                self.failure = _Failure(_exception_key(exc), name, label or "the optimizer step",
                                        tuple(str(t.dtype).replace("torch.", "") for t in flat_in
                                              if isinstance(t, torch.Tensor)))
                raise
            if phase in ("forward", "loss"):
                self.seq_label.setdefault(torch._C._autograd._get_sequence_nr() - 1, (label, index))
            flat_out, _ = tree_flatten(out)
            moved = 0
            where = label or "optimizer"
            where = f"{where}/{phase}" if phase in ("backward", "recompute") else where
            reads: list[int] = []
            writes: list[int] = []
            touches = not _moves_nothing(func, name)
            for tensors, role, into in ((flat_in, None, reads), (flat_out, "out", writes)):
                for k, t in enumerate(tensors):
                    if not isinstance(t, torch.Tensor):
                        continue
                    moved += _tensor_bytes(t) if touches else 0
                    try:
                        st = t.untyped_storage()
                    except Exception:
                        continue
                    idx = self.record(st, "activation", where, f"{where}/{name}:{role}{k}" if role else
                                      f"{where}/{name}:in")
                    into.append(idx)
                    if role is None and phase == "forward" and idx in self.param_records:
                        self.param_first_use.setdefault(idx, index)
            if phase in ("forward", "loss") and any(r in self.derived for r in reads):
                self.derived.update(writes)
                self.data_ops.add(index)
            flops = count_flops(func, args, kwargs, out)
            if func.namespace == "_c10d_functional" and name != "_c10d_functional.wait_tensor":
                self.collectives.append(_collective(torch, index, func, phase, flat_in, flat_out))
            self.ops.append(_Op(name, phase, label, anchor, list(dict.fromkeys(reads + writes)), flops, moved,
                                self.accumulating, tuple(dict.fromkeys(reads)), tuple(dict.fromkeys(writes))))
            return out

    return Recorder


def _collective(torch, index: int, func, phase: str, flat_in: list, flat_out: list) -> _Collective:
    """The record of one functional collective; its group from its ``group_name`` argument."""
    from torch.distributed.distributed_c10d import GroupName, _resolve_process_group
    size = 1
    names = [a for a in flat_in if isinstance(a, str)]
    if names:
        try:
            size = int(_resolve_process_group(GroupName(names[-1])).size())
        except Exception:
            size = 1
    tin = sum(_tensor_bytes(t) for t in flat_in if isinstance(t, torch.Tensor))
    tout = sum(_tensor_bytes(t) for t in flat_out if isinstance(t, torch.Tensor))
    return _Collective(index, func._overloadpacket.__name__, max(tin, tout), size, phase, names[-1] if names else "")


#: operations that allocate without writing (their output's bytes are not moved by any kernel)
_ALLOCATES_ONLY = frozenset({"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
                             "aten.new_empty_strided", "aten.lift_fresh"})


def _moves_nothing(func, name: str) -> bool:
    """Whether an operation moves no bytes through memory: a view (its output aliases its input:
    ``view``, ``t``, ``transpose``, ``expand``, ``detach``, ... as torch's schema marks them, and
    ``_unsafe_view``, which is one without the mark) or an allocation that writes nothing. torch's
    roofline (``utils/_runtime_estimation.py``) prices these at 0 too: held against it, charging a
    view its tensors' bytes was 48% of the example GPT's roofline time (docs/model-and-solver.md)."""
    return bool(getattr(func, "is_view", False)) or name in _ALLOCATES_ONLY or name == "aten._unsafe_view"


def _tensor_bytes(t) -> int:
    try:
        return int(t.numel()) * int(t.element_size())
    except Exception:
        return 0


def hook_gradients(rec, root, params: dict[int, Any]) -> list:
    """Pre-hooks on the autograd nodes reachable from ``root`` whose gradients are those of
    activations (what a forward operation computed from the inputs: not a weight's transpose or
    cast) or of inputs that require grad (a leaf that is not a parameter)."""
    handles = []
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if hasattr(node, "variable"):                    # AccumulateGrad: a leaf
            activation = id(node.variable) not in params
        else:
            found = rec.seq_label.get(node._sequence_nr())
            activation = found is None or found[1] in rec.data_ops
        if activation:
            handles.append(node.register_prehook(rec.gradient_prehook))
        todo.extend(nxt for nxt, _ in node.next_functions)
    return handles


def backward_phases(rec) -> dict[int, Phase]:
    """B or W for every backward operation, walking the backward from its end: an operation is
    B (BACKWARD_INPUT) when it writes a storage that is an activation's gradient or that a B
    operation reads, W (BACKWARD_WEIGHT) when all it writes flows only into parameter gradients."""
    needed = set(rec.activation_grads)
    phases: dict[int, Phase] = {}
    for i in range(len(rec.ops) - 1, -1, -1):
        op = rec.ops[i]
        if op.phase != "backward":
            continue
        if any(s in needed for s in op.writes):
            phases[i] = Phase.BACKWARD_INPUT
            needed.update(op.reads)
        else:
            phases[i] = Phase.BACKWARD_WEIGHT
    return phases



def register_model(rec, model, inputs, torch) -> None:
    """Parameters, buffers, gradients and inputs exist before the step: live from step 0."""
    names: dict[int, list[str]] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(pname)
    seen = set()
    for pname, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        all_names = names[id(p)]
        module = pname.rpartition(".")[0] or ROOT
        shown = all_names[0] + (f" [shared with {', '.join(all_names[1:])}]" if len(all_names) > 1 else "")
        idx = rec.tensor(p, "param", module, shown)
        if idx is None:
            continue
        rec.param_module[id(p)] = module
        rec.param_storage[id(p)] = idx
        rec.param_records.add(idx)
        rec.param_of_record[idx] = idx
        if p.grad is not None:
            g = rec.tensor(p.grad, "grad", module, all_names[0] + ".grad")
            if g is not None:
                rec.param_of_record[g] = idx
    for bname, b in model.named_buffers():
        rec.tensor(b, "buffer", bname.rpartition(".")[0] or ROOT, bname)
    leaves = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, tuple) else [inputs]
    keys = list(inputs.keys()) if isinstance(inputs, dict) else range(len(leaves)) if isinstance(inputs, tuple) else [0]
    for key, t in zip(keys, leaves):
        if isinstance(t, torch.Tensor):
            idx = rec.tensor(t, "input", ROOT, f"input[{key}]")
            if idx is not None:
                rec.derived.add(idx)


def register_optimizer_state(rec, opt, params, owners: dict[int, int] | None = None) -> None:
    """Optimizer state tensors are always live and belong to their parameter (``owners``: the
    parameter, by ``id``, of each tensor the optimizer updates in its place: a master copy)."""
    owners = owners or {}
    for p, state in opt.state.items():
        key = owners.get(id(p), id(p))
        pidx = rec.param_storage.get(key)
        if pidx is None or key not in params:
            continue
        for key, value in state.items():
            if hasattr(value, "untyped_storage"):
                try:
                    sidx = rec.live.get(id(rec.local(value).untyped_storage()))
                except Exception:
                    continue
                if sidx is not None:
                    st = rec.storages[sidx]
                    st.kind = "state"
                    st.name = f"{rec.storages[pidx].name.split(' [')[0]}.{key}"
                    st.label = rec.storages[pidx].label
                    rec.param_of_record[sidx] = pidx


def module_hooks(rec, model) -> list:
    """Keep the stack of running modules (forward and checkpoint re-runs: the backward uses
    sequence numbers), and note the innermost module an exception leaves."""
    hooks = []
    for fqn, module in model.named_modules():
        label = fqn or ROOT

        def pre(_m, _args, label=label):
            rec.state.stack.append(label)

        def post(_m, _args, _out, label=label):
            exc = sys.exc_info()[1]                 # set while an exception unwinds the forward
            if exc is not None and (rec.failure is None or not rec.failure.of(exc)):
                rec.failure = _Failure(_exception_key(exc), label=label)
            if rec.state.stack and rec.state.stack[-1] == label:
                rec.state.stack.pop()

        hooks.append(module.register_forward_pre_hook(pre))
        hooks.append(module.register_forward_hook(post, always_call=True))
    return hooks
