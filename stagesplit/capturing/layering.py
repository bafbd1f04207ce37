"""Which layer each captured operation belongs to, and the grouping recorded in the profile.

By default the layers are the blocks of the model's module stacks (``modulestacks``). Each
operation belongs to the block whose module runs it; one outside every block (embeddings, a final
norm, the head, the loss, the root module's own code) to the block that ran last before it in the
forward pass, or the first block when none has run yet, which is where a pipeline split at a
block's beginning puts it; one outside every block in the backward, a re-run or the optimizer step
to the layer of the forward operation it stems from (its anchor). A model without such stacks is
grouped by the default layer regex; ``layer_regex`` groups by the user's regex instead. The
grouping (the regexes that read it from the operation names, each layer's module path, and the
operations those regexes would place elsewhere, stored explicitly) is recorded in the profile
(``ProfileInfo.layer_grouping``) for every later command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..io.profile import LayerGrouping
from ..layers import LayerOptions, group_layers, layer_keys
from .modulestacks import ModuleStack, block_names, tree_regex

__all__ = ["Layering", "layer_operations", "record_grouping"]


@dataclass
class Layering:
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
    forward_keys = [k for i in range(S) if ops[i].phase == "forward" and (k := own_key[i]) is not None]
    first_key = forward_keys[0]
    last_key = max(first_seen, key=first_seen.__getitem__)
    positional: list[str] = [first_key] * S
    current = first_key
    for i in range(S):
        if ops[i].phase in ("forward", "loss"):
            k = own_key[i]
            if k is not None:
                current = k
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


def _tree_layering(ops, labels: list[str], names: list[str], anchors, stacks: list[ModuleStack]) -> Layering | None:
    """Group by the blocks of the module stacks; None when no block runs in the forward pass."""
    block_name = block_names(stacks)
    cache: dict[str, str | None] = {}

    def block_of(label: str) -> str | None:
        if label not in cache:
            parts = label.split(".")
            cache[label] = next((".".join(parts[:k]) for k in range(len(parts), 0, -1)
                                 if ".".join(parts[:k]) in block_name), None)
        return cache[label]

    blocks = [block_of(label) for label in labels]
    ran = {b for i in range(len(ops)) if ops[i].phase == "forward" and (b := blocks[i]) is not None}
    if not ran:
        return None
    own_key = [block_name[b] if b is not None and b in ran else None for b in blocks]
    target, _, _ = _positional(ops, own_key, anchors)
    options = LayerOptions(layer_regex=tree_regex(stacks))
    explicit = _unplaced(names, target, options)
    return Layering(target, explicit, options, "module-tree", {block_name[b]: b for b in ran})


def _unplaced(names: list[str], target: list[str | None], options: LayerOptions) -> list[str | None]:
    """The explicit layer of every operation the options would not place in its target layer
    from its name (layers.group_layers' rules for a capture's operations, which have no inputs)."""
    layer_re, first_re, last_re, call_re = options.compiled()
    first_seen: dict[str, int] = {}
    for i, k in enumerate(target):
        if k is not None:
            first_seen.setdefault(k, i)
    order = sorted(first_seen, key=first_seen.__getitem__)
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


def _regex_layering(ops, names: list[str], anchors, options: LayerOptions, stamp_all: bool) -> Layering | None:
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
    return Layering(target, explicit, options, "regex")


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
    return [f"`layer_regex` '{options.layer_regex}' gives blocks of different module paths the same layer name, so "
            f"they become one layer: {' and '.join(found[:3])} are {'both' if len(found) == 2 else 'all'} "
            f"layer '{key}' "
            f"({len(clashes)} such name(s)); "
            f"use a regex whose groups tell them apart, e.g. '{tree_regex(stacks)}', or leave `layer_regex` out "
            "to group by the module tree"]


def layer_operations(ops, labels: list[str], names: list[str], anchors: list[int | None],
                     layer_options: LayerOptions | None, stacks: list[ModuleStack], hint: str
                     ) -> tuple[Layering | None, list[str]]:
    """The layering of the captured operations (their module paths ``labels``, ``names`` and
    ``anchors``) and the warnings it gives: by the user's ``layer_options`` when given, else by
    the module tree's ``stacks``, else by the default layer regex; None when none finds a block."""
    warnings_: list[str] = []
    layering: Layering | None = None
    if layer_options is not None:
        layering = _regex_layering(ops, names, anchors, layer_options, stamp_all=True)
        if layering is not None and stacks:
            warnings_.extend(_collisions(labels, names, stacks, layer_options))
        if layering is None:
            warnings_.append(f"`layer_regex` '{layer_options.layer_regex}' found no block in the module names "
                             f"(e.g. {names[0]}){hint}")
    else:
        layering = _tree_layering(ops, labels, names, anchors, list(stacks)) if stacks else None
        if layering is None:
            layering = _regex_layering(ops, names, anchors, LayerOptions(), stamp_all=False)
        if layering is None:
            warnings_.append(f"no repeated blocks (nn.ModuleList or nn.Sequential children of one class) and no "
                             f"block the layer regex '{LayerOptions().layer_regex}' reads were found in the module "
                             f"names (e.g. {names[0]}){hint}")
    return layering, warnings_


def record_grouping(profile, layering: Layering) -> None:
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
