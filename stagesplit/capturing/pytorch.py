"""Capture a PyTorch training step as a full-form profile, on CPU, without real memory.

One whole training step (forward, loss, backward, optimizer step) runs under
``torch._subclasses.FakeTensorMode``: tensors carry shapes and dtypes but no data, so a
LLaMA-7B-sized step runs on a laptop CPU. A ``TorchDispatchMode`` on top of fake mode sees
every aten operation; each one is one program step. Every tensor storage it meets becomes one
variable: its bytes (rounded like the CUDA caching allocator), the step that allocated it and,
through a weak reference whose callback fires when the storage is freed, the step after which
it died. An operation's variables are the storages it reads and those it writes. FLOPs come
from ``torch.utils.flop_counter``'s formulas, and from this module's own for the attention and
grouped or batched matrix kernels torch has none for (``FLOP_FORMULAS``).

What is always live: parameters, buffers, gradients (pipelined training accumulates them over
micro-batches, so the step runs with gradients already allocated, as every micro-batch but the
first does) and optimizer states. Everything else gets its half-open live interval. Inputs are
counted by storage: a tensor passed twice (``labels`` that is ``input_ids``) is one variable.

Operations are named ``<module path>/aten.<op>`` in the forward pass,
``<module path>/backward/aten.<op>`` in the backward pass (the module whose forward created the
autograd node, found through the node's sequence number), ``<module path>/recompute/aten.<op>``
for forward operations that activation checkpointing re-runs inside the backward, and
``<module path>/optimizer/aten.<op>`` in the optimizer step (the module owning the parameter).
Every operation has a ``Phase``: forward and loss FORWARD, optimizer OPTIMIZER, re-run forward
RECOMPUTE, and in the backward BACKWARD_WEIGHT when what it writes flows only into parameter
gradients, else BACKWARD_INPUT (found from the data flow: the gradients autograd hands from one
node to the next are the activations' gradients, and an operation is B when one of its results
reaches one of them).

Layers are the repeated blocks of the model's module stacks: every ``nn.ModuleList`` or
``nn.Sequential`` whose children are all of one class (outermost first: a stack inside a block is
part of the block; a block that only wraps a stack gives way to that stack's blocks, unless the
outer stack's blocks are identical, where frameworks split), in the order they first run, named
by their module path (the child's index when there is one stack: ``transformer.h.3`` is layer
``3``; the path past the stacks' common prefix when there are several: ``encoder.block.3``,
``decoder.block.0``). Each operation belongs
to the block whose module runs it; one outside every block (embeddings, a final norm, the head,
the loss, the root module's own code) to the block that ran last before it in the forward pass,
or the first block when none has run yet, which is where a pipeline split at a block's beginning
puts it. A model without such stacks is grouped by the default layer regex; ``layer_regex``
groups by the user's regex instead. The grouping (the regexes that read it from the operation
names and each layer's module path) is recorded in the profile (``ProfileInfo.layer_grouping``)
for every later command.

A parameter used by several modules (tied embeddings) is one variable, named with all its
names; its gradient and optimizer state are attached to every operation that uses it, so every
stage holding one of those operations counts them, once, as the full form's rules say.

torch is imported here only, lazily: nothing else in stagesplit needs it. Its compile caches go
to a private temporary folder removed when the process exits, and its logging and warnings are
silenced while a capture runs (``torch_logs=True``, the command line's ``--debug``, shows them).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.util
import inspect
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import StagesplitError
from ..layers import LayerOptions, group_layers, layer_keys
from ..io.profile import LayerGrouping, Phase, Profile, ProfileInfo, Target

OPTIMIZERS = ("adam", "adamw", "sgd", "none")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_TARGET = "a100-80gb"
ALWAYS_KINDS = ("param", "buffer", "grad", "state")
ROOT = "<root>"
LOSS = "loss"
TORCH_MISSING = ("stagesplit capture needs PyTorch: pip install 'stagesplit[torch]' (from a checkout of stagesplit: "
                 "pip install '.[torch]')")
#: the environment variables naming torch's on-disk caches (inductor's is made when torch._dynamo is imported)
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def _torch():
    _private_caches()
    try:
        import torch  # noqa: F401
    except ImportError:
        raise StagesplitError(TORCH_MISSING) from None
    return torch


_cache_folder: list[str] = []


def _private_caches() -> None:
    """Point torch's caches that the user has not placed at a private temporary folder, removed
    when the process exits (torch makes ``$TMPDIR/torchinductor_<user>`` on import otherwise)."""
    if _cache_folder or all(os.environ.get(name) for name in CACHE_VARIABLES):
        return
    folder = tempfile.mkdtemp(prefix="stagesplit-torch-")
    _cache_folder.append(folder)
    for name in CACHE_VARIABLES:
        if not os.environ.get(name):
            os.environ[name] = os.path.join(folder, name.split("_")[0].lower())
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


@contextlib.contextmanager
def _quiet(show: bool) -> Iterator[None]:
    """Silence logging and warnings while the model runs (torch logs a traceback per failed fake
    kernel before the one-line error; models warn about options that do not matter here)."""
    if show:
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def _as_a_real_run() -> Iterator[None]:
    """Make the data-dependent choices a model makes from its inputs' values as a real run makes
    them for ordinary inputs. Under fake tensors, transformers' ``find_packed_sequence_indices``
    cannot read the position ids and assumes packed sequences: it builds an explicit attention
    mask, which makes grouped-query attention repeat the keys and values - tensors a real step
    never holds (a Llama block held 8% more for backward). A capture is of one sequence per batch
    row, as the position ids transformers makes itself say."""
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


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
        except (Exception, SystemExit) as exc:           # sys.exit() in the file is its failure, not ours
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
        except (Exception, SystemExit) as exc:
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
    except (Exception, SystemExit) as exc:               # Ctrl-C (KeyboardInterrupt) still interrupts
        raise StagesplitError(f"{spec}: calling the factory raised {_first_line(exc)}; expected it to return "
                              "(model, inputs) or (model, inputs, loss_fn)") from None
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
# FLOP formulas for kernels torch.utils.flop_counter has none for


def _mm(m: int, k: int, n: int) -> int:
    """A matrix product (m x k) @ (k x n): one multiply and one add per term, as torch counts."""
    return 2 * m * k * n


def _attention(q: tuple, k: tuple, v: tuple) -> int:
    """Scores q @ k^T and output scores @ v, for (batch, heads, sequence, head dim) shapes; keys
    and values may have fewer heads (grouped-query attention: they are shared, not fewer FLOPs)."""
    b, h, s_q, d = q[-4:] if len(q) >= 4 else (1, *q[-3:])
    s_k, d_v = k[-2], v[-1]
    return _mm(b * h * s_q, d, s_k) + _mm(b * h * s_q, s_k, d_v)


def _attention_backward(grad: tuple, q: tuple, k: tuple, v: tuple) -> int:
    """Fused attention's backward: the scores recomputed, then the gradients of the scores,
    values, queries and keys (five products, as torch counts its fused kernels)."""
    b, h, s_q, d = q[-4:] if len(q) >= 4 else (1, *q[-3:])
    s_k, d_v = k[-2], v[-1]
    n = b * h
    return (_mm(n * s_q, d, s_k) + _mm(n * s_q, d_v, s_k) + _mm(n * s_k, s_q, d_v) + _mm(n * s_q, s_k, d)
            + _mm(n * d, s_q, s_k))


def _shape(t) -> tuple:
    return tuple(int(x) for x in t.shape)


def _grouped_mm(a, b, *_args, **_kwargs) -> int:
    """``_grouped_mm``/``_scaled_grouped_mm``: every row of ``a`` meets its group's matrix once
    (a 2-d x 3-d product: the experts of a mixture), a batch of products (3-d x 3-d), or the
    groups split the inner or outer dimension (2-d x 2-d, 3-d x 2-d: the weight gradients).
    The offsets are data, unknown under fake tensors: every row is counted in a group."""
    sa, sb = _shape(a), _shape(b)
    if len(sa) == 2 and len(sb) == 3:
        return _mm(sa[0], sa[1], sb[2])
    if len(sa) == 3 and len(sb) == 3:
        return sa[0] * _mm(sa[1], sa[2], sb[2])
    if len(sa) == 2 and len(sb) == 2:
        return _mm(sa[0], sa[1], sb[1])
    if len(sa) == 3 and len(sb) == 2:
        return _mm(sa[1], sa[2], sb[1])
    raise ValueError(f"grouped mm of shapes {sa} and {sb}")


def _native_mha(query, key, value, embed_dim, num_head, *_args, **_kwargs) -> int:
    """nn.MultiheadAttention's fused path: q, k, v projections, attention, output projection."""
    e, h = int(embed_dim), int(num_head)
    sq, sk = _shape(query), _shape(key)
    b = sq[0] if len(sq) == 3 else 1
    l_q, l_k = sq[-2], sk[-2]
    return (_mm(b * l_q, e, e) + 2 * _mm(b * l_k, e, e) + _attention((b, h, l_q, e // h), (b, h, l_k, e // h),
                                                                     (b, h, l_k, e // h)) + _mm(b * l_q, e, e))


def _formula_table(torch) -> dict:
    """``{OpOverloadPacket: flops(*args, out_val=..., **kwargs)}`` for the attention and matrix
    kernels capture can meet that ``torch.utils.flop_counter`` leaves at 0 (CPU and accelerator
    names, forward and backward; a name this torch lacks is skipped)."""
    def attention(q, k, v, *_a, **_k):
        return _attention(_shape(q), _shape(k), _shape(v))

    def attention_backward(grad, q, k, v, *_a, **_k):
        return _attention_backward(_shape(grad), _shape(q), _shape(k), _shape(v))

    def flash_inplace(out, q, k, v, *_a, **_k):          # (out, query, key, value, ...), flash layout (b, s, h, d)
        return _attention(_bhsd(q), _bhsd(k), _bhsd(v))

    def _bhsd(t):
        s = _shape(t)
        return (s[0], s[2], s[1], s[3]) if len(s) == 4 else (1, s[1], s[0], s[2])

    def mm(a, b, *_a, **_k):
        sa, sb = _shape(a), _shape(b)
        return _mm(sa[0], sa[1], sb[-1])

    def addmm(_self, a, b, *_a, **_k):
        return mm(a, b)

    def addbmm(_self, b1, b2, *_a, **_k):
        s1, s2 = _shape(b1), _shape(b2)
        return s1[0] * _mm(s1[1], s1[2], s2[2])

    def mv(m, v, *_a, **_k):
        rows, cols = _shape(m)
        return _mm(rows, cols, 1)

    def addmv(_self, m, v, *_a, **_k):
        return mv(m, v)

    def dot(a, b, *_a, **_k):
        return _mm(1, _shape(a)[0], 1)

    def addr(_self, v1, v2, *_a, **_k):
        return _mm(_shape(v1)[0], 1, _shape(v2)[0])

    def int8pack(a, b, *_a, **_k):                         # the weight is (N, K)
        sa = _shape(a)
        return _mm(sa[0], sa[1], _shape(b)[0])

    def packed(a, _b, *_a, out_val=None, **_k):             # packed weights: N from the output
        sa = _shape(a)
        return _mm(sa[0], sa[1], _shape(out_val)[-1])

    def dyn_quant(inp, _w, _block, in_features, out_features, *_a, **_k):
        rows = 1
        for x in _shape(inp)[:-1]:
            rows *= x
        return _mm(rows, int(in_features), int(out_features))

    def foreach_mm(xs, ys, *_a, **_k):
        return sum(mm(a, b) for a, b in zip(xs, ys))

    table = {
        "_scaled_dot_product_flash_attention_for_cpu": attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward": attention_backward,
        "_scaled_dot_product_fused_attention_overrideable": attention,
        "_scaled_dot_product_fused_attention_overrideable_backward": attention_backward,
        "_scaled_dot_product_attention_math_for_mps": attention,
        "_flash_attention_forward_no_dropout_inplace": flash_inplace,
        "_native_multi_head_attention": _native_mha,
        "_grouped_mm": _grouped_mm,
        "_scaled_grouped_mm": _grouped_mm,
        "addbmm": addbmm,
        "mv": mv,
        "addmv": addmv,
        "dot": dot,
        "vdot": dot,
        "addr": addr,
        "_int_mm": mm,
        "_addmm_activation": addmm,
        "_scaled_mm_v2": mm,
        "_weight_int8pack_mm": int8pack,
        "_weight_int4pack_mm": packed,
        "_weight_int4pack_mm_for_cpu": packed,
        "_weight_int4pack_mm_with_scales_and_zeros": packed,
        "_dyn_quant_matmul_4bit": dyn_quant,
        "_foreach_mm": foreach_mm,
    }
    out = {}
    for name, formula in table.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            out[packet] = formula
    return out


#: the kernels ``_formula_table`` counts (documentation and tests)
FLOP_FORMULAS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
                 "_scaled_dot_product_fused_attention_overrideable",
                 "_scaled_dot_product_fused_attention_overrideable_backward",
                 "_scaled_dot_product_attention_math_for_mps", "_flash_attention_forward_no_dropout_inplace",
                 "_native_multi_head_attention", "_grouped_mm", "_scaled_grouped_mm", "addbmm", "mv", "addmv", "dot",
                 "vdot", "addr", "_int_mm", "_addmm_activation", "_scaled_mm_v2", "_weight_int8pack_mm",
                 "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu", "_weight_int4pack_mm_with_scales_and_zeros",
                 "_dyn_quant_matmul_4bit", "_foreach_mm")


def flop_counter(torch) -> Callable[..., float]:
    """``count(func, args, kwargs, out)``: the FLOPs of one aten call, from this module's formulas
    or torch's (0 for kernels neither knows)."""
    from torch.utils.flop_counter import flop_registry
    own = _formula_table(torch)

    def count(func, args, kwargs, out) -> float:
        packet = func._overloadpacket
        formula = own.get(packet)
        if formula is None:
            formula = flop_registry.get(packet)
        if formula is None:
            return 0.0
        try:
            return float(formula(*args, **kwargs, out_val=out))
        except Exception:
            return 0.0
    return count


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
    phase: str                     # forward, loss, backward, recompute, optimizer
    label: str | None              # module path (None: optimizer op, resolved at the end)
    anchor: int | None             # the forward op whose layer an unplaced op takes
    storages: list[int]            # read and written, in order, each once
    flops: float
    bytes_accessed: int
    accumulate: bool = False       # autograd accumulating into a parameter's .grad
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()


class _FakeOpError(Exception):
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
    return id(exc), type(exc), _first_line(exc)


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

    fake_errors = _fake_exception_types(torch)
    count_flops = flop_counter(torch)

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

        def gradient_prehook(self, grad_outputs) -> None:
            """Autograd node pre-hook: the gradients handed to a node are activation (or input)
            gradients. Only record indices are kept, never the tensors."""
            for g in grad_outputs:
                if isinstance(g, torch.Tensor):
                    try:
                        idx = self.live.get(id(g.untyped_storage()))
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
                found = self.seq_label.get(node._sequence_nr())
                if found is not None:
                    self.last_backward = found
                    return (phase, *found)
                return (phase, *self.last_backward)
            return phase, None, None

        # -- dispatch ------------------------------------------------------------------------
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.state.paused or func.namespace in ("prim", "profiler"):
                return func(*args, **kwargs)
            index = len(self.ops)
            self.now = index + 1
            self.accumulating = False
            phase, label, anchor = self.context(index)
            name = f"{func.namespace}.{func._overloadpacket.__name__}"
            flat_in, _ = tree_flatten((args, kwargs))
            try:
                out = func(*args, **kwargs)
            except fake_errors as exc:
                raise _FakeOpError(name, label or "the optimizer step", exc) from None
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
            for tensors, role, into in ((flat_in, None, reads), (flat_out, "out", writes)):
                for k, t in enumerate(tensors):
                    if not isinstance(t, torch.Tensor):
                        continue
                    moved += _tensor_bytes(t)
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
            self.ops.append(_Op(name, phase, label, anchor, list(dict.fromkeys(reads + writes)), flops, moved,
                                self.accumulating, tuple(dict.fromkeys(reads)), tuple(dict.fromkeys(writes))))
            return out

    return Recorder


def _tensor_bytes(t) -> int:
    try:
        return int(t.numel()) * int(t.element_size())
    except Exception:
        return 0


def _hook_gradients(rec, root, params: dict[int, Any]) -> list:
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


def _backward_phases(rec) -> dict[int, Phase]:
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


# ------------------------------------------------------------------------------------------------
# The model's module tree: its stacks of repeated blocks


@dataclass(frozen=True)
class ModuleStack:
    """An ``nn.ModuleList`` or ``nn.Sequential`` whose children are all of one class: the blocks
    a pipeline splits between. ``path`` is "" for the root module."""

    path: str
    children: tuple[str, ...]

    @property
    def blocks(self) -> tuple[str, ...]:
        return tuple(f"{self.path}.{c}" if self.path else c for c in self.children)


def module_stacks(torch, model) -> list[ModuleStack]:
    """The model's stacks of repeated blocks, outermost first: a stack inside another stack's
    block belongs to that block (a mixture's experts inside a decoder layer), unless the block
    only wraps that stack (its one child is the stack, or wraps it the same way: a ResNet stage
    around its bottleneck blocks), when the inner stack's blocks replace it. A stack of two or
    more identical blocks (``_block_signature``: the same modules, parameters and buffers) is
    kept whatever its blocks wrap: it is the model's repeated unit, where frameworks split (six
    blocks each holding a list of two linears are six layers, not twelve), while a ResNet's
    stages differ in depth and width. A ModuleList of one block counts (a one-layer
    configuration); a Sequential needs two (one is a wrapper)."""
    containers = (torch.nn.ModuleList, torch.nn.Sequential)

    def stack_at(path: str, module) -> ModuleStack | None:
        if not isinstance(module, containers):
            return None
        children = list(module.named_children())
        least = 1 if isinstance(module, torch.nn.ModuleList) else 2
        if len(children) < least or len({type(child) for _, child in children}) != 1:
            return None
        return ModuleStack(path, tuple(name for name, _ in children))

    def wrapped(path: str, module) -> ModuleStack | None:
        """The stack a block only wraps: down a chain of single children."""
        children = list(module.named_children())
        while len(children) == 1:
            name, module = children[0]
            path = f"{path}.{name}"
            stack = stack_at(path, module)
            if stack is not None:
                return stack
            children = list(module.named_children())
        return None

    modules = dict(model.named_modules())

    def expand(stack: ModuleStack) -> list[ModuleStack]:
        blocks = [modules[block] for block in stack.blocks]
        if len(blocks) > 1 and len({_block_signature(block) for block in blocks}) == 1:
            return [stack]
        kept: list[str] = []
        inner: list[ModuleStack] = []
        for child, block in zip(stack.children, stack.blocks):
            nested = wrapped(block, modules[block])
            if nested is not None:
                inner.extend(expand(nested))
            else:
                kept.append(child)
        return ([ModuleStack(stack.path, tuple(kept))] if kept else []) + inner

    stacks: list[ModuleStack] = []
    claimed: set[str] = set()
    for path, module in model.named_modules():
        if _inside(path, claimed):
            continue
        stack = stack_at(path, module)
        if stack is not None:
            stacks.extend(expand(stack))
            claimed.update(stack.blocks)
    return stacks


def _block_signature(module) -> tuple:
    """What makes two blocks the same block: every module under it (relative path and class),
    and every parameter's and buffer's relative name, shape and dtype."""
    def tensors(items) -> tuple:
        return tuple((name, tuple(t.shape), t.dtype) for name, t in items if t is not None)
    return (tuple((name, type(m)) for name, m in module.named_modules()), tensors(module.named_parameters()),
            tensors(module.named_buffers()))


def _inside(path: str, blocks: set[str]) -> bool:
    parts = path.split(".") if path else []
    return any(".".join(parts[:k]) in blocks for k in range(1, len(parts) + 1))


def _block_names(stacks: list[ModuleStack]) -> dict[str, str]:
    """Block module path -> layer name: the child's name for one stack, the path past the stacks'
    common dotted prefix for several (``encoder.block.3``)."""
    if len(stacks) == 1:
        return {block: child for block, child in zip(stacks[0].blocks, stacks[0].children)}
    common = _common_prefix([s.path for s in stacks])
    cut = len(common) + 1 if common else 0
    return {block: block[cut:] for s in stacks for block in s.blocks}


def _common_prefix(paths: list[str]) -> str:
    split = [p.split(".") if p else [] for p in paths]
    prefix: list[str] = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return ".".join(prefix)


def _tree_regex(stacks: list[ModuleStack]) -> str:
    """A layer regex that reads the module-tree grouping back from the operation names."""
    def child(children: tuple[str, ...]) -> str:
        return r"\d+" if all(c.isdigit() for c in children) else r"[^./]+"
    if len(stacks) == 1:
        s = stacks[0]
        lead = re.escape(s.path) + r"\." if s.path else ""
        return f"^{lead}({child(s.children)})[./]"
    common = _common_prefix([s.path for s in stacks])
    cut = len(common) + 1 if common else 0
    alternatives = "|".join(f"{re.escape(s.path[cut:])}\\.{child(s.children)}" if s.path[cut:] else child(s.children)
                            for s in stacks)
    lead = re.escape(common) + r"\." if common else ""
    return f"^{lead}((?:{alternatives}))[./]"


def _sequential_hint(torch, model) -> str:
    """A --layer-regex to suggest when no stack or default-regex block was found: the children
    of the outermost nn.Sequential or nn.ModuleList with several children."""
    for path, module in model.named_modules():
        if isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList)) and len(module) > 1:
            lead = re.escape(path) + r"\." if path else ""
            children = [name for name, _ in module.named_children()]
            group = r"\d+" if all(c.isdigit() for c in children) else r"[^./]+"
            what = f"the {type(module).__name__} {path or '(the model itself)'}"
            return f"; pass --layer-regex '^{lead}({group})[./]' to make each of the {len(children)} children of {what} a layer"
    return "; pass --layer-regex with a capture group for the block number"


# ------------------------------------------------------------------------------------------------
# Capture


def capture(spec: str, **options) -> "Profile":
    """Capture the training step of the model the factory ``spec`` names (see ``capture_model``)."""
    _torch()
    factory = load_factory(spec)
    with _quiet(bool(options.get("torch_logs"))):
        model, inputs, loss_fn = call_factory(factory, spec)
    if not options.get("name"):
        where, _, func = spec.rpartition(":")
        stem = Path(where).stem if where.endswith(".py") else where.rpartition(".")[2]
        options["name"] = stem if func == "build" else f"{stem}.{func}"
    return capture_model(model, inputs, loss_fn, source=spec, **options)


def capture_model(model, inputs, loss_fn=None, *, optimizer: str = "adam", dtype: str = "float32",
                  amp: bool = False, target=None, allocator_round: int = 512, name: str | None = None,
                  layer_regex: str | None = None, source: str | None = None, torch_logs: bool = False) -> "Profile":
    """Record one training step of ``model`` on ``inputs`` (a tensor, a tuple of arguments or a
    dict of keyword arguments) under fake tensors and return it as a full-form Profile.

    ``loss_fn(output)`` gives the loss; without it the loss is the sum of the output (its first
    element if a tuple; its ``.loss``, else ``.logits``, where present). ``optimizer``: adam,
    adamw, sgd (momentum 0.9) or none. ``dtype``: the parameters' and activations' dtype; with
    ``amp`` the parameters, gradients and optimizer states stay float32 and the forward runs
    under ``torch.autocast`` in ``dtype`` (bfloat16 when ``dtype`` is float32). ``target``: a
    Target or a target name or YAML file (default a100-80gb); the profile is one tile holding
    the device's memory. ``allocator_round``: every storage is rounded up to a multiple of this
    many bytes (the CUDA caching allocator's 512; 1 for exact bytes). ``layer_regex``: group by
    this regex instead of the module tree's stacks (every operation's layer is then stored
    explicitly). The grouping is recorded in the profile, so later commands need no
    --layer-regex. ``torch_logs``: let torch's (and the model's) logging and warnings through."""
    torch = _torch()
    with _quiet(torch_logs):
        return _capture(torch, model, inputs, loss_fn, optimizer=optimizer, dtype=dtype, amp=amp, target=target,
                        allocator_round=allocator_round, name=name, layer_regex=layer_regex, source=source)


def _capture(torch, model, inputs, loss_fn, *, optimizer: str, dtype: str, amp: bool, target, allocator_round: int,
             name: str | None, layer_regex: str | None, source: str | None) -> "Profile":
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
    layer_options = LayerOptions(layer_regex=layer_regex) if layer_regex is not None else None
    if layer_options is not None:
        layer_options.compiled()                         # a bad regex fails before the model runs
    param_dtype = getattr(torch, dtype)
    autocast_dtype = None
    if amp:
        autocast_dtype = param_dtype if dtype != "float32" else torch.bfloat16
        param_dtype = torch.float32
    stacks = module_stacks(torch, model)

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
        with fake, rec, _as_a_real_run():
            rec.state.phase = "forward"
            try:
                if autocast_dtype is not None:
                    with torch.autocast("cpu", dtype=autocast_dtype):
                        outputs = _call(model, fake_inputs)
                        rec.state.phase = "loss"
                        loss = _loss(torch, outputs, loss_fn, source)
                else:
                    outputs = _call(model, fake_inputs)
                    rec.state.phase = "loss"
                    loss = _loss(torch, outputs, loss_fn, source)
            except _FakeOpError:
                raise
            except StagesplitError:
                raise
            except (Exception, SystemExit) as exc:
                what = "the loss" if rec.state.phase == "loss" else "the model's forward"
                where = LOSS if rec.state.phase == "loss" else ROOT
                raise StagesplitError(f"{source}: {what} raised {_failure_text(rec, exc, where, dtype)}") from None
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise StagesplitError(f"{source}: the loss is {_describe(loss)}; expected a tensor with one element "
                                      "(give loss_fn returning a scalar)")
            if not loss.requires_grad:
                raise StagesplitError(f"{source}: the loss does not require grad: the model has no trainable "
                                      "parameters on the path to its output")
            outputs = None
            gradient_hooks = _hook_gradients(rec, loss.grad_fn, params) if loss.grad_fn is not None else []
            rec.state.phase = "backward"
            try:
                loss.backward()
            except _FakeOpError:
                raise
            except (Exception, SystemExit) as exc:
                raise StagesplitError(f"{source}: the backward pass raised "
                                      f"{_failure_text(rec, exc, 'the backward', dtype)}") from None
            finally:
                for handle in gradient_hooks:
                    handle.remove()
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
                except (Exception, SystemExit) as exc:
                    raise StagesplitError(f"{source}: the optimizer step raised "
                                          f"{_failure_text(rec, exc, 'the optimizer step', dtype)}") from None
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
                          autocast_dtype=autocast_dtype, stacks=stacks, hint=_sequential_hint(torch, model))


