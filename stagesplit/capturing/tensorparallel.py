"""One tensor-parallel rank of a training step: the plan, its checks, and torch's own code applying it.

A capture at tensor-parallel degree N runs the step as rank 0 of N under fake tensors and torch's
fake process group (``torch.testing._internal.distributed.fake_pg.FakeStore``, backend ``fake``):
collectives run no communication but return tensors of the shapes a real rank gets. The plan is
applied by torch itself (``torch.distributed.tensor.parallel.parallelize_module``), so the rank
holds what a real rank holds: its parameters are DTensors whose local shards are the rank's bytes,
and the collectives' outputs and temporaries are allocated where torch allocates them.

The plan maps module patterns (dotted paths, ``*`` standing for one component, as torch and
transformers write them) to styles. It comes from the model where it declares one (a Hugging Face
model's ``_tp_plan``, its ``config.base_model_tp_plan`` prefixed with the base model's path) or
from a YAML file (``pattern: style``). The styles and the torch code each becomes:

- ``colwise``: ``ColwiseParallel()`` (the output's last dimension sharded, kept local);
- ``colwise_gather_output``: ``ColwiseParallel(output_layouts=Replicate())`` (a head whose logits
  are gathered);
- ``colwise_loss_parallel``: ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)``, the
  step run under torch's ``loss_parallel()``: a head whose logits stay split on the vocabulary and whose
  cross-entropy is computed on the split (torchtitan's head with tensor parallelism, Megatron's
  vocabulary-parallel cross-entropy). ``loss_parallel`` turns a plan's gathered heads into these
  (``with_loss_parallel``): a Hugging Face plan gathers the logits, each rank then holding all of them;
- ``rowwise``, ``embedding_rowwise``: ``RowwiseParallel()`` (a Linear's input dimension or an
  Embedding's rows sharded; the partial sums reduced);
- ``rowwise_split_input``: ``RowwiseParallel(input_layouts=Replicate())``;
- ``sequence``: ``SequenceParallel()`` with sequence parallelism, nothing without it;
- ``replicate``, ``replicated_with_grad_allreduce``: nothing (every rank holds the whole module).

Any other style (transformers' expert and packed styles among them) is refused by name.

With sequence parallelism (torch's recipe): the residual stream is sharded on the sequence
dimension (1) between the blocks. The first block of the plan's repeated stack takes its input
split (``PrepareModuleInput``), the norms that are direct children of the blocks (and of the
stack's parent, when the head after them is sharded) run under ``SequenceParallel``, a colwise
layer gathers its input from ``Shard(1)`` and a rowwise layer reduce-scatters its output to
``Shard(1)``; a block's child that holds parameters and no planned module (an attention the plan
leaves whole) gathers its input and splits its output, and a final norm before an unsharded head
gathers the sequence first.

Before anything runs the degree is checked against what it must divide: the attention heads and
key/value heads of every attention whose projections are sharded, the sharded dimension of every
planned Linear (output features for colwise, input features for rowwise) and every planned
Embedding's rows (the vocabulary). A refusal is one line naming the module and the number.
"""

from __future__ import annotations

import contextlib
import fnmatch
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.text import show
from ..errors import OptionError, StagesplitError
from ..io.profile import loss_parallel_of

__all__ = ["STYLES", "TensorParallelPlan", "configured_count", "read_plan_file", "resolve_plan", "fake_process_group",
           "parallelize", "heads_per_rank", "propagation_unrecorded", "with_loss_parallel", "loss_parallel_context"]

#: the styles a plan may name (transformers' names for the same torch styles included)
STYLES = ("colwise", "colwise_gather_output", "colwise_loss_parallel", "rowwise", "embedding_rowwise",
          "rowwise_split_input", "sequence", "sequence_parallel", "replicate", "replicated_with_grad_allreduce")
_NOTHING = ("replicate", "replicated_with_grad_allreduce")
_COLWISE = ("colwise", "colwise_gather_output", "colwise_loss_parallel")
#: the styles of a head whose output leaves the model split no more on the hidden dimension
_HEADS = ("colwise_gather_output", "colwise_loss_parallel")
_ROWWISE = ("rowwise", "embedding_rowwise", "rowwise_split_input")
_SEQUENCE = ("sequence", "sequence_parallel")


