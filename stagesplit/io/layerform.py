"""The simple per-layer profile form, mapped onto the full profile model.

Each layer gives weights, activations, output, other and workspace bytes and a compute figure.
The mapping builds a one-tile device (a GPU, or an IPU seen as one pool of memory) and a
timeline that reproduces how those bytes are live in a training (or inference) step:

* training: forward steps 0..L-1, then backward steps L..2L-1 in reverse layer order.
  ``weights`` and ``other`` are always live; ``activations`` are stashed from the layer's
  forward step to its backward step; ``workspace`` is live during the layer's own two steps;
  ``output`` is live from the layer's forward step to the next layer's forward step, and its
  gradient from the next layer's backward step to this layer's backward step.
* inference: one step per layer; activations and workspace live on their layer's step, the
  output from its step to the next layer's step.

So a stage's peak is the sum of its weights, other and stashed activations plus the largest
workspace and boundary tensors, and a cut between layers moves ``output`` bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.fields import FieldReader
from ..common.limits import MAX_BYTES, MAX_COMPUTE, MAX_STEPS
from .builder import ProfileBuilder
from .documents import byte_count, compute_figure, read_info, read_target
from .profile import COMPUTE_UNITS, Profile, ProfileInfo, Target

__all__ = ["LayerForm", "LayerSpec", "build_layer_profile", "layer_document", "layer_form", "one_tile",
           "profile_from_layer_document"]

_TOP = {"format", "version", "kind", "name", "description", "synthetic", "source", "compute_source", "warnings", "target",
        "compute_unit", "training", "layers", "shared", "precision",
        "batch_size"}
_LAYER_KEYS = {"name", "weights", "activations", "output", "other", "workspace", "compute"}
_BYTE_FIELDS = ("weights", "activations", "output", "other", "workspace")


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a per-layer profile (bytes, and compute in the profile's compute unit)."""

    name: str
    weights: int = 0
    activations: int = 0
    output: int = 0
    other: int = 0
    workspace: int = 0
    compute: float = 0.0


@dataclass(frozen=True)
class LayerForm:
    """What ``build_layer_profile`` made a profile from: its layers, training or inference, and
    the bytes no layer uses."""

    layers: tuple[LayerSpec, ...]
    training: bool
    shared_weights: int = 0
    shared_other: int = 0


def one_tile(target: Target) -> Target:
    """A per-layer profile has no per-tile detail: view the device as one pool of memory."""
    if target.tiles == 1:
        return target
    return Target(name=target.name, tiles=1, bytes_per_tile=target.device_bytes, clock_hz=target.clock_hz,
                  kind=target.kind, link_bytes_per_s=target.link_bytes_per_s, flops_per_s=target.flops_per_s,
                  memory_bytes_per_s=target.memory_bytes_per_s,
                  description=f"{target.description} (whole device as one memory pool)".strip())