def _failure_text(rec, exc: BaseException, where: str, dtype: str) -> str:
    """``ValueError: boom (in layers.1.inner)``: the exception with the operation that raised it
    or the innermost module it left, and a remedy where one is known."""
    failure = rec.failure if rec.failure is not None and rec.failure.of(exc) else None
    if failure is None:
        return f"{_first_line(exc)} (in {where})"
    if failure.func is None:
        return f"{_first_line(exc)} (in {failure.label})"
    text = f"{_first_line(exc)} (operation {failure.func} in {failure.label})"
    if failure.func.endswith("grouped_mm") and "float32" in failure.dtypes:
        text = (f"{_first_line(exc)} (operation {failure.func} in {failure.label}: torch's fake kernel for "
                f"grouped matrix products takes bfloat16 inputs only; capture with --dtype bfloat16)")
    return text


def _describe(value) -> str:
    """What a value is, in a message: "a tensor of shape (2, 3)", "None", "a str"."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if value is None:
        return "None"
    return f"a {type(value).__name__}"


def _resolve_target(target):
    from ..io.targets import load_target
    if target is None:
        target = DEFAULT_TARGET
    if not isinstance(target, Target):
        target = load_target(str(target))
    if target.tiles != 1:
        target = replace(target, tiles=1, bytes_per_tile=target.device_bytes)
    return target


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
    """Empty fake tensors of the inputs' shapes, counted by storage: a tensor passed twice is
    one tensor, and tensors sharing a storage (views of one batch) stay views of one storage."""
    made: dict[int, Any] = {}
    bases: dict[tuple[int, Any], Any] = {}          # (the storage's C++ identity, dtype) -> fake base
    held: list[Any] = []                             # the storages keyed on, alive until the end

    def conv(x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) in made:
            return made[id(x)]
        dt = float_dtype if (float_dtype is not None and x.is_floating_point()) else x.dtype
        if x.requires_grad:                          # a leaf of its own
            t = torch.empty(tuple(x.shape), dtype=dt, device="cpu")
            t.requires_grad_(t.is_floating_point())
        else:
            st = x.untyped_storage()
            held.append(st)
            key = (st._cdata, dt)
            base = bases.get(key)
            if base is None:
                base = bases[key] = torch.empty(max(st.nbytes() // x.element_size(), 1), dtype=dt, device="cpu")
            t = base.as_strided(tuple(x.shape), tuple(x.stride()), int(x.storage_offset()))
        made[id(x)] = t
        return t

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


def _loss(torch, outputs, loss_fn, source: str):
    """The scalar the backward starts from: ``loss_fn(outputs)``, else the output (its first
    item if a tuple; its ``.loss``, else ``.logits``, where present), summed unless it is one
    element that requires grad."""
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
        raise StagesplitError(f"{source}: the model's forward returned {_describe(outputs)}; expected a tensor, a "
                              "loss, a tuple whose first item is one, or an output with .loss or .logits; or give a "
                              "loss_fn (the factory's third item) that turns the output into a scalar")
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
            idx = rec.tensor(t, "input", ROOT, f"input[{key}]")
            if idx is not None:
                rec.derived.add(idx)


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


# ------------------------------------------------------------------------------------------------
# Building the profile


def _round(nbytes: int, unit: int) -> int:
    return nbytes if unit <= 1 else -(-nbytes // unit) * unit


@dataclass
class _Layering:
    """The layer of every operation (``target``), the explicit layers to store (None where the
    recorded regexes give the same), the options that read the rest from the names, and the
    block module paths of the module-tree grouping."""

    target: list[str | None]
    explicit: list[str | None]
    options: LayerOptions
    method: str
    block_paths: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _positional(ops, own_key: list[str | None], anchors: list[int | None]) -> tuple[list[str | None], str, str]:
    """Each operation's layer: its own where it has one, else the layer that ran last before its
    anchor in the forward pass (the first layer before any has run; the last without anchor)."""
    S = len(ops)
    first_seen: dict[str, int] = {}
    for i, k in enumerate(own_key):
        if k is not None:
            first_seen.setdefault(k, i)
    forward_keys = [own_key[i] for i in range(S) if ops[i].phase == "forward" and own_key[i] is not None]
    first_key = forward_keys[0]
    last_key = max(first_seen, key=first_seen.get)
    positional: list[str] = [first_key] * S
    current = first_key
    for i in range(S):
        if ops[i].phase in ("forward", "loss"):
            if own_key[i] is not None:
                current = own_key[i]
            positional[i] = current
    target: list[str | None] = []
    for i in range(S):
        if own_key[i] is not None:
            target.append(own_key[i])
        elif ops[i].phase in ("forward", "loss"):
            target.append(positional[i])
        else:
            a = anchors[i]
            target.append(positional[a] if a is not None else last_key)
    return target, first_key, last_key


def _tree_layering(ops, labels: list[str], names: list[str], anchors, stacks: list[ModuleStack]) -> _Layering | None:
    """Group by the blocks of the module stacks; None when no block runs in the forward pass."""
    block_name = _block_names(stacks)
    cache: dict[str, str | None] = {}

    def block_of(label: str) -> str | None:
        if label not in cache:
            parts = label.split(".")
            cache[label] = next((".".join(parts[:k]) for k in range(len(parts), 0, -1)
                                 if ".".join(parts[:k]) in block_name), None)
        return cache[label]

    blocks = [block_of(label) for label in labels]
    ran = {blocks[i] for i in range(len(ops)) if ops[i].phase == "forward" and blocks[i] is not None}
    if not ran:
        return None
    own_key = [block_name[b] if b in ran else None for b in blocks]
    target, _, _ = _positional(ops, own_key, anchors)
    options = LayerOptions(layer_regex=_tree_regex(stacks))
    explicit = _unplaced(names, target, options)
    return _Layering(target, explicit, options, "module-tree", {block_name[b]: b for b in ran})


def _unplaced(names: list[str], target: list[str | None], options: LayerOptions) -> list[str | None]:
    """The explicit layer of every operation the options would not place in its target layer
    from its name (layers.group_layers' rules for a capture's operations, which have no inputs)."""
    layer_re, first_re, last_re, call_re = options.compiled()
    first_seen: dict[str, int] = {}
    for i, k in enumerate(target):
        if k is not None:
            first_seen.setdefault(k, i)
    order = sorted(first_seen, key=first_seen.get)
    explicit: list[str | None] = []
    for name, want in zip(names, target):
        keys = layer_keys(layer_re, name)
        if len(keys) == 1:
            got = keys.pop()
        elif call_re.search(name):
            got = None
        elif last_re.search(name):
            got = order[-1]
        elif first_re.search(name):
            got = order[0]
        else:
            got = None
        explicit.append(None if got == want else want)
    return explicit


def _regex_layering(ops, names: list[str], anchors, options: LayerOptions, stamp_all: bool) -> _Layering | None:
    """Group by a layer regex on the names: the user's, every operation's layer stored, or the
    default, stored only where it and the first- and last-layer regexes do not place the
    operation. An operation the regex does not read goes where it ran, as in the module-tree
    grouping (not where a name such as an embedder's ``pooler`` would send it). None when the
    regex finds no block that runs in the forward pass."""
    layer_re = options.compiled()[0]
    own_key: list[str | None] = [None] * len(ops)
    for i, n in enumerate(names):
        keys = layer_keys(layer_re, n)
        if len(keys) == 1:
            own_key[i] = next(iter(keys))
    if not any(own_key[i] is not None and ops[i].phase == "forward" for i in range(len(ops))):
        return None
    target, _, _ = _positional(ops, own_key, anchors)
    explicit = list(target) if stamp_all else _unplaced(names, target, options)
    return _Layering(target, explicit, options, "regex")


def _collisions(labels: list[str], names: list[str], stacks: list[ModuleStack], options: LayerOptions) -> list[str]:
    """A warning when the user's regex gives blocks of different module paths one layer name."""
    layer_re = options.compiled()[0]
    blocks = {b for s in stacks for b in s.blocks}
    keys_of: dict[str, set[str]] = {}                    # block -> layer names, blocks in the order they run
    for label, name in zip(labels, names):
        parts = label.split(".")
        block = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in blocks), None)
        if block is not None:
            keys_of.setdefault(block, set()).update(layer_keys(layer_re, name))
    by_key: dict[str, list[str]] = {}
    for block, keys in keys_of.items():
        for key in sorted(keys):
            by_key.setdefault(key, []).append(block)
    clashes = [(key, found) for key, found in by_key.items() if len(found) > 1]
    if not clashes:
        return []
    key, found = clashes[0]
    return [f"--layer-regex '{options.layer_regex}' gives blocks of different module paths the same layer name, so "
            f"they become one layer: {' and '.join(found[:3])} are {'both' if len(found) == 2 else 'all'} layer '{key}' "
            f"({len(clashes)} such name(s)); "
            f"use a regex whose groups tell them apart, e.g. '{_tree_regex(stacks)}', or leave --layer-regex out "
            "to group by the module tree"]


