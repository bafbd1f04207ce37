"""Capture a PyTorch training step as a full-form profile, on CPU, without real memory.

This module runs the step; the other modules of ``capturing`` each hold one part of it. One
whole training step (forward, loss, backward, optimizer step) of the model a factory gives
(``factory``) runs under ``torch._subclasses.FakeTensorMode``: tensors carry shapes and dtypes but
no data, so a LLaMA-7B-sized step runs on a laptop CPU. The model's parameters, buffers and
inputs are swapped for empty fake tensors of their shapes (the caller's model is left as it
came), and a recorder (``recorder``) on top of fake mode sees every aten operation and every
tensor storage, with its FLOPs (``flops``). The record becomes a profile (``profilebuild``) whose
layers are the blocks of the model's module stacks (``modulestacks``, ``layering``), or those a
layer regex reads.

What is always live: parameters, buffers, gradients (pipelined training accumulates them over
micro-batches, so the step runs with gradients already allocated, as every micro-batch but the
first does) and optimizer states. Everything else gets its half-open live interval. Inputs are
counted by storage: a tensor passed twice (``labels`` that is ``input_ids``) is one variable.

A failure of the model, the loss, the backward or the optimizer step is one line naming the
operation or module where it happened. torch is imported lazily (``runtime``): nothing else in
stagesplit needs it; its logging and warnings are silenced while a capture runs
(``torch_logs=True`` shows them).
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import OptionError, StagesplitError
from ..io.profile import Profile, Target, batch_of
from ..io.variants import ParallelVariants, parallel_variants
from ..layers import LayerOptions, one_stack
from . import masterweights
from .contextparallel import ContextParallel, check_degree, fake_meshes, ring_attention, shard_inputs
from .expertparallel import ExpertParallel, apply_expert_parallel, exchange_shape, expert_modules
from .factory import call_factory, check_model, load_factory
from .kernels import check_kernels, cuda_attention, kernels_note
from .modulestacks import module_stacks, sequential_hint
from .profilebuild import build_profile
from .recorder import (
    LOSS,
    ROOT,
    FakeOpError,
    _Collective as Collective,
    _Storage as Storage,
    hook_gradients,
    make_recorder,
    module_hooks,
    register_model,
    register_optimizer_state,
)
from .runtime import as_a_real_run, first_line, load_torch, quiet
from .tensorparallel import (
    fake_process_group,
    heads_per_rank,
    loss_parallel_context,
    parallelize,
    propagation_unrecorded,
    resolve_plan,
)

__all__ = ["capture", "capture_degrees", "capture_model", "check_degrees", "OPTIMIZERS", "DTYPES", "DEFAULT_TARGET"]

OPTIMIZERS = ("adam", "adamw", "sgd", "none")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_TARGET = "a100-80gb"


def capture(spec: str, **options) -> Profile | ParallelVariants:
    """Capture the training step of the model the factory ``spec`` names (see ``capture_model``);
    with ``tp`` a list of degrees, one rank at each (``capture_degrees``)."""
    load_torch()
    factory = load_factory(spec)
    with quiet(bool(options.get("torch_logs"))):
        model, inputs, loss_fn = call_factory(factory, spec)
    if not options.get("name"):
        where, _, func = spec.rpartition(":")
        stem = Path(where).stem if where.endswith(".py") else where.rpartition(".")[2]
        options["name"] = stem if func == "build" else f"{stem}.{func}"
    if isinstance(options.get("tp"), (list, tuple)):
        return capture_degrees(model, inputs, loss_fn, degrees=options.pop("tp"), source=spec, **options)
    return capture_model(model, inputs, loss_fn, source=spec, **options)


def check_degrees(degrees: Any) -> tuple[int, ...]:
    """A list of tensor-parallel degrees: each a whole number in 1..4096, none twice, at least one."""
    if isinstance(degrees, (str, bytes)) or not isinstance(degrees, (list, tuple)) or not degrees:
        raise OptionError("tp", f"expected a list of tensor-parallel degrees, got {degrees!r}")
    for d in degrees:
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 4096:
            raise OptionError("tp", f"expected whole numbers of ranks in 1..4096, got {d!r}")
    if len(set(degrees)) != len(degrees):
        twice = next(d for d in degrees if list(degrees).count(d) > 1)
        raise OptionError("tp", f"the degree {twice} is given twice")
    return tuple(degrees)


def capture_degrees(model, inputs, loss_fn=None, *, degrees, sequence_parallel: bool = False,
                    tp_plan: str | Path | None = None, loss_parallel: bool = False, torch_logs: bool = False,
                    source: str | None = None, **options) -> ParallelVariants:
    """One rank at each tensor-parallel degree of ``degrees``: ``capture_model`` once per degree on
    the same model (which every capture leaves as it came), each variant exactly the profile a
    capture at that degree alone makes. ``sequence_parallel``, ``tp_plan`` and ``loss_parallel`` apply to
    the degrees of 2 or more (degree 1 is the whole model). Every degree is checked against the plan before
    any step runs: a degree that does not divide the heads, KV heads or a sharded dimension is
    refused in one line naming the module and the degree. A list of one degree is that capture
    alone, in a ParallelVariants of one."""
    degrees = check_degrees(degrees)
    torch = load_torch()
    if any(d > 1 for d in degrees):
        with quiet(torch_logs):
            checked, _, _ = check_model((model, inputs, loss_fn), source or "model", torch)
            for d in sorted(degrees):
                if d > 1:
                    resolve_plan(torch, checked, d, bool(sequence_parallel), tp_plan, bool(loss_parallel))
    profiles = []
    for d in sorted(degrees):
        extra: dict[str, Any] = {"sequence_parallel": sequence_parallel, "tp_plan": tp_plan,
                                 "loss_parallel": loss_parallel} if d > 1 or len(degrees) == 1 else {}
        profiles.append(capture_model(model, inputs, loss_fn, tp=d, torch_logs=torch_logs, source=source,
                                      **extra, **options))
    return parallel_variants(profiles, source or "model")


def capture_model(model, inputs, loss_fn=None, *, optimizer: str = "adam", dtype: str = "float32",
                  amp: bool = False, target=None, allocator_round: int = 512, name: str | None = None,
                  layer_regex: str | None = None, source: str | None = None, torch_logs: bool = False,
                  tp: int = 1, sequence_parallel: bool = False, tp_plan: str | Path | None = None,
                  kernels: str = "cpu", cp: int = 1, ep: int = 1, master_weights: bool = False,
                  loss_parallel: bool = False) -> Profile:
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
    ``layer_regex``. ``torch_logs``: let torch's (and the model's) logging and warnings through.
    ``tp``: capture rank 0 of this many tensor-parallel ranks (``tensorparallel``), the plan
    from ``tp_plan`` (a YAML file) or the model's declaration; ``sequence_parallel``: with
    sequence parallelism between the blocks; ``loss_parallel``: the plan's gathered head kept split on
    the vocabulary and the loss computed on the split under torch's ``loss_parallel()``, as torchtitan and
    Megatron run it (``tensorparallel.with_loss_parallel``). ``kernels``: cpu (what the CPU kernels keep) or cuda
    (attention as the target GPU's CUDA kernels keep it: capturing/kernels.py). ``cp``: capture
    rank 0 of this many context-parallel ranks (``contextparallel``: the sequence sharded,
    attention as torch's ring attention, which runs the GPU's kernels: ``kernels`` becomes cuda).
    ``ep``: rank 0 of this many expert-parallel ranks of a mixture-of-experts model, composed
    from rules on the one-device record (``expertparallel``). ``master_weights``: the parameters
    in ``dtype`` (bfloat16 when ``dtype`` is float32) with no autocast, float32 gradients and
    float32 master copies that the optimizer updates (``masterweights``: Megatron's ``--bf16``,
    FSDP2's mixed precision); not with ``amp``."""
    torch = load_torch()
    with quiet(torch_logs):
        return _capture(torch, model, inputs, loss_fn, optimizer=optimizer, dtype=dtype, amp=amp, target=target,
                        allocator_round=allocator_round, name=name, layer_regex=layer_regex, source=source,
                        tp=tp, sequence_parallel=sequence_parallel, tp_plan=tp_plan, kernels=kernels, cp=cp, ep=ep,
                        master_weights=master_weights, loss_parallel=loss_parallel)


