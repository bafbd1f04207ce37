"""What each process holds on a GPU that the profile does not, and outside torch's caching allocator:
kept back from every device's memory before layers are placed (as the request's own reserve is).

* **The CUDA context** (per device type: ``io/runtimefigures.py``, figures and sources in
  configs/targets.yaml): made by the driver when the process first uses the device, not through
  the caching allocator, so it counts against the device's memory, not ``memory_reserved``.
* **NCCL's buffers**, per communicator the process is in, allocated by NCCL itself (outside the
  caching allocator too). Per channel and connection, NCCL's defaults (``src/init.cc``): the Simple
  protocol's ``NCCL_BUFFSIZE`` (``DEFAULT_BUFFSIZE``, 4 MiB), LL128's (``DEFAULT_LL128_BUFFSIZE``,
  120 x 640 x 8 steps x 8 B = 4,915,200 B) and LL's (``DEFAULT_LL_BUFFSIZE``, 8 x 512 x 8 steps x 16 B
  = 512 KiB); a point-to-point connection uses the Simple protocol only, with the NVLink chunk
  (``NCCL_P2P_NVL_CHUNKSIZE``, 512 KiB) x 8 steps = 4 MiB. The channel count is the target's
  (an assumption: NCCL chooses it from the topology). Which communicators:

  - the pipeline (more than one device): torch's pipelining runtime sends and receives alone
    (``_batch_p2p`` of one kind) with ``isend``/``irecv``, for which ProcessGroupNCCL makes a
    two-rank communicator per pair of ranks (``pointToPoint``, ``getKeySendRecv``, unless the
    process group was made with a ``device_id``), one per neighbour: the fullest process, a middle
    stage's (or a looped schedule's first), has two neighbours, one when there are two devices.
    Sends and receives in one batch (every schedule but GPipe mixes them) go through
    ``batch_isend_irecv`` on the pipeline group's own communicator, with a connection to each
    neighbour;
  - the tensor-parallel group (more than one rank) and the data-parallel group (more than one
    replica): collectives, one ring connection per channel (each rank receives from one peer).

  NVLink SHARP (NVLS) buffers on NVSwitch systems, tree connections across nodes and the world
  group's own communicator are not counted (``docs/gpu.md`` says so).

The figures are per process and the same on every device (the fullest rank's): a plan keeps them
back from each device. ``setting`` ``off`` keeps nothing back; a byte count replaces the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..io.profile import Target
from ..io.runtimefigures import RuntimeFigures, runtime_of
from .request import SolveRequest

__all__ = ["Communicator", "NCCL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_LL_BUFFSIZE", "NCCL_P2P_BYTES",
           "NCCL_RING_BYTES", "RuntimeReserve", "communicators", "request_reserve", "runtime_reserve"]

MiB = 1 << 20
#: NCCL's Simple-protocol buffer per channel and connection (``NCCL_BUFFSIZE``, default 4 MiB)
NCCL_BUFFSIZE = 4 * MiB
#: LL128's: NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS (8) x 8 B
NCCL_LL128_BUFFSIZE = 120 * 640 * 8 * 8
#: LL's: NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS (8) x 16 B
NCCL_LL_BUFFSIZE = 8 * 512 * 8 * 16
#: a collective's ring connection, per channel: one buffer per protocol
NCCL_RING_BYTES = NCCL_BUFFSIZE + NCCL_LL128_BUFFSIZE + NCCL_LL_BUFFSIZE
#: a point-to-point connection, per channel: the Simple protocol's NVLink chunk (512 KiB) x 8 steps
NCCL_P2P_BYTES = 512 * 1024 * 8


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator the process is in: what it is for, its ranks, the peers this process
    holds connections to in it, the channels, and the bytes per channel and connection."""

    name: str
    ranks: int
    peers: int
    channels: int
    connection_bytes: int

    @property
    def bytes(self) -> int:
        return self.peers * self.channels * self.connection_bytes


