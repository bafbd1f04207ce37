"""optimum-graphcore: an ``IPUConfig`` whose ``layers_per_ipu`` counts the model's transformer
layers per IPU.

optimum expands ``layers_per_ipu`` against the model's own transformer layers
(``modeling_utils._expand_layers_per_ipu_wildcard``: the counts must sum to that number, else
``IncompatibleIPUConfigError``) and places everything else itself in each model's
``parallelize()``: the embeddings on IPU 0; GPT-2's LM head, tied to the token embedding, on
IPU 0 as well; classification heads on the last IPU. So a plan layer that is the embedding or
the head (by the plan's first-/last-layer regexes) is not counted. Stage k runs on IPU k.
``matmul_proportion`` defaults to 0.2 in optimum (``IPUConfig.__init__``); a list gives one per
IPU: for a plan solved on profile variants, the proportion of the variant each stage was priced
with; otherwise, with a headroom, the default scaled down. Inference uses the ``inference_*``
fields (optimum runs inference sharded).
"""

from __future__ import annotations

import ast

from ..common.text import show
from ._common import Decoded, ExportOptions, from_counts, pipelined_accumulation
from ._plan_view import PlanView
from .poptorch import memory_proportions
from .render import RenderCheckError, comment, py_literal

__all__ = ["NAME", "DESCRIPTION", "OPTIMUM_MATMUL_PROPORTION", "render", "read_back"]

NAME = "optimum-ipu"
DESCRIPTION = "optimum-graphcore IPUConfig: layers_per_ipu (transformer layers), ipus_per_replica, matmul_proportion"
#: optimum-graphcore's default IPUConfig.matmul_proportion (optimum/graphcore/ipu_configuration.py)
OPTIMUM_MATMUL_PROPORTION = 0.2


def _roles_note(view: PlanView) -> str:
    roles = []
    if view.embedding:
        roles.append(f"the plan's layer '{comment(view.layer_names[0])}' is the embedding")
    if view.head:
        roles.append(f"'{comment(view.layer_names[-1])}' is the head")
    return ("; ".join(roles) + ": not counted; every other plan layer is one transformer layer") if roles else \
        "every plan layer is one transformer layer (the embeddings and head run where optimum puts them)"


def render(view: PlanView, options: ExportOptions) -> list[str]:
    view.one_stage_per_device(NAME)
    p = len(view.stages)
    if list(view.devices) != list(range(p)):
        raise view.error(f"optimum-ipu places stage k on IPU k; this plan puts its stages on devices "
                         f"{list(view.devices)}")
    counts = view.decoder_counts()
    if sum(counts) < 1:
        raise view.error(f"optimum-ipu: the plan has no transformer layer besides the embedding "
                         f"'{show(view.layer_names[0])}' and the head")
    prefix = "" if options.training else "inference_"
    lines = ["from optimum.graphcore import IPUConfig", "",
             f"# layers_per_ipu counts the model's {sum(counts)} transformer layers per IPU; {_roles_note(view)}",
             "# optimum places the rest in the model's parallelize(): embeddings on IPU 0, GPT-2's tied LM head on "
             "IPU 0 too, classification heads on the last IPU",
             "ipu_config = IPUConfig(",
             f"    {prefix}ipus_per_replica={p},",
             f"    {prefix}layers_per_ipu={py_literal(counts)},"]
    proportions = memory_proportions(view, OPTIMUM_MATMUL_PROPORTION)
    if proportions and view.memory_proportions is not None:
        lines.append(f"    {prefix}matmul_proportion={py_literal([float(p) for p in proportions.values()])},   # "
                     "per IPU: the profile variant its stage was priced with")
    elif proportions:
        lines.append(f"    {prefix}matmul_proportion={py_literal(list(proportions.values()))},   # optimum's default "
                     f"{OPTIMUM_MATMUL_PROPORTION} x (1 - the plan's headroom {view.headroom:.0%})")
    if options.training:
        lines.append(f"    gradient_accumulation_steps={pipelined_accumulation(view)},   # pipelined training: "
                     f">= 2 x {p} - 1")
    lines.append(")")
    return lines


def read_back(tree: ast.Module, view: PlanView, options: ExportOptions) -> Decoded:
    calls = [n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
             and isinstance(n.value.func, ast.Name) and n.value.func.id == "IPUConfig"]
    if len(calls) != 1 or calls[0].args:
        raise RenderCheckError("expected one IPUConfig(...) call with keyword arguments")
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in calls[0].keywords}
    prefix = "" if options.training else "inference_"
    counts = list(kwargs[f"{prefix}layers_per_ipu"])
    if kwargs[f"{prefix}ipus_per_replica"] != len(counts):
        raise RenderCheckError("ipus_per_replica differs from the length of layers_per_ipu")
    counts[0] += view.embedding
    counts[-1] += view.head
    if view.memory_proportions is not None and kwargs.get(f"{prefix}matmul_proportion") != \
            list(view.memory_proportions):
        raise RenderCheckError(f"{prefix}matmul_proportion is {kwargs.get(f'{prefix}matmul_proportion')}, the plan's "
                               f"stages say {list(view.memory_proportions)}")
    return Decoded(from_counts(counts), tuple(range(len(counts))))
