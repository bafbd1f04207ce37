"""Group operations into layers by regular expressions on their names (PopLiner semantics as
the baseline), in this order of rules:

1. an explicit layer given by the profile (per-layer profiles, PyTorch captures);
2. the layer regex's capture group found in the operation name (exactly one distinct layer);
3. failing that, found in its input tensor names (exactly one distinct layer);
4. an operation with no layer of its own and no layered inputs whose name marks it as a call
   or outlined function (``call_regex``) joins the layer of the operation that follows it;
5. an operation whose name or inputs match ``first_layer_regex`` (embeddings, a CNN stem)
   joins the first layer, and one whose name or inputs match ``last_layer_regex`` (the head,
   the loss) joins the last layer; a match on the name beats a match on the inputs, so a
   head that reads the tied embedding matrix still goes last;
6. everything else has no layer: it is *shared* (see the cost model for how it is counted).

Operations are taken in program order (the order of the profile's operation list).

A profile may record the grouping its source used (``ProfileInfo.layer_grouping``: captures
record theirs). Unless other grouping options are given, that grouping's regexes are used and
each layer's module path is the recorded one. Given other options, the operations are grouped
afresh from their names: the explicit layers the recorded grouping stored are then set aside.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum, IntEnum
from typing import Any, ClassVar

import numpy as np

from .common.layering import (
    DEFAULT_CALL_REGEX,
    DEFAULT_FIRST_LAYER_REGEX,
    DEFAULT_LAST_LAYER_REGEX,
    DEFAULT_LAYER_REGEX,
)
from .common.regex import Pattern, compile_regex
from .common.text import short_repr
from .common.validate import choice
from .errors import OptionError, ProfileError, StagesplitError
from .io.profile import LayerGrouping, Profile

__all__ = ["DEFAULT_CALL_REGEX", "DEFAULT_FIRST_LAYER_REGEX", "DEFAULT_LAST_LAYER_REGEX", "DEFAULT_LAYER_REGEX",
           "LOW_SHARE", "LayerAssignment", "LayerOptions", "LayerOrder", "Rule", "group_layers", "layer_keys",
           "module_path", "one_stack", "recorded_options"]

LOW_SHARE = 0.5


class Rule(IntEnum):
    """Which grouping rule gave an operation its layer (or why it has none)."""

    EXPLICIT = 0
    NAME = 1
    INPUTS = 2
    FOLLOWING_CALL = 3
    FIRST_LAYER = 4
    LAST_LAYER = 5
    NO_LAYER = 6
    MULTIPLE_INPUT_LAYERS = 7

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


class LayerOrder(str, Enum):
    """How layers are ordered: by the program steps they run at, or by natural sort of their names."""

    STEPS = "steps"
    NATURAL = "natural"


@dataclass(frozen=True)
class LayerOptions:
    """How operations are grouped into layers (see the module docstring for the rules)."""

    layer_regex: str = DEFAULT_LAYER_REGEX
    first_layer_regex: str = DEFAULT_FIRST_LAYER_REGEX
    last_layer_regex: str = DEFAULT_LAST_LAYER_REGEX
    call_regex: str = DEFAULT_CALL_REGEX
    order: LayerOrder = LayerOrder.STEPS

    #: the four patterns' fields (each also the parameter an error about it names)
    REGEX_FIELDS: ClassVar[tuple[str, ...]] = ("layer_regex", "first_layer_regex", "last_layer_regex", "call_regex")

    def __post_init__(self) -> None:
        for name in self.REGEX_FIELDS:
            if not isinstance(getattr(self, name), str):
                raise OptionError(name, f"expected a regular expression (a string), got {short_repr(getattr(self, name))}")
        object.__setattr__(self, "order", choice(LayerOrder, "layer_order", self.order))

    def to_record(self) -> dict[str, str]:
        """The options as plain JSON values."""
        return {"layer_regex": self.layer_regex, "first_layer_regex": self.first_layer_regex,
                "last_layer_regex": self.last_layer_regex, "call_regex": self.call_regex, "order": self.order.value}

    @classmethod
    def from_record(cls, record: Any, source: str, prefix: str) -> LayerOptions:
        """Options a plan recorded, each field checked (``ProfileError`` naming ``source`` and the field)."""
        if not isinstance(record, Mapping):
            raise ProfileError(source, prefix, "a mapping of layer-grouping options", type(record).__name__)
        known = {f.name for f in fields(cls)}
        for key in record:
            if key not in known:
                raise ProfileError(source, f"{prefix}.{key}", "one of " + ", ".join(sorted(known)))
        try:
            return cls(**record)
        except OptionError as exc:
            field_name = "order" if exc.parameter == "layer_order" else exc.parameter
            raise ProfileError(source, f"{prefix}.{field_name}", exc.detail.removeprefix("expected ")) from None

    def compiled(self) -> tuple[Pattern, Pattern, Pattern, Pattern]:
        """The four patterns, compiled for linear-time matching (RE2: see stagesplit/regex.py)."""
        out = []
        for name in self.REGEX_FIELDS:
            out.append(compile_regex(getattr(self, name), name, name))
        return out[0], out[1], out[2], out[3]


@dataclass
class LayerAssignment:
    """The layer of every operation. ``op_layer[i]`` indexes ``names`` (-1: no layer)."""

    names: list[str]
    op_layer: np.ndarray
    op_rule: np.ndarray
    options: LayerOptions
    warnings: list[str] = field(default_factory=list)
    #: each layer's module path (e.g. ``transformer.h.3``, ``bert/encoder/layer3``) derived from
    #: its operations' names, or None where the names do not give one (see ``module_path``)
    module_paths: list[str | None] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.names)

    @property
    def share_assigned(self) -> float:
        return float(np.mean(self.op_layer >= 0)) if len(self.op_layer) else 0.0

    def ops_in(self, layer: int) -> np.ndarray:
        """Indices of the operations assigned to ``layer``."""
        return np.flatnonzero(self.op_layer == layer)

    def calls_with_multiple_input_layers(self, profile: Profile) -> list[np.intp]:
        """Call operations whose inputs come from more than one layer (grouping warnings)."""
        call = self.options.compiled()[3]
        return [i for i in np.flatnonzero(self.op_rule == Rule.MULTIPLE_INPUT_LAYERS)
                if call.search(profile.operations.name[i])]


def layer_keys(pattern: Pattern, text: str) -> set[str]:
    """The distinct keys (capture groups joined) the layer regex finds in ``text``."""
    found = set()
    for m in pattern.findall(text):
        key = "".join(m) if isinstance(m, tuple) else m
        if key:
            found.add(key)
    return found


def _natural_key(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


_SEPARATORS = "./"


def module_path(names: list[str], key: str, layer_re: Pattern) -> str | None:
    """The module path of a layer whose own operations (grouped by the layer regex on their
    names) are ``names``: the longest common dotted/slashed prefix of the names, cut after the
    last token where the layer regex matches ``key``. ``["transformer.h.3.attn/aten.mm",
    "transformer.h.3.mlp/aten.mm"]`` gives ``transformer.h.3``. None when there is no such
    token: frameworks need the real path, so it is never guessed."""
    if not names:
        return None
    prefix = names[0]
    for name in names[1:]:
        n = 0
        for a, b in zip(prefix, name):
            if a != b:
                break
            n += 1
        prefix = prefix[:n]
    if not all(len(name) == len(prefix) or name[len(prefix)] in _SEPARATORS for name in names):
        cut = max(prefix.rfind(c) for c in _SEPARATORS)
        prefix = prefix[:max(cut, 0)]
    end = None
    for m in layer_re.finditer(prefix + "/"):          # a separator after the prefix, as in the names
        groups = m.groups()
        found = "".join(g for g in groups if g) if groups else m.group(0)
        if found != key:
            continue
        # the block ends where the match ends, or where its last group ends when the pattern
        # goes on to match the separator after it (``^(\d+)[./]``)
        last_group = max((m.end(g) for g in range(1, len(groups) + 1) if m.start(g) >= 0), default=m.end())
        for candidate in (m.end(), last_group):
            if candidate <= len(prefix) and (candidate == len(prefix) or prefix[candidate] in _SEPARATORS):
                end = candidate
                break
    if end is None:
        return None
    return prefix[:end].lstrip(_SEPARATORS) or None


def recorded_options(grouping: LayerGrouping) -> LayerOptions:
    """The grouping options a recorded grouping stands for."""
    return LayerOptions(layer_regex=grouping.layer_regex, first_layer_regex=grouping.first_layer_regex,
                        last_layer_regex=grouping.last_layer_regex, call_regex=grouping.call_regex,
                        order=grouping.order)  # type: ignore[arg-type]  # a name: __post_init__ checks it


def group_layers(profile: Profile, options: LayerOptions | None = None) -> LayerAssignment:
    """Assign every operation of ``profile`` to a layer (see the module docstring)."""
    grouping = profile.info.layer_grouping
    recorded = None
    if grouping is not None:
        recorded = recorded_options(grouping)
        if options is None or options == LayerOptions() or options == recorded:
            options = recorded                   # the profile's own grouping
        else:
            recorded = None                      # other options: regroup from the names
    options = options or LayerOptions()
    layer_re, first_re, last_re, call_re = options.compiled()
    ops = profile.operations
    n = len(ops)
    keys: list[str | None] = [None] * n
    rules = np.full(n, Rule.NO_LAYER, np.int8)
    explicit = ops.layer if grouping is None or recorded is not None else [None] * n

    for i in range(n):
        if explicit[i] is not None:
            keys[i], rules[i] = explicit[i], Rule.EXPLICIT
            continue
        name = ops.name[i]
        from_name = layer_keys(layer_re, name)
        if len(from_name) == 1:
            keys[i], rules[i] = from_name.pop(), Rule.NAME
            continue
        from_inputs: set[str] = set()
        for tensor in ops.inputs[i]:
            from_inputs |= layer_keys(layer_re, tensor)
        if len(from_inputs) == 1:
            keys[i], rules[i] = from_inputs.pop(), Rule.INPUTS
        elif not from_inputs and call_re.search(name):
            rules[i] = Rule.FOLLOWING_CALL
        elif last_re.search(name):
            rules[i] = Rule.LAST_LAYER
        elif first_re.search(name) or any(first_re.search(t) for t in ops.inputs[i]):
            rules[i] = Rule.FIRST_LAYER
        elif any(last_re.search(t) for t in ops.inputs[i]):
            rules[i] = Rule.LAST_LAYER
        elif len(from_inputs) > 1:
            rules[i] = Rule.MULTIPLE_INPUT_LAYERS

    placeholder = {Rule.FIRST_LAYER: "\0first", Rule.LAST_LAYER: "\0last"}
    following: str | None = None
    for i in reversed(range(n)):
        if rules[i] == Rule.FOLLOWING_CALL:
            if following is None:
                rules[i] = Rule.NO_LAYER
            elif following in placeholder.values():
                rules[i] = Rule.FIRST_LAYER if following == "\0first" else Rule.LAST_LAYER
            else:
                keys[i] = following
            continue
        following = keys[i] if keys[i] is not None else placeholder.get(Rule(rules[i]))

    distinct = {k for k in keys if k is not None}
    if not distinct:
        sample = ", ".join(short_repr(s) for s in ops.name[:3])
        raise StagesplitError(
            f"the layer regex '{options.layer_regex}' matched no operation or input name "
            f"(operations are named like {sample}); pass `layer_regex` with a capture group for the layer")
    if options.order == "natural":
        names = sorted(distinct, key=_natural_key)
    else:
        first_seen: dict[str, tuple[int, int]] = {}
        for i, k in enumerate(keys):
            if k is None:
                continue
            step = int(ops.first_step[i]) if ops.first_step[i] >= 0 else np.iinfo(np.int64).max
            first_seen[k] = min(first_seen.get(k, (step, i)), (step, i))
        names = sorted(distinct, key=lambda k: first_seen[k])
    index = {k: j for j, k in enumerate(names)}
    op_layer = np.array([index[k] if k is not None else -1 for k in keys], np.int64)
    op_layer[rules == Rule.FIRST_LAYER] = 0
    op_layer[rules == Rule.LAST_LAYER] = len(names) - 1

    # module paths come from the operations the layer regex places by name, and from explicitly
    # layered ones (captures) whose names the regex reads as the same layer
    # (only for the layers whose paths the source did not record: the regex over every operation's
    # name takes seconds on a capture of tens of thousands of operations)
    derive = np.ones(len(names), bool)
    if recorded is not None:
        assert grouping is not None              # recorded options come from the profile's grouping
        derive = np.array([key not in grouping.layers for key in names], bool)
    own = rules == Rule.NAME
    for e in np.flatnonzero(rules == Rule.EXPLICIT):
        if op_layer[e] >= 0 and derive[op_layer[e]]:
            own[e] = layer_keys(layer_re, ops.name[e]) == {keys[e]}
    paths = [module_path([ops.name[i] for i in np.flatnonzero(own & (op_layer == j))], key, layer_re)
             if derive[j] else None for j, key in enumerate(names)]
    if recorded is not None:                     # the source knew the paths: they are not re-derived
        assert grouping is not None
        paths = [grouping.module_path_of(key) if key in grouping.layers else path for key, path in zip(names, paths)]
    assignment = LayerAssignment(names=names, op_layer=op_layer, op_rule=rules, options=options, module_paths=paths)
    share = assignment.share_assigned
    if share < LOW_SHARE:
        assignment.warnings.append(
            f"only {share:.0%} of operations got a layer: the model may lack layer names, or `layer_regex` "
            f"('{options.layer_regex}') does not fit them")
    if assignment.calls_with_multiple_input_layers(profile):
        assignment.warnings.append(
            "calls with inputs from several layers were found; outlining has merged layers. Recompile the "
            f"profile with POPART_POPLINER_OUTLINER_REGEX='{options.layer_regex}'")
    return assignment


def one_stack(paths: Sequence[str | None]) -> bool:
    """Whether the layers are the blocks of one stack, in order (``model.layers.0`` ...
    ``model.layers.{L-1}``; slashed name scopes read as dots)."""
    if not paths or any(not isinstance(p, str) for p in paths):
        return False
    dotted = [p.replace("/", ".") for p in paths if isinstance(p, str)]     # every one is (above)
    stack = dotted[0].rpartition(".")[0]
    return bool(stack) and dotted == [f"{stack}.{i}" for i in range(len(dotted))]
