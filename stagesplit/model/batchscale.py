"""One rank's profile at another micro-batch size, from a capture at one size.

A capture runs one step at one batch size; the layout search also chooses the micro-batch size, so
it needs the step at others. Captures at several sizes are the exact answer; without them the
profile is scaled by the ratio ``r = new size / captured size`` with a rule that holds for the
models stagesplit captures (a stack of layers whose every activation has the batch as a dimension):

* **Activations scale, the model's state does not.** A variable of role ``other`` (activations,
  temporaries, the inputs, the loss) becomes ``ceil(bytes x r)`` unless only the optimizer's
  step uses it (its temporaries are per parameter, not per sample). Parameters, gradients,
  optimizer state and buffers keep their bytes.
* **Work scales.** Each forward, backward and recompute operation's FLOPs become ``x r`` (a matrix
  product's rows, attention's batch dimension: exactly linear); the optimizer's do not. The
  bytes an operation moves become its parameters' and state's bytes (read once whatever the batch)
  plus ``r`` x the rest.
* **Collectives of the forward and backward** carry ``x r`` bytes, each on its own mesh dimension
  (tensor parallelism's all-reduces and all-gathers of activations, context parallelism's key/value
  exchange, expert parallelism's all-to-alls of tokens: all per sample); the optimizer's stay.
* A profile captured rounded to the CUDA caching allocator's 512 bytes is rounded again.

Limits (docs/layouts.md): a tensor without a batch dimension that is not a parameter (a causal
mask or a rotary table built once per step for one sample, a scalar loss) is overstated by the
rule; cuBLAS and attention kernels run at another efficiency at another size, which the roofline
does not see; a ground truth measured at the captured size does not hold at another and is dropped.
Checked in tests/model/test_batchscale.py against captures at the other sizes.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np

from ..errors import OptionError
from ..io.profile import ROLES, Operations, Phase, Profile, Variables

__all__ = ["ALLOCATOR_UNIT", "scale_batch"]

#: the CUDA caching allocator's rounding (``stagesplit capture``'s default)
ALLOCATOR_UNIT = 512

_OTHER = ROLES.index("other")



def _scaled(values: np.ndarray, ratio: Fraction) -> np.ndarray:
    """``ceil(values x ratio)`` in exact integers (no float rounding on large byte counts)."""
    v = np.asarray(values, np.int64)
    return -((-v * ratio.numerator) // ratio.denominator)


def per_sample_variables(profile: Profile) -> np.ndarray:
    """A mask of the variables whose bytes grow with the batch: those computed from the step's
    inputs (``input[...]`` variables, and every variable an operation makes from one of them), less
    the gradients in waiting (a weight's gradient before it is added into ``.grad``: computed from
    the inputs, but of the weight's shape), found backwards as the variables whose every later use
    makes only gradients in waiting from it alone (a cast) or writes into a gradient, a view of the
    variable (the transpose a float32 linear layer's backward takes of its weight's gradient before
    adding it) deciding nothing. Kept on the profile: the layout
    search scales one rank's profile to every micro-batch size it tries (a third of a second each on
    a 70B capture)."""
    cached: np.ndarray | None = profile.__dict__.get("_per_sample_cache")
    if cached is not None:
        return cached
    v, ops = profile.variables, profile.operations
    n = len(v)
    role = np.zeros(n, np.int8) if v.role is None else np.asarray(v.role)
    grad = role == ROLES.index("grad")
    names = profile.names
    first_user = np.full(n, len(ops), np.int64)
    rows = ops.vars.row_ids()
    values = np.asarray(ops.vars.values, np.int64)
    np.minimum.at(first_user, values, rows)
    tainted = np.array([0 <= k < len(names) and names[k].startswith("input[") for k in np.asarray(v.name)], bool)
    seeds = tainted.copy()
    offsets = np.asarray(ops.vars.offsets, np.int64)
    made: list[list[int]] = [[] for _ in range(len(ops))]
    for o in range(len(ops)):
        used = values[offsets[o]:offsets[o + 1]]
        out = used[(first_user[used] == o) & ~seeds[used] & ~np.asarray(v.always_live)[used]]
        made[o] = out.tolist()
        if len(out) and tainted[used[first_user[used] < o]].any() | tainted[used[seeds[used]]].any():
            tainted[out] = True
    waiting = np.zeros(n, bool)
    consumers: list[list[int]] = [[] for _ in range(n)]
    for o in range(len(ops)):
        for x in values[offsets[o]:offsets[o + 1]].tolist():
            if first_user[x] < o:
                consumers[x].append(o)
    for o in range(len(ops) - 1, -1, -1):
        for x in made[o]:
            if not tainted[x] or not consumers[x]:
                continue
            ok = decided = False
            for c in consumers[x]:
                outs = made[c]
                used = values[offsets[c]:offsets[c + 1]]
                if outs:
                    # made from it alone (a cast), with parameters or constants at most: an operation that
                    # also reads another per-sample variable (an activation's gradient through a matrix
                    # product) makes something of its own
                    inputs = np.setdiff1d(used, np.asarray(outs + [x]))
                    ok = all(waiting[y] or grad[y] for y in outs) and not tainted[inputs].any()
                elif grad[used].any():
                    ok = True                       # added into a gradient
                elif (used == x).all():
                    continue                        # a view of it (a transpose), or itself changed in place
                else:
                    ok = False
                decided = True
                if not ok:
                    break
            waiting[x] = ok and decided
    mask = tainted & ~waiting
    mask.setflags(write=False)
    profile.__dict__["_per_sample_cache"] = mask
    return mask


def scale_batch(profile: Profile, ratio: Fraction | int) -> Profile:
    """``profile`` (one step at the captured micro-batch size) at ``ratio`` times that size, by the
    module's rule. The ratio 1 returns the profile itself."""
    ratio = Fraction(ratio)
    if ratio <= 0:
        raise OptionError("micro_batch_size", f"expected a positive ratio of micro-batch sizes, got {ratio}")
    if ratio == 1:
        return profile
    v, ops = profile.variables, profile.operations
    if v.role is None or not np.any(np.asarray(v.role) == _OTHER):
        raise OptionError("profile", "scaling a capture to another micro-batch size needs its variables' roles "
                          "(as stagesplit capture records them): capture it again, or capture at each size")
    role = np.asarray(v.role)
    phase = np.asarray(ops.phase)
    optimizer_op = phase == Phase.OPTIMIZER
    rows = ops.vars.row_ids()
    values = np.asarray(ops.vars.values, np.int64)
    grows = (role == _OTHER) & per_sample_variables(profile)
    nbytes = np.asarray(v.bytes, np.int64).copy()
    nbytes[grows] = _scaled(nbytes[grows], ratio)
    whole = np.asarray(v.bytes, np.int64)
    if len(whole) and whole.size and np.all(whole[whole > 0] % ALLOCATOR_UNIT == 0):
        nbytes[grows] = -(-nbytes[grows] // ALLOCATOR_UNIT) * ALLOCATOR_UNIT
    variables = Variables(bytes=nbytes, tile=v.tile, always_live=v.always_live, live_class=v.live_class,
                          name=v.name, role=v.role)
    per_sample = ~optimizer_op
    compute = np.asarray(ops.compute, float).copy()
    compute[per_sample] *= float(ratio)
    moved = np.asarray(ops.bytes_accessed, float).copy()
    # each operation moves its per-sample variables' bytes r times over, the rest once
    growing = np.bincount(rows, weights=(whole[values] * grows[values]).astype(float), minlength=len(ops))
    known = per_sample & np.isfinite(moved)
    moved[known] += (float(ratio) - 1) * np.minimum(growing[known], moved[known])
    operations = Operations(name=ops.name, debug_id=ops.debug_id, inputs=ops.inputs, first_step=ops.first_step,
                            last_step=ops.last_step, vars=ops.vars, programs=ops.programs, compute=compute,
                            layer=ops.layer, bytes_accessed=moved, phase=ops.phase)
    info = profile.info
    layout = info.parallel_layout
    if layout is not None and layout.collectives:
        layout = replace(layout, collectives=tuple(
            c if c.phase == "optimizer" else replace(c, bytes=int(_scaled(np.array([c.bytes]), ratio)[0]))
            for c in layout.collectives))
    size = f"{ratio.numerator}/{ratio.denominator}" if ratio.denominator > 1 else str(ratio.numerator)
    batch = info.batch_size * ratio if info.batch_size is not None else None
    info = replace(info, parallel_layout=layout, warnings=list(info.warnings),
                   batch_size=int(batch) if batch is not None and batch.denominator == 1 else None,
                   description=(info.description + f" (activations and work scaled x{size} to another micro-batch "
                                "size)").strip())
    return replace(profile, variables=variables, operations=operations, ground_truth=None, info=info)
