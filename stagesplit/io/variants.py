"""Profile variants as the user names them: several profiles of one model, each compiled with
another memory proportion (PopTorch's ``availableMemoryProportion``, optimum's
``matmul_proportion``), from which the solver chooses one per stage.

Two forms name them:

* on the command line, ``PROFILE=PROPORTION`` pairs: ``a.pop=0.2 b.pop=0.4 c.pop=0.6``;
* a variants file (YAML, read safely), paths relative to the file's folder and inside it::

      variants:
        - profile: bert-amp0.2.stagesplit
          proportion: 0.2
        - profile: bert-amp0.6.stagesplit
          proportion: 0.6
          name: amp0.6          # optional: the name plans and reports show (default: the path)
          debug: debug.cbor     # optional: a PopVision profile.pop's debug.cbor

Each proportion is in (0, 1] and differs from the others; no profile is named twice.
Whether the profiles are variants of one model (the same layers) is checked once they are
grouped into layers (``check_same_layers``).

Variants of another kind live in one file: ``ParallelVariants``, one rank's profile at each of
several tensor-parallel degrees (a capture given a list of degrees writes them; io/variantfile.py reads and
writes the file). They are not chosen per stage: each degree is a layout of its own, which the
layout search (plan/layouts.py) prices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.fields import FieldReader
from ..common.safeinput import confined_path, read_yaml_file
from ..common.text import show
from ..errors import OptionError, StagesplitError
from .profile import Profile

__all__ = ["VARIANT_FILE_SUFFIXES", "ParallelVariants", "VariantSource", "check_same_layers", "check_variants",
           "input_files", "is_variants_file", "parallel_degree", "parallel_variants", "read_variants_file",
           "variant_argument", "variants_from_arguments"]

#: a profile argument with one of these suffixes is a variants file
VARIANT_FILE_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class VariantSource:
    """One profile variant: its profile (a path, or a ``Profile`` in memory), the memory
    proportion it was compiled with, the name plans show, and a PopVision profile's debug.cbor."""

    profile: str | Profile
    proportion: float
    name: str
    debug: str | None = None

    @property
    def path(self) -> str | None:
        return self.profile if isinstance(self.profile, str) else self.profile.info.path


def is_variants_file(path: str | Path) -> bool:
    """Whether a profile argument names a variants file (by its suffix)."""
    return Path(str(path)).suffix.lower() in VARIANT_FILE_SUFFIXES


def variant_argument(text: str) -> tuple[str, float] | None:
    """``PROFILE=PROPORTION`` as (profile, proportion); None when ``text`` is not of that form
    (no ``=``, or what follows the last one is not a number: a plain profile path)."""
    path, sep, value = text.rpartition("=")
    if not sep or not path:
        return None
    try:
        proportion = float(value)
    except ValueError:
        return None
    return path, proportion


def _proportion_error(where: str, value: Any) -> str:
    return f"{where}: expected a memory proportion in (0, 1] (e.g. 0.2), got {show(str(value))}"


def variants_from_arguments(items: Sequence[str]) -> tuple[VariantSource, ...]:
    """The variants of ``PROFILE=PROPORTION`` command-line words (each checked)."""
    out = []
    for item in items:
        pair = variant_argument(item)
        if pair is None:
            raise StagesplitError(f"'{show(item)}': expected PROFILE=PROPORTION (every profile of a variants "
                                  "solve names its memory proportion, e.g. a.pop=0.2)")
        path, proportion = pair
        if not (0 < proportion <= 1) or not math.isfinite(proportion):
            raise StagesplitError(_proportion_error(f"'{show(item)}'", proportion))
        out.append(VariantSource(path, proportion, path))
    return check_variants(out, "the profile variants")


#: where a variants file's profiles must be (common/safeinput.py's ``confined_path``)
_WITHIN = "the variants file's folder"


def read_variants_file(path: str | Path) -> tuple[VariantSource, ...]:
    """The variants a YAML variants file lists (see the module docstring), every field checked:
    a bad one raises ``ProfileError`` naming the file and the field. Each path is relative to the
    file and stays inside its folder (no ``..``, no absolute path, no link that leads out): it
    is refused before anything opens it."""
    path = Path(path)
    doc = read_yaml_file(path, "variants file")
    r = FieldReader(str(path))
    r.mapping(doc, "document")
    r.known_keys(doc, "", {"variants"})
    items = r.list(r.get(doc, "variants", ""), "variants", nonempty=True)
    out = []
    for i, item in enumerate(items):
        where = f"variants[{i}]"
        r.mapping(item, where)
        r.known_keys(item, where, {"profile", "proportion", "name", "debug"})
        profile = r.string(r.get(item, "profile", where), f"{where}.profile")
        if not profile:
            r.fail(f"{where}.profile", "a profile path", profile)
        located = confined_path(profile, path.parent, str(path), f"{where}.profile", "a profile", within=_WITHIN)
        proportion = r.get(item, "proportion", where)
        if isinstance(proportion, bool) or not isinstance(proportion, (int, float)) or \
                not math.isfinite(proportion) or not 0 < proportion <= 1:
            r.fail(f"{where}.proportion", "a memory proportion in (0, 1] (e.g. 0.2)", proportion)
        name = r.string(item.get("name", profile), f"{where}.name")
        if not name.strip():
            r.fail(f"{where}.name", "a non-empty name", name)
        debug = item.get("debug")
        if debug is not None:
            debug = r.string(debug, f"{where}.debug")
            if not profile.lower().endswith(".pop"):
                r.fail(f"{where}.debug", "no debug.cbor: it goes with a PopVision profile.pop only", debug)
            debug = confined_path(debug, path.parent, str(path), f"{where}.debug", "a debug.cbor", within=_WITHIN)
        out.append(VariantSource(located, float(proportion), name, debug))
    return check_variants(out, show(str(path)))