def build_layer_profile(layers: Sequence[LayerSpec], target: Target, training: bool = True,
                        compute_unit: str = "flops", shared_weights: int = 0, shared_other: int = 0,
                        info: ProfileInfo | None = None, source: str | None = None) -> Profile:
    """Map per-layer figures onto the full profile model (see the module docstring)."""
    n = len(layers)
    if training:
        steps = [f"forward {l.name}" for l in layers] + [f"backward {l.name}" for l in reversed(layers)]
    else:
        steps = [l.name for l in layers]
    b = ProfileBuilder(one_tile(target), steps, compute_unit, info or ProfileInfo(source="layers"))

    def bwd(i: int) -> int:
        return 2 * n - 1 - i

    op_vars: list[list[int]] = [[] for _ in range(n)]      # forward (or only) op of each layer
    bwd_vars: list[list[int]] = [[] for _ in range(n)]
    for i, layer in enumerate(layers):
        own = []
        if layer.weights:
            own.append(b.variable(layer.weights, live="always", name=f"{layer.name}/weights"))
        if layer.other:
            own.append(b.variable(layer.other, live="always", name=f"{layer.name}/other"))
        if training:
            if layer.activations:
                own.append(b.variable(layer.activations, live=[(i, bwd(i) + 1)], name=f"{layer.name}/activations"))
            if layer.workspace:
                own.append(b.variable(layer.workspace, live=[(i, i + 1), (bwd(i), bwd(i) + 1)],
                                      name=f"{layer.name}/workspace"))
        else:
            for field in ("activations", "workspace"):
                if getattr(layer, field):
                    own.append(b.variable(getattr(layer, field), live=[(i, i + 1)], name=f"{layer.name}/{field}"))
        op_vars[i] += own
        bwd_vars[i] += own
        if layer.output:
            last = i == n - 1
            out = b.variable(layer.output, live=[(i, i + (1 if last else 2))], name=f"{layer.name}/output")
            op_vars[i].append(out)
            if not last:
                op_vars[i + 1].append(out)
            if training and not last:
                grad = b.variable(layer.output, live=[(bwd(i + 1), bwd(i) + 1)], name=f"{layer.name}/output_grad")
                bwd_vars[i + 1].append(grad)
                bwd_vars[i].append(grad)
    for i, layer in enumerate(layers):
        b.operation(f"{layer.name}/forward" if training else layer.name, first_step=i, last_step=i, vars=op_vars[i],
                    compute=layer.compute, layer=layer.name)
    if training:
        for i in reversed(range(n)):
            b.operation(f"{layers[i].name}/backward", first_step=bwd(i), last_step=bwd(i), vars=bwd_vars[i],
                        compute=0.0, layer=layers[i].name)
    if shared_weights:
        b.variable(shared_weights, live="always", name="shared/weights")
    if shared_other:
        b.variable(shared_other, live="always", name="shared/other")
    profile = b.build(source=source)
    # remembered with a fingerprint of what it determines: ``layer_form`` then needs no rebuild
    form = LayerForm(tuple(layers), training, int(shared_weights), int(shared_other))
    profile.__dict__[_FORM] = (form, _fingerprint(profile))
    return profile


def profile_from_layer_document(doc: dict, r: FieldReader) -> Profile:
    r.known_keys(doc, "", _TOP)
    target = read_target(r.get(doc, "target", ""), r)
    unit = r.choice(doc.get("compute_unit", "flops"), "compute_unit", COMPUTE_UNITS)
    training = r.boolean(doc.get("training", True), "training")
    specs = []
    seen: set[str] = set()
    for i, layer in enumerate(r.list(r.get(doc, "layers", ""), "layers", nonempty=True)):
        p = f"layers[{i}]"
        r.mapping(layer, p)
        r.known_keys(layer, p, _LAYER_KEYS)
        name = r.string(r.get(layer, "name", p), f"{p}.name")
        if name in seen:
            r.fail(f"{p}.name", "a layer name not used before", name)
        seen.add(name)
        values: dict[str, Any] = {f: byte_count(r, layer.get(f, 0), f"{p}.{f}") for f in _BYTE_FIELDS}
        specs.append(LayerSpec(name=name, compute=compute_figure(r, layer.get("compute", 0), f"{p}.compute"),
                               **values))
    if 2 * len(specs) > MAX_STEPS:
        r.fail("layers", f"at most {MAX_STEPS // 2:,} layers", len(specs))
    shared = r.mapping(doc.get("shared", {}), "shared")
    r.known_keys(shared, "shared", {"weights", "other"})
    shared_bytes = sum(byte_count(r, shared.get(k, 0), f"shared.{k}") for k in ("weights", "other"))
    gradients = sum(l.output for l in specs) if training else 0       # each output's gradient, same size
    byte_total = sum(getattr(l, f) for l in specs for f in _BYTE_FIELDS) + gradients + shared_bytes
    if byte_total > MAX_BYTES:
        r.fail("layers", f"byte counts summing to at most {MAX_BYTES:,} (1 PiB)", byte_total)
    if sum(l.compute for l in specs) > MAX_COMPUTE:
        r.fail("layers", f"compute figures summing to at most {MAX_COMPUTE:g}", sum(l.compute for l in specs))
    info = read_info(doc, r)
    if info.source == "json":
        info.source = "layers"
    return build_layer_profile(specs, target, training, unit,
                               shared_weights=r.integer(shared.get("weights", 0), "shared.weights"),
                               shared_other=r.integer(shared.get("other", 0), "shared.other"),
                               info=info, source=r.source)