@dataclass(frozen=True)
class TensorParallelPlan:
    """A plan bound to one model: each planned module path with its style, and where it came from."""

    degree: int
    sequence_parallel: bool
    source: str                                    #: "the model's declared plan (...)" or the file
    styles: tuple[tuple[str, str], ...]            #: (module path, style), in the model's module order
    heads: tuple[tuple[str, int, int], ...] = ()   #: (attention module, heads, KV heads) whose projections split


def read_plan_file(path: str | Path) -> dict[str, str]:
    """A YAML (or JSON) plan: a mapping of module patterns to styles, read with the safe reader."""
    from ..common.safeinput import read_yaml_file
    doc = read_yaml_file(path, "tensor-parallel plan")
    if not isinstance(doc, dict) or not doc:
        raise OptionError("tp_plan", "expected a mapping of module patterns to styles "
                          f"({', '.join(STYLES)}); it names no module", subject=show(path))
    plan: dict[str, str] = {}
    for pattern, style in doc.items():
        if not isinstance(pattern, str) or not pattern:
            raise OptionError("tp_plan", f"expected module patterns as keys, got {pattern!r}", subject=show(path))
        if not isinstance(style, str) or style not in STYLES:
            raise OptionError("tp_plan", f"{pattern}: expected one of {', '.join(STYLES)}, got {style!r}",
                              subject=show(path))
        plan[pattern] = style
    return plan


def declared_plan(model) -> tuple[dict[str, str], str] | None:
    """The plan a Hugging Face model declares: its ``_tp_plan`` (already prefixed with the base
    model's path), else its config's ``base_model_tp_plan`` under the base model's path."""
    plan = getattr(model, "_tp_plan", None)
    if isinstance(plan, dict) and plan:
        return {str(k): str(v) for k, v in plan.items()}, f"{type(model).__name__}._tp_plan"
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None)
    if isinstance(base, dict) and base:
        prefix = ""
        base_model = getattr(model, "base_model", None)
        if base_model is not None and base_model is not model:
            prefix = next((name + "." for name, m in model.named_modules() if m is base_model and name), "")
        return {prefix + str(k): str(v) for k, v in base.items()}, f"{type(config).__name__}.base_model_tp_plan"
    return None


def _matches(pattern: str, path: str) -> bool:
    parts, atoms = pattern.split("."), path.split(".")
    return len(parts) == len(atoms) and all(fnmatch.fnmatchcase(a, p) for p, a in zip(parts, atoms))


def resolve_plan(torch, model, degree: int, sequence_parallel: bool, plan_file: str | Path | None,
                 loss_parallel: bool = False) -> TensorParallelPlan:
    """The plan for ``model`` at ``degree``: from ``plan_file`` or the model's declaration, every
    pattern matched against the module paths and every divisibility checked (one-line refusals);
    with ``loss_parallel`` its gathered heads kept split for torch's ``loss_parallel`` instead
    (``with_loss_parallel``)."""
    if plan_file is not None:
        patterns = read_plan_file(plan_file)
        source, where = f"the plan in {show(plan_file)}", show(plan_file)
    else:
        found = declared_plan(model)
        if found is None:
            raise OptionError("tp", f"{type(model).__name__} declares no tensor-parallel plan (no _tp_plan or "
                              "config.base_model_tp_plan); give a plan file (YAML: module pattern -> style)")
        patterns, name = found
        source, where = f"the model's declared plan ({name})", name
    modules = dict(model.named_modules())
    styles: dict[str, str] = {}
    for pattern, style in patterns.items():
        if style not in STYLES:
            raise OptionError("tp_plan", f"{pattern}: style {style!r} is not supported (supported: "
                              f"{', '.join(STYLES)})", subject=where)
        hits = [p for p in modules if p and _matches(pattern, p)]
        if not hits:
            raise OptionError("tp_plan", f"pattern {pattern!r} matches no module of {type(model).__name__}",
                              subject=where)
        for p in hits:
            styles[p] = style
    ordered = tuple((p, styles[p]) for p in modules if p in styles)
    if loss_parallel:
        ordered = with_loss_parallel(ordered, where)
    heads = _check_divisible(torch, modules, ordered, degree)
    return TensorParallelPlan(degree, sequence_parallel, source, ordered, heads)


