"""Capture a PyTorch training step as a full-form profile, on CPU, without real memory.

One whole training step (forward, loss, backward, optimizer step) runs under
``torch._subclasses.FakeTensorMode``: tensors carry shapes and dtypes but no data, so a
LLaMA-7B-sized step runs on a laptop CPU. A ``TorchDispatchMode`` on top of fake mode sees
every aten operation; each one is one program step. Every tensor storage it meets becomes one
variable: its bytes (rounded like the CUDA caching allocator), the step that allocated it and,
through a weak reference whose callback fires when the storage is freed, the step after which
it died. FLOPs come from ``torch.utils.flop_counter``'s formulas.

What is always live: parameters, buffers, gradients (pipelined training accumulates them over
micro-batches, so the step runs with gradients already allocated, as every micro-batch but the
first does) and optimizer states. Everything else gets its half-open live interval.

Operations are named ``<module path>/aten.<op>`` in the forward pass,
``<module path>/backward/aten.<op>`` in the backward pass (the module whose forward created the
autograd node, found through the node's sequence number) and ``<module path>/optimizer/aten.<op>``
in the optimizer step (the module owning the parameter). The default layer regex then finds the
blocks (``h.N``, ``layers.N``, ``blocks.N``, ``encoder.layer.N``), the first-layer regex the
embeddings and the last-layer regex the head and the loss. An operation none of them places (a
final norm, the root module's own code, positional ids) gets an explicit layer: the block that ran
last before it in the forward pass, or the first block when none has run yet.

A parameter used by several modules (tied embeddings) is one variable, named with all its
names; its gradient and optimizer state are attached to every operation that uses it, so every
stage holding one of those operations counts them, once, as the full form's rules say.

torch is imported here only, lazily: nothing else in stagesplit needs it.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import inspect
import sys
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import StagesplitError

if TYPE_CHECKING:
    from .profile import Profile

OPTIMIZERS = ("adam", "adamw", "sgd", "none")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_TARGET = "a100-80gb"
ALWAYS_KINDS = ("param", "buffer", "grad", "state")
ROOT = "<root>"
LOSS = "loss"
TORCH_MISSING = "stagesplit capture needs PyTorch: pip install 'stagesplit[torch]'"


def _torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise StagesplitError(TORCH_MISSING) from None
    return torch


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


# ------------------------------------------------------------------------------------------------
# The model factory


def load_factory(spec: str) -> Callable[[], Any]:
    """The function ``spec`` names: ``path/to/file.py:function`` or ``package.module:function``."""
    where, sep, func = spec.rpartition(":")
    if not sep or not where or not func.isidentifier():
        raise StagesplitError(f"{spec}: expected MODEL as path/to/file.py:function or package.module:function")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise StagesplitError(f"{spec}: cannot import {where}: no such file")
        name = f"_stagesplit_model_{abs(hash(str(path.resolve())))}"
        sys.path.insert(0, str(path.resolve().parent))    # so the file can import its neighbours
        try:
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module                      # dataclasses need their module registered
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise StagesplitError(f"{spec}: cannot import {where}: {_first_line(exc)}") from None
        finally:
            try:
                sys.path.remove(str(path.resolve().parent))
            except ValueError:
                pass
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise StagesplitError(f"{spec}: cannot import {where}: {_first_line(exc)}") from None
    factory = getattr(module, func, None)
    if factory is None:
        raise StagesplitError(f"{spec}: no function '{func}' in {where}")
    if not callable(factory):
        raise StagesplitError(f"{spec}: '{func}' in {where} is not a function")
    return factory


def call_factory(factory: Callable[[], Any], spec: str):
    """``(model, inputs, loss_fn)`` from the factory, checked."""
    torch = _torch()
    try:
        result = factory()
    except Exception as exc:
        raise StagesplitError(f"{spec}: calling the factory raised {_first_line(exc)}") from None
    return check_model(result, spec, torch)


def check_model(result: Any, spec: str, torch=None):
    torch = torch or _torch()
    shape = "(model, inputs) or (model, inputs, loss_fn)"
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise StagesplitError(f"{spec}: the factory returned {type(result).__name__}; expected {shape}")
    model, inputs = result[0], result[1]
    loss_fn = result[2] if len(result) == 3 else None
    if not isinstance(model, torch.nn.Module):
        raise StagesplitError(f"{spec}: the factory's first item is {type(model).__name__}; expected a "
                              f"torch.nn.Module in {shape}")
    if not isinstance(inputs, (torch.Tensor, tuple, list, dict)):
        raise StagesplitError(f"{spec}: the factory's inputs are {type(inputs).__name__}; expected a tensor, "
                              "a tuple of arguments or a dict of keyword arguments")
    if loss_fn is not None and not callable(loss_fn):
        raise StagesplitError(f"{spec}: the factory's loss_fn is {type(loss_fn).__name__}; expected a callable "
                              "taking the model's output and returning a scalar tensor")
    return model, inputs, loss_fn


# ------------------------------------------------------------------------------------------------
# The recorder


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
    phase: str                     # forward, loss, backward, optimizer
    label: str | None              # module path (None: optimizer op, resolved at the end)
    anchor: int | None             # the forward op whose layer an unplaced op takes
    storages: list[int]
    flops: float
    bytes_accessed: int
    accumulate: bool = False       # autograd accumulating into a parameter's .grad


class _FakeOpError(Exception):
    def __init__(self, func: str, label: str, exc: BaseException):
        super().__init__(f"{func} in {label}")
        self.func, self.label, self.exc = func, label, exc


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


def _make_recorder(torch, allocator_round: int):
    """A TorchDispatchMode class recording ops and storages (built lazily: torch is optional)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    fake_errors = _fake_exception_types(torch)

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
                st = t.untyped_storage()
            except Exception:
                return None
            return self.record(st, kind, label, name, start=0)

        # -- context -------------------------------------------------------------------------
        def context(self, index: int) -> tuple[str | None, int | None]:
            phase = self.state.phase
            if phase == "forward":
                return (self.state.stack[-1] if self.state.stack else ROOT), index
            if phase == "loss":
                return LOSS, index
            if phase == "backward":
                node = torch._C._current_autograd_node()
                if node is None:
                    return LOSS, None
                if node.name().endswith("AccumulateGrad"):
                    self.accumulating = True
                    var = getattr(node, "variable", None)
                    idx = self.param_storage.get(id(var)) if var is not None else None
                    if idx is not None:
                        return self.param_module.get(id(var), ROOT), self.param_first_use.get(idx)
                    return self.last_backward
                found = self.seq_label.get(node._sequence_nr())
                if found is not None:
                    self.last_backward = found
                    return found
                return self.last_backward
            return None, None

        # -- dispatch ------------------------------------------------------------------------
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.state.paused or func.namespace in ("prim", "profiler"):
                return func(*args, **kwargs)
            index = len(self.ops)
            self.now = index + 1
            self.accumulating = False
            label, anchor = self.context(index)
            name = f"{func.namespace}.{func._overloadpacket.__name__}"
            try:
                out = func(*args, **kwargs)
            except fake_errors as exc:
                raise _FakeOpError(name, label or "the optimizer step", exc) from None
            phase = self.state.phase
            if phase in ("forward", "loss"):
                self.seq_label.setdefault(torch._C._autograd._get_sequence_nr() - 1, (label, index))
            flat_in, _ = tree_flatten((args, kwargs))
            flat_out, _ = tree_flatten(out)
            storages: list[int] = []
            moved = 0
            where = label or "optimizer"
            where = f"{where}/backward" if phase == "backward" else where
            tensors = [(t, ":in") for t in flat_in] + [(t, f":out{k}") for k, t in enumerate(flat_out)]
            for t, role in tensors:
                if not isinstance(t, torch.Tensor):
                    continue
                moved += _tensor_bytes(t)
                try:
                    st = t.untyped_storage()
                except Exception:
                    continue
                idx = self.record(st, "activation", where, f"{where}/{name}{role}")
                storages.append(idx)
                if role == ":in" and phase == "forward" and idx in self.param_records:
                    self.param_first_use.setdefault(idx, index)
            flops = 0.0
            counter = flop_registry.get(func._overloadpacket)
            if counter is not None:
                try:
                    flops = float(counter(*args, **kwargs, out_val=out))
                except Exception:
                    flops = 0.0
            self.ops.append(_Op(name, phase, label, anchor, list(dict.fromkeys(storages)), flops, moved,
                                self.accumulating))
            return out

    return Recorder


