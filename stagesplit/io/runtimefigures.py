"""A GPU target's runtime figures: what each process holds on the device outside torch's caching
allocator (configs/targets.yaml's ``runtime`` field; its sources are in that file's comments): the
CUDA context's bytes and the channels NCCL opens per communicator. The solver keeps them back
(``solver/runtime_reserve.py``); they are read here, strictly, as the node topology is
(``io/topology.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.limits import MAX_BYTES
from .targets import _number, exact_fields, file_field, shipped_targets_document

__all__ = ["DEFAULT_RUNTIME", "RuntimeFigures", "known_runtimes", "runtime_from_mapping", "runtime_of"]

#: the most NCCL channels a communicator opens (NCCL's MAXCHANNELS is 32, 64 in later releases)
MAX_NCCL_CHANNELS = 64


@dataclass(frozen=True)
class RuntimeFigures:
    """The CUDA context's bytes per process and the channels NCCL opens per communicator;
    ``source``: where they come from (a target's name, a file, or the defaults)."""

    cuda_context_bytes: int
    nccl_channels: int
    source: str


#: what a GPU target that gives no ``runtime`` field gets: the shipped targets' figures (an estimate
#: of the CUDA context with lazy module loading, and an assumed channel count; see targets.yaml)
DEFAULT_RUNTIME = RuntimeFigures(cuda_context_bytes=512 * 2**20, nccl_channels=16, source="the defaults")

_FIELDS = ("cuda_context_bytes", "nccl_channels")


def runtime_from_mapping(spec: Any, path: Path | str | None, prefix: str, source: str) -> RuntimeFigures:
    """A ``runtime`` mapping read strictly: both fields present, integers in range, nothing else."""
    spec = exact_fields(spec, _FIELDS, path, prefix)
    context = _number(path, f"{prefix}.cuda_context_bytes", spec["cuda_context_bytes"], integer=True, minimum=0,
                      maximum=MAX_BYTES)
    channels = _number(path, f"{prefix}.nccl_channels", spec["nccl_channels"], integer=True, minimum=1,
                       maximum=MAX_NCCL_CHANNELS)
    return RuntimeFigures(int(context), int(channels), source)


def known_runtimes() -> dict[str, RuntimeFigures]:
    """The shipped GPU targets' runtime figures, by target name (targets without one are left out)."""
    path, data = shipped_targets_document()
    targets = data.get("targets", {}) if isinstance(data, dict) else {}
    return {name: runtime_from_mapping(spec["runtime"], path, f"targets.{name}.runtime", name)
            for name, spec in targets.items() if isinstance(spec, dict) and "runtime" in spec}


def runtime_of(name_or_path: str) -> RuntimeFigures:
    """The runtime figures of a shipped target by name, or of a YAML target file with a ``runtime``
    field; ``DEFAULT_RUNTIME`` for any other GPU target."""
    known = known_runtimes()
    if name_or_path in known:
        return known[name_or_path]
    found = file_field(name_or_path, "runtime")
    if found is not None:
        path, spec = found
        return runtime_from_mapping(spec, path, "runtime", str(path))
    return DEFAULT_RUNTIME
