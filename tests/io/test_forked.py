"""The forked-child helper the PopVision reader uses to read on two cores: results come back
whole and equal (arrays by dtype, shape and value, no pickle), a child that fails or dies
gives ChildFailed, and a child nobody waits for is stopped and reaped."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from stagesplit.io.forked import ChildFailed, Forked, _decode, _encode, can_fork

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_a_tree_of_arrays_and_plain_values_comes_back_equal():
    base = np.arange(24, dtype=np.int64).reshape(4, 6)
    value = {
        "int8": np.array([-128, 0, 127], np.int8), "uint16": np.array([65535, 1], np.uint16),
        "float": np.array([1.5, np.nan, -np.inf]), "bool": np.array([[True, False], [False, True]]),
        "strided": base[:, ::2], "empty": np.zeros((0, 3), np.int32), "scalar": np.int64(7),
        "names": ["a", "b\nc", "µ"], "nested": [[1, 2.5, None, True], ("x", float("nan"))],
        "none": None,
    }
    got = Forked(lambda: value).result()
    for key in ("int8", "uint16", "float", "bool", "empty"):
        assert got[key].dtype == value[key].dtype and got[key].shape == value[key].shape, key
        assert np.array_equal(got[key], value[key], equal_nan=got[key].dtype.kind == "f"), key
    assert got["strided"].tolist() == base[:, ::2].tolist() and got["strided"].flags.c_contiguous
    assert got["scalar"] == 7 and got["names"] == ["a", "b\nc", "µ"] and got["none"] is None
    assert got["nested"][0] == [1, 2.5, None, True]
    assert got["nested"][1][0] == "x" and np.isnan(got["nested"][1][1])


def test_the_child_sees_the_callers_state_and_runs_apart():
    state = {"n": 41}
    child = Forked(lambda: (state.__setitem__("n", state["n"] + 1), state["n"], os.getpid())[1:])
    n, pid = child.result()
    assert n == 42 and state["n"] == 41 and pid != os.getpid()


def test_an_error_in_the_child_gives_child_failed_with_its_message():
    def boom():
        raise ValueError("no such part")
    with pytest.raises(ChildFailed, match="ValueError: no such part"):
        Forked(boom).result()


def test_a_child_that_dies_gives_child_failed():
    with pytest.raises(ChildFailed, match="exited before"):
        Forked(lambda: os._exit(3)).result()


@pytest.mark.parametrize("value", [np.array(["text"]), np.array([object()]), {1: "int key"}, {"__array__": 0},
                                   {1, 2}, b"bytes"], ids=["str-array", "object-array", "int-key", "reserved-key",
                                                           "set", "bytes"])
def test_values_that_cannot_travel_give_child_failed(value):
    with pytest.raises(ChildFailed, match="TypeError"):
        Forked(lambda: value).result()


def test_leaving_without_the_result_stops_and_reaps_the_child(monkeypatch):
    """Leaving sends the child SIGKILL (it is stopped, not waited for through its hour of sleep)
    and reaps it."""
    sent = []
    kill = os.kill
    monkeypatch.setattr("stagesplit.io.forked.os.kill", lambda pid, sig: (sent.append((pid, sig)), kill(pid, sig)))
    with Forked(lambda: time.sleep(3600)) as child:
        pid = child.pid
    assert sent == [(pid, signal.SIGKILL)]
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)                     # already reaped


def test_a_large_result_does_not_block_either_side():
    big = np.arange(3_000_000, dtype=np.int64)         # far more than a pipe holds
    got = Forked(lambda: {"big": big}).result()
    assert np.array_equal(got["big"], big)


def test_no_fork_while_another_python_thread_runs():
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert not can_fork()
    finally:
        release.set()
        thread.join()


def test_encode_decode_round_trip_in_process():
    value = {"a": [np.arange(3, dtype=np.uint8), {"b": np.ones((2, 2))}]}
    header, buffers = _encode(value)
    got = _decode(header["value"], buffers)
    assert got["a"][0].tolist() == [0, 1, 2] and got["a"][1]["b"].tolist() == [[1, 1], [1, 1]]


def test_no_child_process_gives_child_failed_and_leaks_no_descriptor(monkeypatch):
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    monkeypatch.setattr(os, "fork", no_fork)
    with pytest.raises(ChildFailed, match="no child process"):
        Forked(lambda: 1)
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before