def _tensor_bytes(t) -> int:
    try:
        return int(t.numel()) * int(t.element_size())
    except Exception:
        return 0


# ------------------------------------------------------------------------------------------------
# Capture


def capture(spec: str, **options) -> "Profile":
    """Capture the training step of the model the factory ``spec`` names (see ``capture_model``)."""
    _torch()
    factory = load_factory(spec)
    model, inputs, loss_fn = call_factory(factory, spec)
    if not options.get("name"):
        where, _, func = spec.rpartition(":")
        stem = Path(where).stem if where.endswith(".py") else where.rpartition(".")[2]
        options["name"] = stem if func == "build" else f"{stem}.{func}"
    return capture_model(model, inputs, loss_fn, source=spec, **options)


def capture_model(model, inputs, loss_fn=None, *, optimizer: str = "adam", dtype: str = "float32",
                  amp: bool = False, target=None, allocator_round: int = 512, name: str | None = None,
                  layer_regex: str | None = None, source: str | None = None) -> "Profile":
    """Record one training step of ``model`` on ``inputs`` (a tensor, a tuple of arguments or a
    dict of keyword arguments) under fake tensors and return it as a full-form Profile.

    ``loss_fn(output)`` gives the loss; without it the loss is the sum of the output (its first
    element if a tuple; its ``.loss``, else ``.logits``, where present). ``optimizer``: adam,
    adamw, sgd (momentum 0.9) or none. ``dtype``: the parameters' and activations' dtype; with
    ``amp`` the parameters, gradients and optimizer states stay float32 and the forward runs
    under ``torch.autocast`` in ``dtype`` (bfloat16 when ``dtype`` is float32). ``target``: a
    Target or a target name or YAML file (default a100-80gb); the profile is one tile holding
    the device's memory. ``allocator_round``: every storage is rounded up to a multiple of this
    many bytes (the CUDA caching allocator's 512; 1 for exact bytes). ``layer_regex``: when
    given, every operation's layer is stored explicitly as this regex (and the rules above) read
    it, so later commands need no --layer-regex."""
    torch = _torch()
    from torch._subclasses import FakeTensorMode
    source = source or "model"
    if optimizer not in OPTIMIZERS:
        raise StagesplitError(f"--optimizer: expected one of {', '.join(OPTIMIZERS)}, got '{optimizer}'")
    if dtype not in DTYPES:
        raise StagesplitError(f"--dtype: expected one of {', '.join(DTYPES)}, got '{dtype}'")
    if int(allocator_round) < 1:
        raise StagesplitError(f"--allocator-round: expected a whole number of bytes >= 1, got {allocator_round}")
    model, inputs, loss_fn = check_model((model, inputs, loss_fn), source, torch)
    tgt = _resolve_target(target)
    layer_options = _layer_options(layer_regex)
    param_dtype = getattr(torch, dtype)
    autocast_dtype = None
    if amp:
        autocast_dtype = param_dtype if dtype != "float32" else torch.bfloat16
        param_dtype = torch.float32

    Recorder = _make_recorder(torch, allocator_round)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    rec = Recorder()
    hooks = []
    restore: list = []
    outputs = loss = opt = None
    fake_inputs = None
    try:
        with fake:
            params = _fake_parameters(torch, model, param_dtype, restore)
            fake_inputs = _fake_inputs(torch, inputs, None if amp else param_dtype)
            for p in params.values():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        _register_model(rec, model, fake_inputs, torch)
        hooks = _module_hooks(rec, model)
        model.train()
        with fake, rec:
            rec.state.phase = "forward"
            try:
                if autocast_dtype is not None:
                    with torch.autocast("cpu", dtype=autocast_dtype):
                        outputs = _call(model, fake_inputs)
                        rec.state.phase = "loss"
                        loss = _loss(torch, outputs, loss_fn)
                else:
                    outputs = _call(model, fake_inputs)
                    rec.state.phase = "loss"
                    loss = _loss(torch, outputs, loss_fn)
            except _FakeOpError:
                raise
            except StagesplitError:
                raise
            except Exception as exc:
                where = rec.state.stack[-1] if rec.state.stack else (LOSS if rec.state.phase == "loss" else ROOT)
                what = "the loss" if rec.state.phase == "loss" else "the model's forward"
                raise StagesplitError(f"{source}: {what} raised {_first_line(exc)} (in {where})") from None
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise StagesplitError(f"{source}: the loss is {_describe(loss)}; expected a tensor with one element "
                                      "(give loss_fn returning a scalar)")
            if not loss.requires_grad:
                raise StagesplitError(f"{source}: the loss does not require grad: the model has no trainable "
                                      "parameters on the path to its output")
            outputs = None
            rec.state.phase = "backward"
            try:
                loss.backward()
            except _FakeOpError:
                raise
            except Exception as exc:
                raise StagesplitError(f"{source}: the backward pass raised {_first_line(exc)}") from None
            loss = None
            if optimizer != "none":
                rec.state.paused = True
                opt = _make_optimizer(torch, optimizer, [p for p in params.values() if p.requires_grad])
                rec.state.paused = False
                rec.state.phase = "optimizer"
                try:
                    opt.step()
                except _FakeOpError:
                    raise
                except Exception as exc:
                    raise StagesplitError(f"{source}: the optimizer step raised {_first_line(exc)}") from None
            rec.state.phase = "done"
            gc.collect()
    except _FakeOpError as exc:
        raise StagesplitError(f"{source}: operation {exc.func} in {exc.label} cannot run under fake tensors "
                              f"({_first_line(exc.exc)}); capture needs shapes that do not depend on tensor "
                              "values") from None
    finally:
        for h in hooks:
            h.remove()
        for table, key, original in restore:            # the caller's model is left as it came
            table[key] = original
    if opt is not None:
        _register_optimizer_state(rec, opt, params)
    if not rec.ops:
        raise StagesplitError(f"{source}: the training step ran no tensor operation")
    return _build_profile(rec, tgt, layer_options, allocator_round, name or type(model).__name__, source,
                          dtype=dtype, amp=amp, optimizer=optimizer, torch_version=torch.__version__,
                          autocast_dtype=autocast_dtype)