def with_loss_parallel(styles: tuple[tuple[str, str], ...], where: str) -> tuple[tuple[str, str], ...]:
    """``styles`` with every gathered head (``colwise_gather_output``) kept split on the vocabulary
    (``colwise_loss_parallel``), as torchtitan and Megatron run a head under tensor parallelism; a
    plan with no such head is refused: there is no split logits for the loss to take."""
    if not any(style in _HEADS for _, style in styles):
        raise OptionError("loss_parallel", "the plan gathers no head's output (no module of style "
                          "colwise_gather_output): there are no logits split on the vocabulary for the loss to take",
                          subject=where)
    return tuple((path, "colwise_loss_parallel" if style == "colwise_gather_output" else style)
                 for path, style in styles)


def loss_parallel_context(torch, plan: TensorParallelPlan | None) -> contextlib.AbstractContextManager:
    """torch's ``loss_parallel()`` where the plan keeps a head's logits split (its cross-entropy then
    runs on the split, forward and backward), else nothing."""
    if plan is None or not loss_parallel_of(plan.styles):
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel
    return loss_parallel()


def _refuse(degree: int, module: str, what: str) -> OptionError:
    return OptionError("tp", f"{module} has {what}, not divisible by {degree} ranks")


def _check_divisible(torch, modules: dict[str, Any], styles: tuple[tuple[str, str], ...],
                     degree: int) -> tuple[tuple[str, int, int], ...]:
    """Refuse a degree that does not divide the heads, KV heads, a sharded Linear's dimension or
    an Embedding's rows; return the attention modules whose projections are sharded."""
    nn = torch.nn
    heads: dict[str, tuple[int, int]] = {}
    for path, style in styles:
        parent = path.rpartition(".")[0]
        attention = modules.get(parent)
        if style in _COLWISE and parent and _is_attention(parent) and attention is not None and parent not in heads:
            n_heads = configured_count(attention, ("num_heads", "num_attention_heads", "n_head", "heads"))
            if n_heads is not None:
                kv = configured_count(attention, ("num_key_value_heads", "num_kv_heads", "n_kv_heads")) or n_heads
                heads[parent] = (n_heads, kv)
                if n_heads % degree:
                    raise _refuse(degree, parent, f"{n_heads} attention heads")
                if kv % degree:
                    raise _refuse(degree, parent, f"{kv} key/value heads")
    for path, style in styles:
        module = modules[path]
        if isinstance(module, nn.Linear):
            if style in _COLWISE and module.out_features % degree:
                raise _refuse(degree, path, f"{module.out_features} output features (colwise)")
            if style in _ROWWISE and module.in_features % degree:
                raise _refuse(degree, path, f"{module.in_features} input features (rowwise)")
        elif isinstance(module, nn.Embedding):
            if style in _ROWWISE and module.num_embeddings % degree:
                raise _refuse(degree, path, f"{module.num_embeddings} rows (the vocabulary)")
            if style in _COLWISE and module.embedding_dim % degree:
                raise _refuse(degree, path, f"embedding dimension {module.embedding_dim}")
        elif style not in _NOTHING + _SEQUENCE:
            raise OptionError("tp", f"{path} is a {type(module).__name__}; the {style} style applies to Linear and "
                              "Embedding modules only")
    return tuple((p, h, kv) for p, (h, kv) in heads.items())


def _is_attention(path: str) -> bool:
    last = path.rpartition(".")[2].lower()
    return "attn" in last or "attention" in last


def configured_count(module, names: tuple[str, ...]) -> int | None:
    """A count a module knows (heads, experts, ...): the first of ``names`` that is its own positive
    integer attribute, else its config's."""
    for holder in (module, getattr(module, "config", None)):
        for name in names:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