def _build_profile(rec, target, layer_options: LayerOptions | None, allocator_round: int, name: str, source: str, *,
                   dtype: str, amp: bool, optimizer: str, torch_version: str, autocast_dtype=None,
                   stacks: list[ModuleStack] = (), hint: str = ""):
    from ..io.builder import ProfileBuilder
    ops = rec.ops
    S = len(ops)

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

    labels: list[str] = []
    names: list[str] = []
    anchors: list[int | None] = []
    for i, op in enumerate(ops):
        if op.phase == "optimizer":
            p = owner[i]
            label = rec.storages[p].label if p is not None else ROOT
            anchors.append(rec.param_first_use.get(p) if p is not None else None)
            names.append(f"{label}/optimizer/{op.func}")
        elif op.phase in ("backward", "recompute"):
            label = op.label
            names.append(f"{label}/{op.phase}/{op.func}")
            anchors.append(op.anchor)
        else:
            label = op.label
            names.append(f"{label}/{op.func}")
            anchors.append(op.anchor)
        labels.append(label)

    warnings_: list[str] = []
    layering: _Layering | None = None
    if layer_options is not None:
        layering = _regex_layering(ops, names, anchors, layer_options, stamp_all=True)
        if layering is not None and stacks:
            warnings_.extend(_collisions(labels, names, stacks, layer_options))
        if layering is None:
            warnings_.append(f"--layer-regex '{layer_options.layer_regex}' found no block in the module names "
                             f"(e.g. {names[0]}){hint}")
    else:
        layering = _tree_layering(ops, labels, names, anchors, list(stacks)) if stacks else None
        if layering is None:
            layering = _regex_layering(ops, names, anchors, LayerOptions(), stamp_all=False)
        if layering is None:
            warnings_.append(f"no repeated blocks (nn.ModuleList or nn.Sequential children of one class) and no "
                             f"block the layer regex '{LayerOptions().layer_regex}' reads were found in the module "
                             f"names (e.g. {names[0]}){hint}")

    # A parameter used by several layers (tied embeddings) gets gradient contributions from each;
    # on one device autograd holds the first (the head's) until the last (the embedding's) arrives
    # and sums them. A pipeline keeps one copy of the parameter per stage, each accumulating its
    # own contribution, so the sum's input from another layer is left to that layer alone.
    drop: dict[int, set[int]] = {}
    if layering is not None:
        effective = layering.target
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
        compute_source="FLOPs from torch.utils.flop_counter's formulas and stagesplit's for the attention and "
                       "grouped matrix kernels torch has none for (matrix products, convolutions, attention; other "
                       "operations count 0)",
        warnings=warnings_))
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
    explicit = layering.explicit if layering is not None else [None] * S
    for i, op in enumerate(ops):
        used = [s for s in op.storages if s not in drop.get(i, ())]
        for s in list(used):
            used.extend(companions.get(s, ()))
        vars_ = sorted({var_of[s] for s in used})
        extra = {"bytes_accessed": op.bytes_accessed} if has_bytes else {}
        b.operation(names[i], i, i, vars=vars_, compute=op.flops, layer=explicit[i], **extra)
    profile = b.build(validate=False)
    profile.operations.phase = _phases(rec)
    profile.validate(source)
    if layering is not None:
        _record_grouping(profile, layering, group_layers)
    return profile