def _describe(value) -> str:
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _resolve_target(target):
    from .targets import load_target
    from .profile import Target
    if target is None:
        target = DEFAULT_TARGET
    if not isinstance(target, Target):
        target = load_target(str(target))
    if target.tiles != 1:
        target = replace(target, tiles=1, bytes_per_tile=target.device_bytes)
    return target


def _layer_options(layer_regex: str | None):
    from ..layers import LayerOptions
    return LayerOptions() if layer_regex is None else LayerOptions(layer_regex=layer_regex)


def _fake_parameters(torch, model, param_dtype, restore: list) -> dict[int, Any]:
    """Replace every parameter and buffer by an empty fake tensor of the same shape (tied
    parameters stay tied). Floating-point ones take ``param_dtype``. ``restore`` collects the
    originals, which are put back after the capture."""
    params: dict[int, Any] = {}
    buffers: dict[int, Any] = {}
    for module in model.modules():
        for key, p in list(module._parameters.items()):
            if p is None:
                continue
            restore.append((module._parameters, key, p))
            if id(p) not in params:
                dt = param_dtype if p.is_floating_point() else p.dtype
                t = torch.empty(tuple(p.shape), dtype=dt, device="cpu")
                params[id(p)] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            module._parameters[key] = params[id(p)]
        for key, b in list(module._buffers.items()):
            if b is None:
                continue
            restore.append((module._buffers, key, b))
            if id(b) not in buffers:
                dt = param_dtype if b.is_floating_point() else b.dtype
                buffers[id(b)] = torch.empty(tuple(b.shape), dtype=dt, device="cpu")
            module._buffers[key] = buffers[id(b)]
    return {id(p): p for p in params.values()}


