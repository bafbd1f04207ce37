"""What a GPU plan keeps back for what the profile does not hold (solver/runtime_reserve.py): the CUDA
context from the target's figures, NCCL's buffers per communicator, hand-computed from NCCL's defaults."""

import pytest

from stagesplit.errors import OptionError, ProfileError
from stagesplit.io.runtimefigures import DEFAULT_RUNTIME, RuntimeFigures, known_runtimes, runtime_of
from stagesplit.io.targets import load_target
from stagesplit.solver.request import SolveRequest
from stagesplit.solver.runtime_reserve import (
    NCCL_P2P_BYTES,
    NCCL_RING_BYTES,
    communicators,
    request_reserve,
    runtime_reserve,
)

MiB = 1 << 20


def test_nccl_buffer_sizes_are_nccls_defaults():
    # Simple (NCCL_BUFFSIZE 4 MiB) + LL128 (120 x 640 x 8 steps x 8 B) + LL (8 x 512 x 8 steps x 16 B)
    assert NCCL_RING_BYTES == 4_194_304 + 4_915_200 + 524_288 == 9_633_792
    # a point-to-point connection: the Simple protocol, the NVLink chunk (512 KiB) x 8 steps
    assert NCCL_P2P_BYTES == 4 * MiB


def test_shipped_gpu_targets_have_runtime_figures():
    runtimes = known_runtimes()
    assert set(runtimes) == {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb", "mi300x-192gb"}
    assert all((f.cuda_context_bytes, f.nccl_channels) == (512 * MiB, 16) for f in runtimes.values())
    assert runtime_of("h100-80gb").source == "h100-80gb"
    assert runtime_of("some-other-gpu") is DEFAULT_RUNTIME


def test_h100_tp2_dp2_pp4_by_hand():
    """h100-80gb, 4 pipeline devices under 1F1B, 2 tensor-parallel ranks, 2 data-parallel replicas: a middle
    stage has two pipeline neighbours (a two-rank communicator each, 16 channels x 4 MiB), the pipeline
    group's communicator for 1F1B's batched send-with-receive (2 peers x 16 x 4 MiB), and the TP and DP
    groups' rings (16 channels x 9,633,792 B each)."""
    kept = runtime_reserve("auto", runtime_of("h100-80gb"), devices=4, tensor_parallel=2, data_parallel=2,
                           schedule="1f1b")
    assert [(c.name, c.ranks, c.peers, c.bytes) for c in kept.communicators] == [
        ("pipeline sends and receives with neighbour 1", 2, 1, 67_108_864),
        ("pipeline sends and receives with neighbour 2", 2, 1, 67_108_864),
        ("pipeline group (batched sends and receives)", 4, 2, 134_217_728),
        ("tensor parallel", 2, 1, 154_140_672),
        ("data parallel", 2, 1, 154_140_672)]
    assert kept.nccl_bytes == 576_716_800
    assert kept.cuda_context_bytes == 536_870_912
    assert kept.estimate_bytes == 1_113_587_712
    assert kept.per_device(4) == (1_113_587_712,) * 4


def test_communicators_follow_the_layout():
    # one device alone: no communicator
    assert communicators(16, devices=1, tensor_parallel=1, data_parallel=1, schedule="1f1b") == ()
    # two devices: one neighbour; GPipe sends and receives apart, so no pipeline-group communicator
    two = communicators(16, devices=2, tensor_parallel=1, data_parallel=1, schedule="gpipe")
    assert [(c.ranks, c.bytes) for c in two] == [(2, 16 * 4 * MiB)]
    # the looped schedules' first rank also has two neighbours (the wrap-around): the fullest has two
    looped = communicators(8, devices=8, tensor_parallel=1, data_parallel=4, schedule="interleaved-1f1b")
    assert [(c.ranks, c.peers, c.bytes) for c in looped] == [
        (2, 1, 8 * 4 * MiB), (2, 1, 8 * 4 * MiB), (8, 2, 2 * 8 * 4 * MiB), (4, 1, 8 * NCCL_RING_BYTES)]


def test_off_and_given_bytes():
    figures = RuntimeFigures(100 * MiB, 4, "test")
    assert runtime_reserve("off", figures, devices=4).estimate_bytes == 0
    given = runtime_reserve(3 * 2**30, figures, devices=4, data_parallel=2)
    assert given.setting == "given" and given.estimate_bytes == 3 * 2**30
    assert given.nccl_bytes == 2 * 4 * 4 * MiB + 2 * 4 * 4 * MiB + 4 * NCCL_RING_BYTES   # still itemised


def test_request_reserve_only_on_gpus():
    h100, ipu = load_target("h100-80gb"), load_target("ipu-mk2")
    assert request_reserve(SolveRequest(devices=2, targets=("ipu-mk2",)), (ipu, ipu), ipu) is None
    kept = request_reserve(SolveRequest(devices=2, targets=("h100-80gb",), schedule="1f1b"), (h100, h100), h100)
    assert kept is not None and kept.estimate_bytes == 512 * MiB + 2 * 64 * MiB and kept.source == "h100-80gb"
    # the device count of a sweep's row
    one = request_reserve(SolveRequest(devices=4, targets=("h100-80gb",)), (h100,), h100, devices=1)
    assert one is not None and one.estimate_bytes == 512 * MiB and not one.communicators


@pytest.mark.parametrize("value", ["lots", -1, 1.5, True, 2**63])
def test_the_setting_is_checked(value):
    with pytest.raises(OptionError) as exc:
        SolveRequest(devices=2, runtime_reserve=value)
    assert exc.value.parameter == "runtime_reserve"


def test_a_target_file_gives_its_own_figures(tmp_path):
    path = tmp_path / "mygpu.yaml"
    path.write_text("kind: gpu\ntiles: 1\nbytes_per_tile: 1000000000\n"
                    "runtime: {cuda_context_bytes: 1000, nccl_channels: 2}\n")
    figures = runtime_of(str(path))
    assert (figures.cuda_context_bytes, figures.nccl_channels) == (1000, 2)
    assert load_target(str(path)).device_bytes == 10**9          # the target itself reads as before
    path.write_text("kind: gpu\ntiles: 1\nbytes_per_tile: 1000000000\nruntime: {cuda_context_bytes: 1000}\n")
    with pytest.raises(ProfileError, match="runtime.nccl_channels"):
        runtime_of(str(path))