@contextlib.contextmanager
def fake_process_group(torch, degree: int) -> Iterator[Any]:
    """A fake process group of ``degree`` ranks (this process rank 0) and its 1-D CPU device
    mesh, torn down afterwards so that a second capture in the process starts afresh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        raise StagesplitError("a torch.distributed process group is already initialised in this process; a "
                              "tensor-parallel capture sets up its own fake one")
    hook = sys.excepthook                 # torch prefixes every later traceback with [rank0]: put back after
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=degree)
    try:
        yield init_device_mesh("cpu", (degree,))
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


@contextlib.contextmanager
def propagation_unrecorded(state) -> Iterator[None]:
    """Pause the recorder (``state.paused``) while DTensor's sharding propagation runs.

    To learn an operation's output shape DTensor runs it on empty tensors of the global shapes
    under the fake mode it finds active (``detect_fake_mode``): under a capture that is the
    capture's own, so the recorder would count those tensors as the rank's. A real run does them
    in a fake mode of its own, which torch's MemTracker skips; here the propagation is wrapped
    and paused instead."""
    from torch.distributed.tensor import DTensor
    propagator = DTensor._op_dispatcher.sharding_propagator
    original = propagator._propagate_tensor_meta_non_cached

    def unrecorded(op_schema):
        was, state.paused = state.paused, True
        try:
            return original(op_schema)
        finally:
            state.paused = was

    propagator._propagate_tensor_meta_non_cached = unrecorded  # type: ignore[method-assign]  # (this instance only)
    try:
        yield
    finally:
        del propagator._propagate_tensor_meta_non_cached


def _stack_parent(plan: TensorParallelPlan, modules: dict[str, Any]) -> tuple[str, str] | None:
    """(the first block, the stack's parent) of the repeated stack the planned modules sit in:
    ``model.layers.0`` and ``model`` for ``model.layers.3.mlp.up_proj``."""
    for path, _ in plan.styles:
        atoms = path.split(".")
        for i, atom in enumerate(atoms):
            if atom.isdigit():
                stack = ".".join(atoms[:i])
                first = f"{stack}.0" if stack else "0"
                if first in modules:
                    return first, stack.rpartition(".")[0]
    return None


def _is_norm(module) -> bool:
    return type(module).__name__.endswith("Norm")


def torch_styles(torch, model, plan: TensorParallelPlan) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """The ``parallelize_module`` plan: module path -> torch ParallelStyle, and what sequence
    parallelism added (module path, what) for the profile's record."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )
    sp = plan.sequence_parallel
    modules = dict(model.named_modules())
    planned = dict(plan.styles)
    out: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for path, style in plan.styles:
        in_blocks = sp and _in_stack(path, plan, modules)
        if style in _COLWISE:
            kwargs: dict[str, Any] = {}
            if style == "colwise_gather_output":
                kwargs["output_layouts"] = Replicate()
            elif style == "colwise_loss_parallel":
                kwargs["output_layouts"], kwargs["use_local_output"] = Shard(-1), False
            if sp and (in_blocks or style in _HEADS):
                kwargs["input_layouts"] = Shard(1)
            out[path] = ColwiseParallel(**kwargs)
        elif style in _ROWWISE:
            kwargs = {}
            if style == "rowwise_split_input" or isinstance(modules[path], torch.nn.Embedding):
                kwargs["input_layouts"] = Replicate()   # token ids come whole (torch's default: Shard(-1))
            if in_blocks:
                kwargs["output_layouts"] = Shard(1)
            out[path] = RowwiseParallel(**kwargs)
        elif style in _SEQUENCE and sp:
            out[path] = SequenceParallel()
    if sp:
        found = _stack_parent(plan, modules)
        if found is None:
            raise OptionError("sequence_parallel", "the plan names no module inside a repeated stack of blocks "
                              "(model.layers.N...); sequence parallelism shards the stream between blocks")
        first, parent = found
        out[first] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                        use_local_output=True)
        extra.append((first, "input split on the sequence"))
        stack = first.rpartition(".")[0]
        blocks = [p for p in modules if p.startswith(stack + ".") and p.count(".") == first.count(".")]
        for block in blocks:
            for name, child in modules[block].named_children():
                path = f"{block}.{name}"
                if path in out:
                    continue
                if _is_norm(child):
                    out[path] = SequenceParallel()
                    extra.append((path, "SequenceParallel"))
                elif any(True for _ in child.parameters()) and not any(p.startswith(path + ".") for p in planned):
                    out[path] = _gathered(PrepareModuleInput, PrepareModuleOutput, Replicate, Shard)
                    extra.append((path, "input gathered, output split on the sequence"))
        head_sharded = any(not _in_stack(p, plan, modules) and s in _COLWISE for p, s in plan.styles)
        top = modules[parent] if parent in modules else model
        for name, child in top.named_children():
            path = f"{parent}.{name}" if parent else name
            if _is_norm(child) and path not in out:
                if head_sharded:
                    out[path] = SequenceParallel()
                    extra.append((path, "SequenceParallel"))
                else:
                    out[path] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                   use_local_output=True)
                    extra.append((path, "input gathered"))
    return out, tuple(extra)