def _fake_inputs(torch, inputs, float_dtype):
    def conv(x):
        if isinstance(x, torch.Tensor):
            dt = float_dtype if (float_dtype is not None and x.is_floating_point()) else x.dtype
            t = torch.empty(tuple(x.shape), dtype=dt, device="cpu")
            return t.requires_grad_(x.requires_grad and t.is_floating_point())
        return x
    if isinstance(inputs, dict):
        return {k: conv(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return tuple(conv(v) for v in inputs)
    return conv(inputs)


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def _loss(torch, outputs, loss_fn):
    if loss_fn is not None:
        return loss_fn(outputs)
    out = outputs
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        if getattr(out, "loss", None) is not None:
            out = out.loss
        elif getattr(out, "logits", None) is not None:
            out = out.logits
    if not isinstance(out, torch.Tensor):
        raise StagesplitError(f"the model's output is {type(outputs).__name__}: give a loss_fn (the factory's third "
                              "item) that turns it into a scalar")
    return out if out.numel() == 1 and out.requires_grad else out.sum()


def _make_optimizer(torch, name: str, params: list):
    """Single-tensor implementations: one op per parameter, so every op belongs to one layer."""
    if name == "adam":
        return torch.optim.Adam(params, foreach=False)
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=False)
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=False)


def _register_model(rec, model, inputs, torch) -> None:
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
            rec.tensor(t, "input", ROOT, f"input[{key}]")


