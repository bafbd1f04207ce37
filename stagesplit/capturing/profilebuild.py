"""The recorded step turned into a full-form profile.

One variable per storage, its bytes rounded up like the CUDA caching allocator: parameters,
buffers, gradients and optimizer states always live (pipelined training accumulates gradients
over micro-batches, so the step runs with gradients already allocated, as every micro-batch but
the first does), everything else for its half-open live interval. One operation per recorded
aten call, named ``<module path>/aten.<op>`` in the forward pass, ``<module path>/backward/aten.<op>``
in the backward, ``<module path>/recompute/aten.<op>`` for a forward re-run by activation
checkpointing and ``<module path>/optimizer/aten.<op>`` in the optimizer step (the module owning
the parameter it updates), each with its phase and its layer (``layering``).

A parameter used by several modules (tied embeddings) is one variable, named with all its names;
its gradient and optimizer state are attached to every operation that uses it, so every stage
holding one of those operations counts them, once, as the full form's rules say.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import replace

from ..io.profile import Phase, ProfileInfo, TrainingPrecision
from ..layers import LayerOptions
from .layering import layer_operations, record_grouping
from .modulestacks import ModuleStack
from .recorder import ROOT, backward_phases

__all__ = ["ALWAYS_KINDS", "build_profile", "peak_bytes", "round_up"]

ALWAYS_KINDS = ("param", "buffer", "grad", "state")
#: each storage kind's ``Variables.role`` (inputs and activations are "other")
_ROLE_OF_KIND = {"param": "param", "buffer": "buffer", "grad": "grad", "state": "state"}


def _round(nbytes: int, unit: int) -> int:
    return nbytes if unit <= 1 else -(-nbytes // unit) * unit


def build_profile(rec, target, layer_options: LayerOptions | None, allocator_round: int, name: str, source: str, *,
                  dtype: str, amp: bool, optimizer: str, master_weights: bool = False, torch_version: str,
                  autocast_dtype=None,
                  stacks: Sequence[ModuleStack] = (), hint: str = "", layout=None, kernels: str = "",
                  context=None, expert=None):
    """The full-form Profile of the step the recorder ``rec`` saw, on ``target``: the operations
    named and placed in layers (by ``layer_options``, else the module tree's ``stacks``; ``hint``
    ends the warning when neither finds a block), the storages as variables; the rest describes
    the capture in the profile's info; ``layout`` (the tensor-parallel plan, sequence
    parallelism's additions and the heads a rank holds) with the collectives the recorder saw
    becomes the info's ``parallel_layout``; so does ``context`` (a context-parallel capture's
    ``contextparallel.ContextParallel``), each collective named by the mesh dimension its group
    spans."""
    from ..io.builder import ProfileBuilder
    from ..io.profile import Collective, ParallelLayout
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

    layering, warnings_ = layer_operations(ops, labels, names, anchors, layer_options, list(stacks), hint)

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
    recorded = TrainingPrecision(parameters="float32" if amp else dtype,
                                 autocast=str(autocast_dtype).replace("torch.", "") if amp else "",
                                 master_weights=master_weights)
    precision = recorded.describe()
    parallel = None
    groups = context.groups if context is not None else {}
    collectives = tuple(Collective(c.op, c.kind, c.nbytes, c.group_size, c.phase,
                                   groups.get(c.group, "ep" if c.group == "ep" else "tp")) for c in rec.collectives)
    if layout is not None:
        plan, additions, heads = layout
        parallel = ParallelLayout(plan.degree, plan.sequence_parallel, plan.source, plan.styles, tuple(additions),
                                  tuple(heads), collectives)
        precision += (f", rank 0 of {plan.degree} tensor-parallel ranks"
                      f"{' with sequence parallelism' if plan.sequence_parallel else ''} ({plan.source})")
    if context is not None:
        parallel = replace(parallel or ParallelLayout(collectives=collectives), context_parallel=context.degree,
                           cp_load_balanced=context.load_balanced)
        precision += (f", rank 0 of {context.degree} context-parallel ranks (the sequence of {context.sequence} "
                      f"{'in head and tail chunks' if context.load_balanced else 'in contiguous shards'}, attention "
                      "as torch's ring attention)")
    if expert is not None:
        from .expertparallel import describe
        parallel = replace(parallel or ParallelLayout(collectives=collectives), expert_parallel=expert.degree,
                           experts=expert.experts)
        precision += ", " + describe(expert)
    b = ProfileBuilder(target, S, compute_unit="flops", info=ProfileInfo(
        name=name, source="pytorch",
        description=(f"one training step captured under torch FakeTensorMode on CPU (torch {torch_version}): "
                     f"{precision}, optimizer {optimizer}, "
                     f"storages rounded to {allocator_round} bytes; from {source}"
                     + (f"; {kernels}" if kernels else "")),
        compute_source="FLOPs from torch.utils.flop_counter's formulas and stagesplit's for the attention and "
                       "grouped matrix kernels torch has none for (matrix products, convolutions, attention; other "
                       "operations count 0)",
        warnings=warnings_))
    var_of: list[int] = []
    for st in rec.storages:
        nbytes = _round(st.nbytes, allocator_round)
        if st.kind in ALWAYS_KINDS:
            var_of.append(b.variable(nbytes, 0, "always", st.name, role=_ROLE_OF_KIND[st.kind]))
        else:
            end = st.end if st.end >= 0 else S
            var_of.append(b.variable(nbytes, 0, [(min(st.start, S), max(end, min(st.start, S)))], st.name,
                                     role="other"))

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
    profile.info.parallel_layout = parallel
    profile.info.precision = recorded
    profile.operations.phase = _phases(rec)
    profile.validate(source)
    if layering is not None:
        record_grouping(profile, layering)
    return profile


def _phases(rec):
    import numpy as np
    phase_of = {"forward": Phase.FORWARD, "loss": Phase.FORWARD, "optimizer": Phase.OPTIMIZER,
                "recompute": Phase.RECOMPUTE}
    backward = backward_phases(rec)
    return np.array([backward.get(i, phase_of.get(op.phase, Phase.UNKNOWN)) for i, op in enumerate(rec.ops)], np.int8)


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