def _capture(torch, model, inputs, loss_fn, *, optimizer: str, dtype: str, amp: bool, target, allocator_round: int,
             name: str | None, layer_regex: str | None, source: str | None, tp: int = 1,
             sequence_parallel: bool = False, tp_plan: str | Path | None = None, kernels: str = "cpu",
             cp: int = 1, ep: int = 1, master_weights: bool = False, loss_parallel: bool = False) -> Profile:
    from torch._subclasses import FakeTensorMode
    source = source or "model"
    if optimizer not in OPTIMIZERS:
        raise OptionError("optimizer", f"expected one of {', '.join(OPTIMIZERS)}, got '{optimizer}'")
    if dtype not in DTYPES:
        raise OptionError("dtype", f"expected one of {', '.join(DTYPES)}, got '{dtype}'")
    if int(allocator_round) < 1:
        raise OptionError("allocator_round", f"expected a whole number of bytes >= 1, got {allocator_round}")
    model, inputs, loss_fn = check_model((model, inputs, loss_fn), source, torch)
    tgt = _resolve_target(target)
    context = None
    if cp != 1:
        sequence, balanced = check_degree(torch, inputs, cp)
        context = ContextParallel(cp, sequence, balanced)
        kernels = "cuda"                 # torch's ring attention runs the GPU's kernels only (contextparallel)
    check_kernels(kernels, tgt)
    kernels_used: Counter = Counter()
    layer_options = LayerOptions(layer_regex=layer_regex) if layer_regex is not None else None
    if layer_options is not None:
        layer_options.compiled()                         # a bad regex fails before the model runs
    if master_weights:
        if amp:
            raise OptionError("master_weights", "is a precision of its own (low-precision parameters with float32 "
                              "master copies, no autocast): give it without amp")
        if dtype == "float32":
            dtype = "bfloat16"
    param_dtype = getattr(torch, dtype)
    autocast_dtype = None
    if amp:
        autocast_dtype = param_dtype if dtype != "float32" else torch.bfloat16
        param_dtype = torch.float32
    stacks = module_stacks(torch, model)
    expert = None
    if isinstance(ep, bool) or not isinstance(ep, int) or not 1 <= ep <= 4096:
        raise OptionError("ep", f"expected a whole number of ranks in 1..4096, got {ep!r}")
    if ep > 1:
        experts = expert_modules(torch, model, ep)          # (a model with none is refused first)
        tokens, top_k, hidden, itemsize = exchange_shape(torch, model, inputs, autocast_dtype or param_dtype)
        expert = ExpertParallel(ep, experts, tokens // cp, top_k, hidden, itemsize)
    plan = None
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 4096:
        raise OptionError("tp", f"expected a whole number of ranks in 1..4096, got {tp!r}")
    if tp > 1:
        plan = resolve_plan(torch, model, tp, bool(sequence_parallel), tp_plan, bool(loss_parallel))
    elif sequence_parallel or tp_plan is not None or loss_parallel:
        raise OptionError("sequence_parallel" if sequence_parallel else "tp_plan" if tp_plan is not None
                          else "loss_parallel", "applies to a tensor-parallel capture (tp of 2 or more)")

    Recorder = make_recorder(torch, allocator_round)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    rec = Recorder()
    hooks = []
    restore: list = []
    outputs = loss = opt = None
    fake_inputs = None
    layout = None
    group = contextlib.ExitStack()
    tp_hooks: list = []
    cp_mesh = None
    masters = None
    try:
        if context is not None:
            mesh, cp_mesh, groups = group.enter_context(fake_meshes(torch, plan.degree if plan else 1, cp))
            context = replace(context, groups=groups)
            group.enter_context(ring_attention(context.load_balanced))
            group.enter_context(propagation_unrecorded(rec.state))
        else:
            mesh = group.enter_context(fake_process_group(torch, plan.degree)) if plan is not None else None
        attention = cuda_attention(torch, tgt, kernels_used, cp_mesh) if kernels == "cuda" else contextlib.nullcontext()
        with fake:
            params = _fake_parameters(torch, model, param_dtype, restore)
            fake_inputs = _fake_inputs(torch, inputs, None if amp else param_dtype)
            if context is not None:
                fake_inputs = shard_inputs(torch, fake_inputs, cp_mesh, context.sequence, context.load_balanced)
            if plan is not None:
                tp_hooks, extra = parallelize(torch, model, mesh, plan)
                group.enter_context(loss_parallel_context(torch, plan))   # the loss, forward and backward
                params = {id(p): p for p in model.parameters()}
                if context is None:
                    group.enter_context(propagation_unrecorded(rec.state))
                layout = (plan, extra, heads_per_rank(torch, model, plan))
            shaped = _gradient_layouts(torch, model, fake_inputs, loss_fn, autocast_dtype, stacks) \
                if plan is not None else {}
            if master_weights:
                masters, handles = masterweights.attach(torch, params, shaped)
                hooks.extend(handles)
            else:
                for p in params.values():
                    if p.requires_grad:
                        p.grad = torch.zeros_like(shaped.get(id(p), p))
            shaped.clear()
        register_model(rec, model, fake_inputs, torch)
        if masters is not None:
            masterweights.register(rec, params, masters)
        hooks.extend(module_hooks(rec, model))
        model.train()
        with fake, rec, as_a_real_run(), attention:
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
            except FakeOpError:
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
            gradient_hooks = hook_gradients(rec, loss.grad_fn, params) if loss.grad_fn is not None else []
            rec.state.phase = "backward"
            try:
                loss.backward()
            except FakeOpError:
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
                if masters is not None:
                    for key, master in masters.masters.items():
                        master.grad = masters.gradients[key]
                    opt = _make_optimizer(torch, optimizer, list(masters.masters.values()))
                else:
                    opt = _make_optimizer(torch, optimizer, [p for p in params.values() if p.requires_grad])
                rec.state.paused = False
                rec.state.phase = "optimizer"
                try:
                    if masters is not None:
                        masterweights.step(torch, opt, params, masters)
                    else:
                        opt.step()
                except FakeOpError:
                    raise
                except (Exception, SystemExit) as exc:
                    raise StagesplitError(f"{source}: the optimizer step raised "
                                          f"{_failure_text(rec, exc, 'the optimizer step', dtype)}") from None
            rec.state.phase = "done"
            gc.collect()
    except FakeOpError as exc:
        raise StagesplitError(f"{source}: operation {exc.func} in {exc.label} cannot run under fake tensors "
                              f"({first_line(exc.exc)}); {_fake_failure_hint(exc.exc)}") from None
    finally:
        for h in hooks:
            h.remove()
        for table, key in tp_hooks:
            table.pop(key, None)
        for table, key, original in restore:            # the caller's model is left as it came
            table[key] = original
        group.close()
    if opt is not None:
        register_optimizer_state(rec, opt, params, masterweights.owners(masters) if masters is not None else None)
    if expert is not None:
        apply_expert_parallel(rec, expert, Storage, Collective)
    if not rec.ops:
        raise StagesplitError(f"{source}: the training step ran no tensor operation")
    profile = build_profile(rec, tgt, layer_options, allocator_round, name or type(model).__name__, source,
                            dtype=dtype, amp=amp, master_weights=master_weights, optimizer=optimizer, torch_version=torch.__version__,
                            autocast_dtype=autocast_dtype, stacks=stacks, hint=sequential_hint(torch, model),
                            layout=layout, kernels=kernels_note(kernels_used, tgt) if kernels == "cuda" else "",
                            context=context, expert=expert)
    profile.info.batch_size = batch_size(torch, inputs)
    grouping = profile.info.layer_grouping
    if grouping is not None and one_stack(grouping.module_paths) and not _stages_from_modules(model, grouping):
        profile.info.layer_grouping = replace(grouping, traced_stages=True)
    return profile


def _stages_from_modules(model, grouping) -> bool:
    """Whether the torch-pipelining export builds the stages of ``model``, whose layers are one stack's
    blocks, from its modules: as its ``builds_from_modules`` decides at run time (templates/
    stage_modules.py), a Hugging Face causal language model (an output embedding and a config) whose
    stack's holder takes ``inputs_embeds``. Any other model's stages are traced."""
    import inspect
    if not hasattr(model, "get_output_embeddings") or not hasattr(model, "config"):
        return False
    holder = str(grouping.module_paths[0]).replace("/", ".").rpartition(".")[0].rpartition(".")[0]
    try:
        decoder = model.get_submodule(holder)
    except AttributeError:
        return False
    return bool(holder) and "inputs_embeds" in inspect.signature(decoder.forward).parameters


def _gradient_layouts(torch, model, inputs, loss_fn, autocast_dtype, stacks=()) -> dict[int, Any]:
    """Each parameter's gradient as the backward makes it, under tensor parallelism: one
    unrecorded step (forward, loss, backward) with no gradients allocated.

    The capture runs with gradients already allocated, as every micro-batch but the first does;
    their layout is the one autograd gave them on the first: not always the parameter's. A
    vocabulary-split embedding's gradient is a partial sum over the whole vocabulary (torch's
    masked partial placement), twice the weight's shard at two ranks; allocating it like the
    parameter undercounts a real rank. A failure here is left to the recorded step, which names
    it.

    The step runs on the model with each stack of blocks cut to its first three
    (``_cut_gradient_layouts``): the blocks of a stack run the same code on parameters laid out alike, so
    a later block's gradients are laid out as the third's, once the second's and the third's
    are found laid out alike (the layout has settled along the stack: the first block may take
    its input otherwise). Where that does not hold, or the cut model fails, the whole model
    runs; on an 80-block model the cut step is a few percent of the whole one."""
    cut = [s for s in stacks if len(s.children) > 3]
    if cut:
        found = _cut_gradient_layouts(torch, model, inputs, loss_fn, autocast_dtype, cut)
        if found is not None:
            return found
    return _unrecorded_step(torch, model, inputs, loss_fn, autocast_dtype)[0]


def _unrecorded_step(torch, model, inputs, loss_fn, autocast_dtype) -> tuple[dict[int, Any], bool]:
    """Forward, loss and backward, unrecorded: each parameter's gradient, taken off it, and
    whether the step ran to its end."""
    model.train()
    ok = True
    try:
        with as_a_real_run(), (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None
                               else contextlib.nullcontext()):
            loss = _loss(torch, _call(model, inputs), loss_fn, "model")
        loss.backward()
    except (Exception, SystemExit):
        ok = False
    loss = None
    found = {}
    for p in model.parameters():
        if p.grad is not None:
            found[id(p)] = p.grad
            p.grad = None
    return found, ok


def _layout_key(t) -> tuple:
    """What a gradient allocated like ``t`` depends on: its placements, local shape, strides,
    dtype (None: no tensor)."""
    if t is None:
        return ()
    local = t.to_local() if hasattr(t, "to_local") else t
    return (tuple(getattr(t, "placements", ())), tuple(local.shape), tuple(local.stride()), local.dtype,
            type(t).__name__)


def _cut_gradient_layouts(torch, model, inputs, loss_fn, autocast_dtype, stacks) -> dict[int, Any] | None:
    """``_gradient_layouts`` from a step of the model with each stack in ``stacks`` cut to its
    first three blocks; None where the cut step failed or a stack's layout has not settled by
    its third block (the caller then runs the whole model)."""
    modules = dict(model.named_modules())
    held = []
    try:
        for stack in stacks:
            container = modules[stack.path] if stack.path else model
            held.append((container, container._modules))
            container._modules = {k: v for k, v in list(container._modules.items())[:3]}
        found, ok = _unrecorded_step(torch, model, inputs, loss_fn, autocast_dtype)
    finally:
        for container, kept in held:
            container._modules = kept
    if not ok:
        return None
    ran = set(found)
    for stack in stacks:
        second, third = stack.blocks[1], stack.blocks[2]
        named = {n: p for n, p in modules[third].named_parameters()}
        for name, p in modules[second].named_parameters():
            q = named.get(name)
            if q is None or _layout_key(p) != _layout_key(q) or \
                    _layout_key(found.get(id(p))) != _layout_key(found.get(id(q))):
                return None
        for block in stack.blocks[3:]:
            for name, p in modules[block].named_parameters():
                q = named.get(name)
                if q is None or _layout_key(p) != _layout_key(q):
                    return None
                if id(q) in found and id(p) not in ran:      # (a parameter shared with a block that ran: its own)
                    found[id(p)] = found[id(q)]
    return found


def _fake_failure_hint(exc: BaseException) -> str:
    """What to change where an operation failed under the capture's fake tensors: a tensor left on the
    meta device (capture moves the model and its inputs off it, not a tensor a loss function or the
    model holds elsewhere), else shapes that depend on tensor values."""
    text = str(exc)
    if "meta" in text and "device" in text:
        return ("a tensor the capture did not receive is on the meta device (one the loss function or the model "
                "holds outside its inputs, such as labels): make it inside loss_fn, on the output's device")
    return "capture needs shapes that do not depend on tensor values"


def _failure_text(rec, exc: BaseException, where: str, dtype: str) -> str:
    """``ValueError: boom (in layers.1.inner)``: the exception with the operation that raised it
    or the innermost module it left, and a remedy where one is known."""
    failure = rec.failure if rec.failure is not None and rec.failure.of(exc) else None
    if failure is None:
        return f"{first_line(exc)} (in {where})"
    if failure.func is None:
        return f"{first_line(exc)} (in {failure.label})"
    text = f"{first_line(exc)} (operation {failure.func} in {failure.label})"
    if failure.func.endswith("grouped_mm") and "float32" in failure.dtypes:
        text = (f"{first_line(exc)} (operation {failure.func} in {failure.label}: torch's fake kernel for "
                f"grouped matrix products takes bfloat16 inputs only; capture with `dtype='bfloat16'`)")
    return text


def _describe(value) -> str:
    """What a value is, in a message: "a tensor of shape (2, 3)", "None", "a str"."""
    torch = load_torch()
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


def batch_size(torch, inputs) -> int | None:
    """The samples per batch of ``inputs`` (a tensor, a tuple of arguments or a dict of keyword
    arguments), by io/profile.py's ``batch_of`` rule on their tensors' shapes."""
    items = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, (tuple, list)) \
        else (inputs,)
    return batch_of(tuple(int(d) for d in x.shape) for x in items if isinstance(x, torch.Tensor))


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