def _register_optimizer_state(rec, opt, params) -> None:
    """Optimizer state tensors are always live and belong to their parameter."""
    by_id = {id(p): p for p in params.values()}
    for p, state in opt.state.items():
        pidx = rec.param_storage.get(id(p))
        if pidx is None or id(p) not in by_id:
            continue
        for key, value in state.items():
            if hasattr(value, "untyped_storage"):
                try:
                    sidx = rec.live.get(id(value.untyped_storage()))
                except Exception:
                    continue
                if sidx is not None:
                    st = rec.storages[sidx]
                    st.kind = "state"
                    st.name = f"{rec.storages[pidx].name.split(' [')[0]}.{key}"
                    st.label = rec.storages[pidx].label
                    rec.param_of_record[sidx] = pidx


def _module_hooks(rec, model) -> list:
    """Keep the stack of running modules (forward only: backward uses sequence numbers)."""
    hooks = []
    for fqn, module in model.named_modules():
        label = fqn or ROOT

        def pre(_m, _args, label=label):
            rec.state.stack.append(label)

        def post(_m, _args, _out, label=label):
            if rec.state.stack and rec.state.stack[-1] == label:
                rec.state.stack.pop()

        hooks.append(module.register_forward_pre_hook(pre))
        hooks.append(module.register_forward_hook(post, always_call=True))
    return hooks


# ------------------------------------------------------------------------------------------------
# Building the profile