def _phases(rec):
    import numpy as np
    phase_of = {"forward": Phase.FORWARD, "loss": Phase.FORWARD, "optimizer": Phase.OPTIMIZER,
                "recompute": Phase.RECOMPUTE}
    backward = _backward_phases(rec)
    return np.array([backward.get(i, phase_of.get(op.phase, Phase.UNKNOWN)) for i, op in enumerate(rec.ops)], np.int8)


def _record_grouping(profile, layering: _Layering, group_layers) -> None:
    """Check that the stored explicit layers and the recorded regexes give every operation its
    layer (storing every layer explicitly where they do not), then record the grouping."""
    assignment = group_layers(profile, layering.options)
    got = [assignment.names[k] if k >= 0 else None for k in assignment.op_layer]
    if got != layering.target:
        profile.operations.layer = list(layering.target)
        assignment = group_layers(profile, layering.options)
    paths = [layering.block_paths.get(n, p) if layering.block_paths else p
             for n, p in zip(assignment.names, assignment.module_paths)]
    o = layering.options
    profile.info.layer_grouping = LayerGrouping(
        method=layering.method, layer_regex=o.layer_regex, first_layer_regex=o.first_layer_regex,
        last_layer_regex=o.last_layer_regex, call_regex=o.call_regex, order=o.order,
        layers=tuple(assignment.names), module_paths=tuple(paths))


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


__all__ = ["capture", "capture_model", "load_factory", "peak_bytes", "round_up", "module_stacks", "flop_counter",
           "ModuleStack", "OPTIMIZERS", "DTYPES", "TORCH_MISSING", "FLOP_FORMULAS"]