def input_files(paths: Iterable[str | Path | None]) -> list[str]:
    """Every file a command reads through ``paths``: each path, and for a variants file, each
    profile and debug.cbor it lists (what an output must never replace). A variants file that
    cannot be read adds nothing here: reading it later reports why, before anything is written."""
    out: list[str] = []
    for path in paths:
        if not path:
            continue
        out.append(str(path))
        if is_variants_file(path):
            try:
                sources = read_variants_file(path)
            except StagesplitError:
                continue
            out += [x for s in sources for x in (s.path, s.debug) if x]
    return out


def check_variants(variants: Sequence[VariantSource], where: str) -> tuple[VariantSource, ...]:
    """Refuse (one line) a list of variants that names a profile, a proportion or a name twice."""
    variants = tuple(variants)
    if not variants:
        raise OptionError("profile", "expected at least one profile variant")
    for key, what in ((lambda v: v.path, "profile"), (lambda v: v.proportion, "proportion"),
                      (lambda v: v.name, "name")):
        seen: dict[Any, VariantSource] = {}
        for v in variants:
            k = key(v)
            if k is None:
                continue
            if k in seen:
                shown = f"{k:g}" if isinstance(k, float) else show(str(k))
                raise StagesplitError(f"{where}: the {what} {shown} is given twice (variants {show(seen[k].name)} "
                                      f"and {show(v.name)}): each variant is one compile of the model at its own "
                                      "memory proportion")
            seen[k] = v
    return variants


def check_same_layers(names: Sequence[str], layers: Sequence[Sequence[str]]) -> None:
    """Refuse (one line, naming the first difference) variants whose layers differ from the
    first variant's in count or name."""
    first = list(layers[0])
    for name, other in zip(names[1:], layers[1:]):
        other = list(other)
        if other == first:
            continue
        if len(other) != len(first):
            raise StagesplitError(f"variant {show(name)} has {len(other)} layers, the first variant "
                                  f"({show(names[0])}) {len(first)}: variants must be profiles of the same model "
                                  "(the same layers, compiled at different memory proportions)")
        i = next(i for i, (a, b) in enumerate(zip(first, other)) if a != b)
        raise StagesplitError(f"variant {show(name)}: layer {i} is '{show(other[i])}', in the first variant "
                              f"({show(names[0])}) '{show(first[i])}': variants must be profiles of the same model "
                              "(the same layer names in the same order)")


def parallel_degree(profile: Profile) -> int:
    """The tensor-parallel degree a profile is one rank of: its recorded layout's, else 1 (a
    profile of the whole model on one device)."""
    layout = profile.info.parallel_layout
    return layout.tensor_parallel if layout is not None else 1


@dataclass(frozen=True)
class ParallelVariants:
    """One model captured as one rank at each of several tensor-parallel degrees: one profile per
    degree, in ascending degree (made by ``parallel_variants``, which checks them). A file of one
    plain profile reads as one variant."""

    profiles: tuple[Profile, ...]

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(parallel_degree(p) for p in self.profiles)

    def of(self, degree: int) -> Profile:
        """The profile of ``degree`` (KeyError: none of that degree)."""
        for p in self.profiles:
            if parallel_degree(p) == degree:
                return p
        raise KeyError(degree)


def parallel_variants(profiles: Sequence[Profile], where: str) -> ParallelVariants:
    """The profiles as ``ParallelVariants``, sorted by degree; refused in one line naming ``where``
    (a file) where two are of one degree, or where their recorded layers differ (the capture
    groups every degree by the same module tree, so they are one model's only if they match)."""
    if not profiles:
        raise StagesplitError(f"{where}: expected at least one profile variant")
    ordered = sorted(profiles, key=parallel_degree)
    for a, b in zip(ordered, ordered[1:]):
        if parallel_degree(a) == parallel_degree(b):
            raise StagesplitError(f"{where}: two variants are rank profiles of tensor-parallel degree "
                                  f"{parallel_degree(a)}: expected one per degree")
    first = ordered[0].info.layer_grouping
    for p in ordered[1:]:
        grouping = p.info.layer_grouping
        if first is not None and grouping is not None and grouping.layers != first.layers:
            raise StagesplitError(f"{where}: the variant of tensor-parallel degree {parallel_degree(p)} has "
                                  f"{len(grouping.layers)} layers recorded, degree {parallel_degree(ordered[0])} "
                                  f"{len(first.layers)} (or other names): the variants must be one model's")
    return ParallelVariants(tuple(ordered))
