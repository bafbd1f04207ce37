"""The model's module tree read for its stacks of repeated blocks: where a pipeline splits.

A stack is an ``nn.ModuleList`` or ``nn.Sequential`` whose children are all of one class,
outermost first: a stack inside a block is part of the block; a block that only wraps a stack
gives way to that stack's blocks, unless the outer stack's blocks are identical, where frameworks
split. Each block is named by its module path (the child's index when there is one stack:
``transformer.h.3`` is layer ``3``; the path past the stacks' common prefix when there are
several: ``encoder.block.3``, ``decoder.block.0``), and ``tree_regex`` reads that naming back
from a capture's operation names. torch is passed in, never imported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ModuleStack", "module_stacks", "block_names", "tree_regex", "sequential_hint"]


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


def block_names(stacks: list[ModuleStack]) -> dict[str, str]:
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


def tree_regex(stacks: list[ModuleStack]) -> str:
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


def sequential_hint(torch, model) -> str:
    """A ``layer_regex`` to suggest when no stack or default-regex block was found: the children
    of the outermost nn.Sequential or nn.ModuleList with several children."""
    for path, module in model.named_modules():
        if isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList)) and len(module) > 1:
            lead = re.escape(path) + r"\." if path else ""
            children = [name for name, _ in module.named_children()]
            group = r"\d+" if all(c.isdigit() for c in children) else r"[^./]+"
            what = f"the {type(module).__name__} {path or '(the model itself)'}"
            return (f"; pass `layer_regex` '^{lead}({group})[./]' to make each of the {len(children)} children "
                    f"of {what} a layer")
    return "; pass `layer_regex` with a capture group for the block number"