@dataclass(frozen=True)
class RuntimeReserve:
    """What a plan keeps back on every device for what the profile does not hold, itemised.

    ``setting``: "auto" (the estimate: the CUDA context and NCCL's buffers), "off" (nothing), or
    "given" (``given_bytes`` in place of the estimate); ``source``: where the figures came from (the
    target); ``retry_bytes``: per device position, what a second solve kept back beyond this where the
    caching allocator's replay did not fit the first plan (empty: no second solve)."""

    setting: str = "auto"
    cuda_context_bytes: int = 0
    communicators: tuple[Communicator, ...] = ()
    given_bytes: int = 0
    source: str = ""
    retry_bytes: tuple[int, ...] = ()
    #: the channels each communicator was priced with (the target's figure)
    nccl_channels: int = 0

    @property
    def nccl_bytes(self) -> int:
        return sum(c.bytes for c in self.communicators)

    @property
    def estimate_bytes(self) -> int:
        """Bytes kept back on every device before any second solve."""
        if self.setting == "off":
            return 0
        if self.setting == "given":
            return self.given_bytes
        return self.cuda_context_bytes + self.nccl_bytes

    def per_device(self, devices: int) -> tuple[int, ...]:
        """Bytes kept back on each of ``devices`` device positions (a second solve's excess included)."""
        retry = self.retry_bytes
        return tuple(self.estimate_bytes + (retry[i] if i < len(retry) else 0) for i in range(devices))


def communicators(channels: int, *, devices: int, tensor_parallel: int, data_parallel: int,
                  schedule: str) -> tuple[Communicator, ...]:
    """The NCCL communicators the fullest process of a plan is in (see the module docstring): per
    pipeline neighbour a two-rank one, the pipeline group's where the schedule batches sends with
    receives (every one but GPipe; ``none`` and ``auto`` count it), the tensor- and data-parallel
    groups' where they have more than one rank."""
    out = []
    if devices > 1:
        neighbours = min(devices - 1, 2)
        out += [Communicator(f"pipeline sends and receives with neighbour {i + 1}", 2, 1, channels, NCCL_P2P_BYTES)
                for i in range(neighbours)]
        if schedule != "gpipe":
            out.append(Communicator("pipeline group (batched sends and receives)", devices, neighbours, channels,
                                    NCCL_P2P_BYTES))
    if tensor_parallel > 1:
        out.append(Communicator("tensor parallel", tensor_parallel, 1, channels, NCCL_RING_BYTES))
    if data_parallel > 1:
        out.append(Communicator("data parallel", data_parallel, 1, channels, NCCL_RING_BYTES))
    return tuple(out)


def runtime_reserve(setting: str | int, figures: RuntimeFigures, *, devices: int, tensor_parallel: int = 1,
                    data_parallel: int = 1, schedule: str = "none") -> RuntimeReserve:
    """What a GPU plan keeps back per device: ``setting`` "auto" prices the CUDA context from
    ``figures`` and NCCL's buffers for the layout, "off" keeps nothing, a byte count keeps that
    (the itemisation still recorded beside it, for the plan to show what it replaced)."""
    comms = communicators(figures.nccl_channels, devices=devices, tensor_parallel=tensor_parallel,
                          data_parallel=data_parallel, schedule=schedule)
    if setting == "off":
        return RuntimeReserve("off", source=figures.source, nccl_channels=figures.nccl_channels)
    if isinstance(setting, int):
        return RuntimeReserve("given", figures.cuda_context_bytes, comms, given_bytes=setting, source=figures.source,
                              nccl_channels=figures.nccl_channels)
    return RuntimeReserve("auto", figures.cuda_context_bytes, comms, source=figures.source,
                          nccl_channels=figures.nccl_channels)


def request_reserve(request: SolveRequest, targets: tuple[Target, ...], profile_target: Target,
                    tensor_parallel: int = 1, devices: int | None = None) -> RuntimeReserve | None:
    """What a solve of ``request`` keeps back per device on ``targets`` (each device position's; empty:
    the profile's own device), for ``devices`` devices (default: the request's): None where a device is
    not a GPU (one tile of ``kind`` gpu), so that other targets are solved as before. Each target's
    figures are its own (``runtime_of``: a shipped target's, a YAML file's ``runtime`` field, else the
    defaults); with several, the largest estimate is kept, for every device."""
    devices = request.devices if devices is None else devices
    on = targets or (profile_target,)
    if not all(t.kind == "gpu" and t.tiles == 1 for t in on) or profile_target.tiles != 1:
        return None
    names = [t if isinstance(t, str) else t.name for t in request.targets] or [profile_target.name]
    figures = {runtime_of(n) for n in names}
    options = [runtime_reserve(request.runtime_reserve, f, devices=devices, tensor_parallel=tensor_parallel,
                               data_parallel=request.dp, schedule=request.schedule.value)
               for f in sorted(figures, key=lambda f: f.source)]
    return max(options, key=lambda r: (r.cuda_context_bytes + r.nccl_bytes, r.source))