def layer_document(layers: Sequence[LayerSpec], target: str | dict, training: bool = True,
                   compute_unit: str = "flops", name: str = "", description: str = "") -> dict:
    """A per-layer JSON document (what ``profile_from_layer_document`` reads)."""
    return {"format": "stagesplit-profile", "version": 1, "kind": "layers", "name": name,
            "description": description, "target": target, "training": training, "compute_unit": compute_unit,
            "layers": [{"name": l.name, **{f: getattr(l, f) for f in _BYTE_FIELDS}, "compute": l.compute}
                       for l in layers]}


def layer_form(profile: Profile) -> LayerForm | None:
    """The per-layer figures ``profile`` was built from by ``build_layer_profile``, or None when it
    is not exactly such a profile. The figures are read back by the variables' names and the
    profile is built again from them: only a profile whose variables, liveness and operations
    are equal to the rebuilt one's is recognised (so the closed-form costs of the per-layer form
    apply to it exactly)."""
    ops = profile.operations
    if profile.target.tiles != 1 or len(profile.programs) or not len(ops):
        return None
    remembered = profile.__dict__.get(_FORM)
    if remembered is not None and remembered[1] == _fingerprint(profile):
        return remembered[0]
    index: dict[str, int] = {}
    for v in range(len(profile.variables)):
        name = profile.variable_name(v)
        index[name] = -1 if name in index else v            # a name used twice: not recognised
    sizes = profile.variables.bytes

    def size(name: str) -> int:
        v = index.get(name, -2)
        return -1 if v == -1 else 0 if v == -2 else int(sizes[v])

    for training in (True, False):
        n = len(ops) // 2 if training else len(ops)
        if n == 0 or profile.num_steps != (2 * n if training else n) or (training and len(ops) % 2):
            continue
        names = ops.layer[:n]
        if any(not isinstance(x, str) for x in names) or len(set(names)) != n:
            continue
        layer_names = [x for x in names if isinstance(x, str)]         # every one (checked above)
        specs = tuple(LayerSpec(name, **{f: size(f"{name}/{f}") for f in _BYTE_FIELDS},
                                compute=float(ops.compute[i])) for i, name in enumerate(layer_names))
        shared = (size("shared/weights"), size("shared/other"))
        if min([*shared, *(getattr(l, f) for l in specs for f in _BYTE_FIELDS)]) < 0:
            return None
        rebuilt = build_layer_profile(specs, profile.target, training, profile.compute_unit, *shared)
        if _same_structure(profile, rebuilt):
            return LayerForm(specs, training, *shared)
    return None


_FORM = "_stagesplit_layer_form"


def _structure(p: Profile) -> tuple[np.ndarray, ...]:
    """The arrays the per-layer figures determine: variables (bytes, liveness), operations
    (steps, variables, programs)."""
    v, o = p.variables, p.operations
    return (v.bytes, v.tile, v.always_live, v.live_class, p.liveness.intervals.offsets, p.liveness.intervals.values,
            o.first_step, o.last_step, o.vars.offsets, o.vars.values, o.programs.values)


def _same_structure(p: Profile, q: Profile) -> bool:
    """The same variables (bytes, liveness) and operations (steps, variables, layers)."""
    return p.num_steps == q.num_steps and list(p.operations.layer) == list(q.operations.layer) and \
        all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(_structure(p), _structure(q)))


def _fingerprint(p: Profile) -> bytes:
    """A hash of the structure ``_same_structure`` compares."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{p.num_steps}\0{p.target.tiles}\0{len(p.programs)}\0".encode())
    h.update("\0".join("\1" if x is None else str(x) for x in p.operations.layer).encode("utf-8", "surrogatepass"))
    for array in _structure(p):
        h.update(b"|")
        h.update(np.ascontiguousarray(array, np.int64).tobytes())
    return h.digest()