def _gathered(PrepareModuleInput, PrepareModuleOutput, Replicate, Shard):
    """A module left whole inside a sequence-parallel block: gather its input, split its output."""
    from torch.distributed.tensor.parallel import ParallelStyle

    class Gathered(ParallelStyle):
        def _apply(self, module, device_mesh):
            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                               use_local_output=True)._apply(module, device_mesh)
            return PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),
                                       use_local_output=True)._apply(module, device_mesh)

    return Gathered()


def _in_stack(path: str, plan: TensorParallelPlan, modules: dict[str, Any]) -> bool:
    found = _stack_parent(plan, modules)
    if found is None:
        return False
    stack = found[0].rpartition(".")[0]
    return path.startswith(stack + ".")


def parallelize(torch, model, mesh, plan: TensorParallelPlan) -> tuple[list, tuple[tuple[str, str], ...]]:
    """Apply the plan with torch's ``parallelize_module``. Returns what it added to the modules
    (hooks and marks, each as (table, key): removed after the capture, so that the caller's model
    is left as it came) and sequence parallelism's additions."""
    from torch.distributed.tensor.parallel import parallelize_module
    styles, extra = torch_styles(torch, model, plan)
    before = {id(m): (set(m._forward_pre_hooks), set(m._forward_hooks)) for m in model.modules()}
    tied: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(parameter), []).append(name)
    parallelize_module(model, mesh, styles)
    _tie_again(model, [names for names in tied.values() if len(names) > 1])
    added: list[tuple[dict, Any]] = []
    for m in model.modules():
        pre, post = before.get(id(m), (set(), set()))
        added.extend((m._forward_pre_hooks, k) for k in set(m._forward_pre_hooks) - pre)
        added.extend((m._forward_hooks, k) for k in set(m._forward_hooks) - post)
        if "_distribute_module_applied" in vars(m):   # torch's mark: a later capture applies its plan again
            added.append((vars(m), "_distribute_module_applied"))
    return added, extra


def _tie_again(model, groups: list[list[str]]) -> None:
    """``parallelize_module`` gives each module it lays out a parameter of its own, so a tensor the model ties
    under several names (Gemma's embedding and head) becomes two: tie each group again, as the exported
    program does (exporters/torch_pipelining.py's ``tie_again``), where the names are laid out alike (a rank
    then holds one shard of it, as it runs)."""
    for names in groups:
        first = model.get_parameter(names[0])
        for name in names[1:]:
            other = model.get_parameter(name)
            if other is first or other.shape != first.shape or \
                    getattr(other, "placements", None) != getattr(first, "placements", None):
                continue
            path, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(path) if path else model, attribute, first)


def heads_per_rank(torch, model, plan: TensorParallelPlan) -> tuple[tuple[str, int, int], ...]:
    """(attention module, query heads, KV heads) a rank really holds: its local projection
    rows divided by the head dimension (the whole count where the projection is not sharded)."""
    modules = dict(model.named_modules())
    found = []
    for path, heads, kv in plan.heads:
        attention = modules[path]
        head_dim = getattr(attention, "head_dim", None)
        q = getattr(attention, "q_proj", None)
        k = getattr(attention, "k_proj", None)
        if isinstance(head_dim, int) and q is not None and k is not None:
            found.append((path, _local_rows(q.weight) // head_dim, _local_rows(k.weight) // head_dim))
        else:
            found.append((path, heads // plan.degree, kv // plan.degree))
    return tuple(found)


def _local_rows(weight) -> int:
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    return int(local.shape[0])
