"""A GPU target's node: how many GPUs share one, and the bandwidth and latency of their links
inside it and across nodes (configs/targets.yaml's ``node`` field; its sources are listed there
and in docs/layouts.md). Kept apart from ``Target`` so that a plan's record of its target is
unchanged; ``stagesplit layouts`` prices its collectives with it (model/communication.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.limits import MAX_DEVICES
from ..errors import ProfileError, StagesplitError
from .targets import _number, config_dir, exact_fields, file_field, read_yaml

__all__ = ["Link", "NodeTopology", "known_nodes", "node_of", "node_from_mapping"]


@dataclass(frozen=True)
class Link:
    """One GPU's link in a ring: bytes per second in one direction, seconds per ring step."""

    bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class NodeTopology:
    """GPUs per node, the link inside a node (NVLink, Infinity Fabric) and across nodes (the NIC)."""

    gpus_per_node: int
    intra: Link
    inter: Link
    #: whether a collective runs beside the compute (a GPU: NCCL's kernels and copy engines on
    #: streams of their own, so that DDP's all-reduce hides under the backward) or takes the
    #: compute's own cores (a CPU rank on one core: gloo's threads run on it), when nothing of it hides
    overlaps_compute: bool = True

    def link(self, group: int, stride: int = 1) -> Link:
        """The link a ring of ``group`` ranks ``stride`` apart runs on: inside one node where the
        ranks it spans (``(group - 1) * stride + 1``) fit in one, else across nodes (the slowest
        hop sets a ring's pace)."""
        return self.intra if (group - 1) * stride + 1 <= self.gpus_per_node else self.inter


_FIELDS = ("gpus_per_node", "intra_bytes_per_s", "intra_latency_s", "inter_bytes_per_s", "inter_latency_s")
#: fields a node may leave out, and their defaults
_OPTIONAL = {"overlaps_compute": True}


def node_from_mapping(spec: Any, path: Path | str | None, prefix: str) -> NodeTopology:
    """A ``node`` mapping read strictly: every field present (``overlaps_compute`` may be left out:
    true), numbers in range, nothing else."""
    if isinstance(spec, dict):
        spec = {**_OPTIONAL, **spec}
    spec = exact_fields(spec, _FIELDS + tuple(_OPTIONAL), path, prefix)
    overlaps = spec["overlaps_compute"]
    if not isinstance(overlaps, bool):
        raise ProfileError(path, f"{prefix}.overlaps_compute", "true or false", overlaps)
    n = _number(path, f"{prefix}.gpus_per_node", spec["gpus_per_node"], integer=True, minimum=1, maximum=MAX_DEVICES)

    def link(side: str) -> Link:
        bw = _number(path, f"{prefix}.{side}_bytes_per_s", spec[f"{side}_bytes_per_s"], minimum=1)
        lat = _number(path, f"{prefix}.{side}_latency_s", spec[f"{side}_latency_s"], minimum=0, maximum=1.0)
        return Link(float(bw), float(lat))
    return NodeTopology(int(n), link("intra"), link("inter"), overlaps)


def known_nodes() -> dict[str, NodeTopology]:
    """The shipped GPU targets' nodes, by target name (targets without a ``node`` are left out)."""
    path = config_dir() / "targets.yaml"
    data = read_yaml(path)
    targets = data.get("targets", {}) if isinstance(data, dict) else {}
    return {name: node_from_mapping(spec["node"], path, f"targets.{name}.node")
            for name, spec in targets.items() if isinstance(spec, dict) and "node" in spec}


def node_of(name_or_path: str) -> NodeTopology:
    """The node of a shipped target by name, or of a YAML target file with a ``node`` field."""
    nodes = known_nodes()
    if name_or_path in nodes:
        return nodes[name_or_path]
    found = file_field(name_or_path, "node")
    if found is not None:
        return node_from_mapping(found[1], found[0], "node")
    raise StagesplitError(f"target '{name_or_path}' has no node topology: expected one of {', '.join(nodes)} "
                          "or a YAML target file with a node field (gpus_per_node, intra_bytes_per_s, "
                          "intra_latency_s, inter_bytes_per_s, inter_latency_s)")