def _round(nbytes: int, unit: int) -> int:
    return nbytes if unit <= 1 else -(-nbytes // unit) * unit


def _build_profile(rec, target, layer_options, allocator_round: int, name: str, source: str, *, dtype: str,
                   amp: bool, optimizer: str, torch_version: str, autocast_dtype=None):
    from .builder import ProfileBuilder
    from ..layers import _keys
    from .profile import ProfileInfo
    ops = rec.ops
    S = len(ops)
    layer_re, first_re, last_re, _ = layer_options.compiled()

    # optimizer ops: the parameter they update (the first param/grad/state storage they touch)
    owner: list[int | None] = [None] * S
    for i, op in enumerate(ops):
        if op.phase == "optimizer":
            owner[i] = next((rec.param_of_record[s] for s in op.storages if s in rec.param_of_record), None)
    last = None
    for i in range(S):                      # an op touching no parameter (the step counter) joins the next one's
        if ops[i].phase == "optimizer":
            owner[i] = owner[i] if owner[i] is not None else last
            last = owner[i]
    nxt = None
    for i in reversed(range(S)):
        if ops[i].phase == "optimizer":
            owner[i] = owner[i] if owner[i] is not None else nxt
            nxt = owner[i]

    names: list[str] = []
    anchors: list[int | None] = []
    for i, op in enumerate(ops):
        if op.phase == "optimizer":
            p = owner[i]
            label = rec.storages[p].label if p is not None else ROOT
            anchors.append(rec.param_first_use.get(p) if p is not None else None)
            names.append(f"{label}/optimizer/{op.func}")
        elif op.phase == "backward":
            names.append(f"{op.label}/backward/{op.func}")
            anchors.append(op.anchor)
        else:
            names.append(f"{op.label}/{op.func}")
            anchors.append(op.anchor)

    # explicit layers for what the layer, first-layer and last-layer regexes do not place
    own_key = [None] * S
    for i, n in enumerate(names):
        keys = _keys(layer_re, n)
        if len(keys) == 1:
            own_key[i] = next(iter(keys))
    forward_keys = [own_key[i] for i in range(S) if ops[i].phase == "forward" and own_key[i] is not None]
    warnings: list[str] = []
    layer: list[str | None] = [None] * S
    if forward_keys:
        first_key = forward_keys[0]
        first_seen: dict[str, int] = {}
        for i, k in enumerate(own_key):
            if k is not None:
                first_seen.setdefault(k, i)
        last_key = max(first_seen, key=first_seen.get)
        positional: list[str] = [first_key] * S
        current = first_key
        for i in range(S):
            if ops[i].phase in ("forward", "loss"):
                if own_key[i] is not None:
                    current = own_key[i]
                positional[i] = current
        stamp_all = layer_options.layer_regex != _layer_options(None).layer_regex
        for i, n in enumerate(names):
            if own_key[i] is not None:
                layer[i] = own_key[i] if stamp_all else None
                continue
            if last_re.search(n):
                layer[i] = last_key if stamp_all else None
            elif first_re.search(n):
                layer[i] = first_key if stamp_all else None
            else:
                a = anchors[i]
                layer[i] = positional[a] if a is not None else last_key
    else:
        warnings.append(f"the layer regex '{layer_options.layer_regex}' found no block in the module names "
                        f"(e.g. {names[0]}); pass --layer-regex with a capture group for the block number")

    # A parameter used by several layers (tied embeddings) gets gradient contributions from each;
    # on one device autograd holds the first (the head's) until the last (the embedding's) arrives
    # and sums them. A pipeline keeps one copy of the parameter per stage, each accumulating its
    # own contribution, so the sum's input from another layer is left to that layer alone.
    effective: list[str | None] = list(layer)
    if forward_keys:
        for i, n in enumerate(names):
            if effective[i] is None:
                effective[i] = own_key[i] or (last_key if last_re.search(n) else first_key if first_re.search(n)
                                              else None)
    drop: dict[int, set[int]] = {}
    for op in ops:
        if not op.accumulate:
            continue
        for s in op.storages:
            j = rec.storages[s].start
            if s in rec.param_of_record or not 0 <= j < S or ops[j].phase != "backward" or s not in ops[j].storages:
                continue
            for t in ops[j].storages:
                k = rec.storages[t].start
                if t != s and 0 <= k < j and ops[k].phase == "backward" and effective[k] != effective[j]:
                    drop.setdefault(j, set()).add(t)

    # variables: one per storage
    b = ProfileBuilder(target, S, compute_unit="flops", info=ProfileInfo(
        name=name, source="pytorch",
        description=(f"one training step captured under torch FakeTensorMode on CPU (torch {torch_version}): "
                     f"{'amp (' + str(autocast_dtype).replace('torch.', '') + ' autocast, float32 parameters)' if amp else dtype}, optimizer {optimizer}, "
                     f"storages rounded to {allocator_round} bytes; from {source}"),
        compute_source="FLOPs from torch.utils.flop_counter formulas (matmul, convolution, attention; other "
                       "operations count 0)",
        warnings=warnings))
    var_of: list[int] = []
    for st in rec.storages:
        nbytes = _round(st.nbytes, allocator_round)
        if st.kind in ALWAYS_KINDS:
            var_of.append(b.variable(nbytes, 0, "always", st.name))
        else:
            end = st.end if st.end >= 0 else S
            var_of.append(b.variable(nbytes, 0, [(min(st.start, S), max(end, min(st.start, S)))], st.name))

    # a parameter's gradient and optimizer state go with every op that uses the parameter
    companions: dict[int, list[int]] = {}
    for idx, p in rec.param_of_record.items():
        if idx != p:
            companions.setdefault(p, []).append(idx)
    has_bytes = "bytes_accessed" in inspect.signature(b.operation).parameters
    for i, op in enumerate(ops):
        used = [s for s in op.storages if s not in drop.get(i, ())]
        for s in list(used):
            used.extend(companions.get(s, ()))
        vars_ = sorted({var_of[s] for s in used})
        extra = {"bytes_accessed": op.bytes_accessed} if has_bytes else {}
        b.operation(names[i], i, i, vars=vars_, compute=op.flops, layer=layer[i], **extra)
    return b.build(source=source)


def peak_bytes(profile) -> int:
    """The whole step's peak: always-live bytes plus the largest sum of live intervals."""
    import numpy as np
    v = profile.variables
    always = int(v.bytes[v.always_live].sum())
    S = profile.num_steps
    diff = np.zeros(S + 1, np.int64)
    iv = profile.liveness.intervals
    for var in range(len(v)):
        if v.always_live[var] or v.live_class[var] < 0:
            continue
        for s, e in iv[int(v.live_class[var])]:
            diff[s] += v.bytes[var]
            diff[e] -= v.bytes[var]
    return always + int(np.cumsum(diff)[:S].max(initial=0))


def round_up(nbytes: int, unit: int) -> int:
    """``nbytes`` rounded up to a multiple of ``unit`` (the allocator's granularity)."""
    return _round(int(nbytes), int(unit))


__all__ = ["capture", "capture_model", "load_factory", "peak_bytes", "round_up", "OPTIMIZERS", "DTYPES",
           "TORCH_MISSING"]
