"""Hostile input, refused cleanly (issue 9, "Bad input"): every case ends with exactly one line
on stderr, exit status 2 (1 for an infeasible solve, 130 for Ctrl-C), no traceback, no hang,
and no output file replaced. The corpus is generated here, class by class, several variants each.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, hard_cp_model, tiny_profile
from stagesplit.cli import main
from stagesplit.common import limits
from stagesplit.common.fileio import atomic_write_bytes
from stagesplit.common.interrupt import deferred_signals, solve_interruptibly
from stagesplit.common.regex import compile_regex
from stagesplit.common.safeinput import load_json, load_yaml
from stagesplit.common.text import one_line, short_repr
from stagesplit.errors import ProfileError
from stagesplit.io import load_profile, save_profile
from stagesplit.io.compact import profile_to_arrays

PYTHON = sys.executable


# -- helpers -----------------------------------------------------------------------------------------------

def doc(**changes) -> dict:
    """A valid 4-layer profile on a one-tile device (layers 0..3, 10/20/30/40 cycles)."""
    d = {"format": "stagesplit-profile", "version": 1, "kind": "full", "name": "base",
         "target": {"name": "hand", "tiles": 1, "bytes_per_tile": 1000, "clock_hz": 1e9, "link_bytes_per_s": 1e9},
         "steps": 4,
         "variables": [{"name": f"w{i}", "bytes": 100, "live": "always"} for i in range(4)],
         "operations": [{"name": f"layer{i}/op", "layer": str(i), "first_step": i, "last_step": i, "vars": [i],
                         "compute": 10.0 * (i + 1)} for i in range(4)]}
    d.update(changes)
    return d


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)
    return path


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code, err, *fragments, status=2) -> str:
    """Exactly one stderr line, the error, with the given exit status and fragments."""
    lines = err.splitlines()
    assert code == status, err
    assert len(lines) == 1, err
    assert lines[0].startswith("stagesplit: error: "), lines[0]
    assert "Traceback" not in err and "Warning" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def sub(argv, timeout=60, **kw) -> subprocess.CompletedProcess:
    """The CLI in a child process (for hangs, signals and real stdout encodings). ``timeout`` is
    a hang guard (a hang fails the test); tests bound work by counts and sizes, never seconds."""
    return subprocess.run([PYTHON, "-m", "stagesplit", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", None), **kw)


@contextlib.contextmanager
def peak_memory():
    """Yields a list that holds, after the block, the peak bytes Python and numpy allocated in
    it (tracemalloc): refusing before allocating is a size bound, not a race against a clock."""
    result: list[int] = []
    tracemalloc.start()
    try:
        yield result
        result.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


@contextlib.contextmanager
def bytes_read(monkeypatch):
    """Yields a list that holds the bytes read through safeinput's one-open reader so far."""
    total = [0]
    real = os.read

    def counting(fd, n):
        data = real(fd, n)
        total[0] += len(data)
        return data

    with monkeypatch.context() as patch:
        patch.setattr("stagesplit.common.safeinput.os.read", counting)
        yield total


def sub_error(done, *fragments, status=2) -> str:
    assert done.stdout == "", done.stdout
    return one_error(done.returncode, done.stderr, *fragments, status=status)


@pytest.fixture
def profile(tmp_path) -> Path:
    return write_json(tmp_path / "base.json", doc())


# -- 1. deep nesting ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "[" * 100_000,                                                    # far past the C recursion limit
    '{"format": "stagesplit-profile", "name": ' + "[" * 50_000 + "]" * 50_000 + "}",
    '{"a": ' * 150 + "1" + "}" * 150,                                 # parses, but deeper than the limit
    '{"format": "stagesplit-profile", "version": 1, "steps": 4, "operations": [' + "[" * 200 + "]" * 200 + "]}",
])
def test_deeply_nested_json_profile(capsys, tmp_path, text):
    path = write_json(tmp_path / "deep.json", text)
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, str(path), "nested at most 100 deep")


def _deep_yaml(kind: str, depth: int) -> str:
    if kind == "flow":
        return "[" * depth + "]" * depth
    if kind == "block":
        return "".join("  " * i + "- \n" for i in range(depth - 1)) + "  " * (depth - 1) + "- 1\n"
    return "".join("  " * i + f"k{i}:\n" for i in range(depth - 1)) + "  " * (depth - 1) + "k: 1\n"


@pytest.mark.parametrize("kind, depth", [("flow", 100_000), ("block", 3000), ("mapping", 150)])
@pytest.mark.parametrize("option", ["--config", "--layer-compute"])
def test_deeply_nested_yaml_options(capsys, tmp_path, profile, kind, depth, option):
    path = write_json(tmp_path / "deep.yaml", _deep_yaml(kind, depth))
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", option, path)
    one_error(code, err, str(path), "nested at most 100 deep")


@pytest.mark.parametrize("suffix, text", [(".json", "[" * 100_000), (".yaml", "[" * 100_000),
                                          (".json", '{"x": ' * 200 + "0" + "}" * 200)])
def test_deeply_nested_plan(capsys, tmp_path, profile, suffix, text):
    plan = write_json(tmp_path / f"plan{suffix}", text)
    code, out, err = cli(capsys, "diagnose", profile, "--plan", plan)
    one_error(code, err, str(plan), "nested at most 100 deep")
    code, out, err = cli(capsys, "export", plan, "--to", "deepspeed")
    one_error(code, err, str(plan), "nested at most 100 deep")


def test_nesting_limit_is_exact():
    """100 levels parse; 101 do not (JSON and YAML alike)."""
    assert load_json("[" * 100 + "]" * 100, "x") == json.loads("[" * 100 + "]" * 100)
    with pytest.raises(ProfileError, match="nested at most 100 deep"):
        load_json("[" * 101 + "]" * 101, "x")
    assert load_yaml("[" * 100 + "]" * 100, "x") == json.loads("[" * 100 + "]" * 100)
    with pytest.raises(ProfileError, match="nested at most 100 deep"):
        load_yaml("[" * 101 + "]" * 101, "x")


# -- 2. sizes that would allocate before being checked ----------------------------------------------------

@pytest.mark.parametrize("steps", [10**12, 2**63 - 1, limits.MAX_STEPS + 1])
def test_huge_step_count(capsys, tmp_path, steps):
    path = write_json(tmp_path / "steps.json", doc(steps=steps))
    with peak_memory() as peak:
        code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, f"{path}: steps: expected ")
    assert peak[0] < 32 << 20                          # refused before a name is made for every step


@pytest.mark.parametrize("tiles", [10**12, 2**40])
def test_huge_tile_count(capsys, tmp_path, tiles):
    d = doc()
    d["target"]["tiles"] = tiles
    path = write_json(tmp_path / "tiles.json", d)
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, "target.tiles: expected an integer >= 1 and <= 1,048,576")


@pytest.mark.parametrize("argv", [
    ["solve", "--devices", "1000000000"],
    ["solve", "--devices", str(10**30)],
    ["solve", "--devices", "1025"],
    ["sweep", "--devices", "1..1000000000"],
    ["sweep", "--devices", "1," + str(10**9)],
    ["sweep", "--devices", "1.." + "9" * 5000],
    ["sweep", "--devices", "1000..1025"],
])
def test_huge_device_counts(capsys, profile, argv, monkeypatch):
    def never(*args, **kw):
        raise AssertionError("the profile was read although --devices is refused")
    monkeypatch.setattr("stagesplit.io.load_profile", never)
    with peak_memory() as peak:
        code, out, err = cli(capsys, argv[0], profile, *argv[1:])
    one_error(code, err, "--devices", f"{limits.MAX_DEVICES:,}")
    assert peak[0] < 32 << 20                          # no list of counts was built


def _compact_bytes(arrays: dict[str, np.ndarray], replace: dict[str, bytes] | None = None) -> bytes:
    """A compact profile zip; ``replace`` gives raw .npy bytes for some members."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for key, value in arrays.items():
            if replace and key in replace:
                z.writestr(f"{key}.npy", replace[key])
            else:
                member = io.BytesIO()
                np.lib.format.write_array(member, np.asarray(value), allow_pickle=False)
                z.writestr(f"{key}.npy", member.getvalue())
    return buffer.getvalue()


def _npy_header(shape, descr="<i8") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


@pytest.mark.parametrize("key, shape", [("var_bytes", (2**40,)), ("op_compute", (10**15,)),
                                        ("live_intervals", (2**38, 2)), ("header", (2**45,))])
def test_compact_header_promising_terabytes(capsys, tmp_path, key, shape):
    arrays = profile_to_arrays(tiny_profile(True))
    descr = "<f8" if key == "op_compute" else "|u1" if key == "header" else "<i8"
    path = tmp_path / "liar.stagesplit"
    path.write_bytes(_compact_bytes(arrays, {key: _npy_header(shape, descr) + b"\0" * 64}))
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, f"{path}: {key}: expected a readable numpy array", "header promising")


def test_compact_zip_bomb(capsys, tmp_path):
    """A few hundred kilobytes expanding to 600 MB of zeros: refused from the zip directory."""
    arrays = profile_to_arrays(tiny_profile(True))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(value), allow_pickle=False)
            z.writestr(f"{key}.npy", member.getvalue())
        with z.open("zeros.npy", "w", force_zip64=True) as member:
            size = 600 << 20
            member.write(_npy_header((size // 8,)))
            chunk = bytes(16 << 20)
            for _ in range(size // len(chunk)):
                member.write(chunk)
    path = tmp_path / "bomb.stagesplit"
    path.write_bytes(buffer.getvalue())
    assert path.stat().st_size < 5 << 20
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, f"{path}: expected a compact profile expanding to at most")


def test_compact_directory_lying_about_size(capsys, tmp_path):
    """The zip directory declares a 4 GB member: refused before decompressing anything."""
    raw = bytearray(_compact_bytes(profile_to_arrays(tiny_profile(True))))
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z:
        info = z.getinfo("var_bytes.npy")
    declared = (0xFFFFFFF0).to_bytes(4, "little")
    raw[info.header_offset + 22:info.header_offset + 26] = declared        # local header: uncompressed size
    central = raw.find(b"PK\x01\x02")
    while central >= 0:                                                     # central directory entry
        name_len = int.from_bytes(raw[central + 28:central + 30], "little")
        if raw[central + 46:central + 46 + name_len] == b"var_bytes.npy":
            raw[central + 24:central + 28] = declared
            break
        central = raw.find(b"PK\x01\x02", central + 4)
    path = tmp_path / "liar.stagesplit"
    path.write_bytes(bytes(raw))
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, str(path), "expanding to at most")


@pytest.mark.parametrize("offsets", [[0, 2, 1, 3, 4], [1, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]])
def test_compact_offsets_out_of_order(capsys, tmp_path, offsets):
    """Liveness offsets that go backwards are refused by name (found by fuzzing: a ValueError
    from numpy deep in validation before)."""
    arrays = profile_to_arrays(tiny_profile(True))
    assert len(arrays["live_offsets"]) == 5 and arrays["live_offsets"][-1] == 4
    arrays["live_offsets"] = np.array(offsets[:-1] + [4], np.int64)
    path = tmp_path / "offsets.stagesplit"
    path.write_bytes(_compact_bytes(arrays))
    code, out, err = cli(capsys, "diagnose", path)
    one_error(code, err, f"{path}: live_offsets: expected non-decreasing offsets from 0")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_files_as_inputs(capsys, profile, tmp_path, device, monkeypatch):
    """Each read stops at its cap (counted in bytes): a profile at MAX_STREAM_BYTES, a config,
    plan or layer-compute file at MAX_CONFIG_BYTES, plus at most one read chunk."""
    if not os.path.exists(device):
        pytest.skip(f"{device} is not on this system")
    argvs = [(["breakdown", device], limits.MAX_STREAM_BYTES),
             (["solve", profile, "--devices", "2", "--config", device], limits.MAX_CONFIG_BYTES),
             (["solve", profile, "--devices", "2", "--layer-compute", device], limits.MAX_CONFIG_BYTES),
             (["breakdown", profile, "--layer-compute", device], limits.MAX_CONFIG_BYTES),
             (["diagnose", profile, "--plan", device], limits.MAX_CONFIG_BYTES),
             (["export", device, "--to", "deepspeed"], limits.MAX_CONFIG_BYTES)]
    for argv, cap in argvs:
        with bytes_read(monkeypatch) as total:
            code, out, err = cli(capsys, *argv)
        one_error(code, err, device)
        assert total[0] <= cap + (1 << 20) + profile.stat().st_size, (argv, total[0])


def test_oversized_config_file(capsys, tmp_path, profile):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as handle:                  # sparse: no disk used
        handle.truncate(limits.MAX_CONFIG_BYTES + 1)
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", "--config", big)
    one_error(code, err, f"{big}: {limits.MAX_CONFIG_BYTES + 1:,} bytes is larger than")


# -- 3. YAML alias bombs -----------------------------------------------------------------------------------

def _laughs(levels: int = 9, width: int = 9, key: str = "a") -> str:
    lines = ['l0: &l0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    lines.append(f"{key}: *l{levels}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("option, text", [
    ("--config", _laughs()),
    ("--config", _laughs(levels=7, width=20, key="time_limit")),
    ("--layer-compute", _laughs(key="0")),
    ("--config", "x: &a [" + ", ".join(["1"] * 10) + "]\ny: [" + ", ".join(["*a"] * 2000) + "]\n"),
    ("--target", _laughs(key="tiles")),
])
def test_yaml_alias_bomb(capsys, tmp_path, profile, option, text, monkeypatch):
    """Refused with work bounded by the text, not by what it expands to: every YAML node is
    composed once, the expansion is counted without expanding (each shared node sized once),
    and nothing is constructed; counted, not timed."""
    import yaml
    counts = {"composed": 0, "constructed": 0}
    compose, construct = yaml.composer.Composer.compose_node, yaml.constructor.BaseConstructor.construct_object

    def ours(loader) -> bool:                               # the bomb's loader (not the shipped configs')
        return getattr(loader, "buffer", "").startswith(text)

    def counting_compose(self, parent, index):
        counts["composed"] += ours(self)
        return compose(self, parent, index)

    def counting_construct(self, node, deep=False):
        counts["constructed"] += ours(self)
        return construct(self, node, deep)

    monkeypatch.setattr(yaml.composer.Composer, "compose_node", counting_compose)
    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_object", counting_construct)
    path = write_json(tmp_path / "bomb.yaml", text)
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", option, path)
    line = one_error(code, err, str(path))
    assert "alias" in line and len(line) < 400
    tokens = text.count("*") + text.count(",") + text.count(":") + text.count("[") + 2
    assert 0 < counts["composed"] <= tokens                 # once per node or alias written in the file
    assert counts["constructed"] == 0                       # refused before any value is built


def test_yaml_alias_bomb_in_plan(tmp_path, profile):
    plan = write_json(tmp_path / "plan.yaml", _laughs(key="stages"))
    done = sub(["diagnose", profile, "--plan", plan], timeout=60)
    assert "alias" in sub_error(done, str(plan))


@pytest.mark.parametrize("text, fragment", [
    ("workers: " + "9" * 5000 + "\n", "valid YAML"),                      # more digits than int() converts
    ("\x00\x01", "valid YAML"),                                          # characters YAML does not allow
    ('x: !!python/object/apply:os.system ["echo owned"]\n', "valid YAML"),  # never constructed
    ("time_limit: 5\ntime_limit: 6\n", "each key at most once"),
    ("a: 1\n---\nb: 2\n", "valid YAML"),
])
def test_hostile_yaml_config(capsys, tmp_path, profile, text, fragment):
    path = tmp_path / "settings.yaml"
    path.write_bytes(text.encode())
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", "--config", path)
    one_error(code, err, str(path), fragment)
    assert "owned" not in out


def test_shared_yaml_values_still_read():
    """A few aliases are fine; only expansion past the limit is refused."""
    assert load_yaml("a: &x {b: 1}\nc: *x\nd: *x\n", "f") == {"a": {"b": 1}, "c": {"b": 1}, "d": {"b": 1}}
    with pytest.raises(ProfileError, match="once aliases are expanded"):
        load_yaml(_laughs(), "f")


def test_messages_never_print_unbounded_values():
    bomb = [[["x" * 1000] * 1000] * 1000] * 1000       # a billion leaves, shared
    assert len(short_repr(bomb)) <= 60
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert len(short_repr(deep)) <= 60
    err = ProfileError("f.json", "a", "b", bomb)
    assert len(str(err)) < 200


# -- 4. a FIFO as the profile ------------------------------------------------------------------------------

def _fifo_writer(path: Path, data: bytes, delay: float = 0.2) -> threading.Thread:
    def write():
        time.sleep(delay)
        with open(path, "wb") as handle:        # blocks until the reader opens the FIFO
            handle.write(data)
    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("kind", ["json", "compact"])
def test_fifo_profile_is_read_once(tmp_path, profile, kind):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    source = profile
    if kind == "compact":
        source = tmp_path / "base.stagesplit"
        save_profile(load_profile(profile), source)
    expected = sub(["breakdown", source, "--sections", "layers"])
    assert expected.returncode == 0
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    writer = _fifo_writer(fifo, source.read_bytes())
    done = sub(["breakdown", fifo, "--sections", "layers"], timeout=60)
    writer.join(10)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == expected.stdout


def test_fifo_with_garbage_or_no_writer(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    fifo = tmp_path / "garbage.fifo"
    os.mkfifo(fifo)
    writer = _fifo_writer(fifo, b'{"format": "stagesplit-profile", "version": 1, "steps": NaN}')
    sub_error(sub(["breakdown", fifo], timeout=60), str(fifo))
    writer.join(10)
    lonely = tmp_path / "lonely.fifo"
    os.mkfifo(lonely)
    done = sub(["breakdown", lonely], timeout=60)           # the timeout is a hang guard
    sub_error(done, f"{lonely}: is a FIFO and nothing was written to it within {limits.FIFO_WAIT_S:g} s")


def test_fifo_as_config(tmp_path, profile):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    fifo = tmp_path / "settings.fifo"
    os.mkfifo(fifo)
    writer = _fifo_writer(fifo, b"time_limit: -3\n")
    done = sub(["solve", profile, "--devices", "2", "--config", fifo], timeout=60)
    writer.join(10)
    sub_error(done, f"{fifo}: time_limit: expected a number in (0, 1e+06]")


# -- 5. catastrophic regexes -------------------------------------------------------------------------------

def _long_names_profile(tmp_path: Path) -> Path:
    d = doc()
    for i, op in enumerate(d["operations"]):
        del op["layer"]
        op["name"] = f"layer{i}/" + "a" * 30_000 + "!"
        op["inputs"] = ["x" * 30_000 + "!"]
    return write_json(tmp_path / "long.json", d)


@pytest.mark.parametrize("option, pattern", [
    ("--layer-regex", r"layer(\d+)/(a+)+$"),
    ("--layer-regex", r"layer(\d)/(a|aa)*b"),
    ("--first-layer-regex", r"(x+x+)+y"),
    ("--last-layer-regex", r"^(a|a?)+$"),
    ("--call-regex", r"(\w*)*\d"),
])
def test_catastrophic_regex_runs_in_linear_time(tmp_path, option, pattern):
    """The bound is the engine's: RE2 matches in time linear in the text (a backtracking engine
    would take exponential time on these patterns and names, and fail through the hang guard)."""
    from stagesplit.common import regex
    assert regex.ENGINE == "RE2 (linear time)" and type(compile_regex(pattern)).__module__ == "stagesplit.common.regex"
    path = _long_names_profile(tmp_path)
    done = sub(["breakdown", path, "--sections", "layers", option, pattern], timeout=300)   # hang guard only
    if done.returncode != 0:
        sub_error(done)
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("pattern, fragment", [
    (r"(?=layer)layer(\d+)", "no lookaround or backreferences"),
    (r"(l)ayer(\d+)\1", "invalid escape sequence: \\1"),
    (r"layer(\d+)\Z", "writes \\Z as \\z"),
    (r"layer(\d+", "missing )"),
    ("x" * 20_000, "at most 10,000"),
])
def test_unsupported_or_bad_regex_is_one_line(capsys, profile, pattern, fragment):
    code, out, err = cli(capsys, "breakdown", profile, "--layer-regex", pattern)
    one_error(code, err, "--layer-regex", fragment)


def test_default_patterns_keep_python_semantics():
    """(?i), \\b, groups and character classes behave as under Python's re."""
    import re

    from stagesplit import layers
    names = ["bert/Encoder/Layer3/attn", "transformer.h.11.mlp", "model.wte.weight", "lm_head/matmul",
             "Loss/softmax", "swte_x", "call_7", "", "BLOCK_2-conv", "cls", "decoder:4", "layer٣"]
    for pattern in (layers.DEFAULT_LAYER_REGEX, layers.DEFAULT_FIRST_LAYER_REGEX, layers.DEFAULT_LAST_LAYER_REGEX,
                    layers.DEFAULT_CALL_REGEX):
        ours, python = compile_regex(pattern), re.compile(pattern)
        for name in names:
            if name == "layer٣":          # non-ASCII digits: RE2's \d is ASCII only (documented)
                continue
            assert ours.findall(name) == python.findall(name), (pattern, name)
            assert bool(ours.search(name)) == bool(python.search(name)), (pattern, name)
    named = compile_regex(r"(?P<n>\d+)-(\w)?")
    m = named.search("ab 12-")
    assert (m.group(0), m.group(1), m.group(2), m.span(1), m.end()) == ("12-", "12", None, (3, 5), 6)


def test_ascii_and_other_names_match_at_the_same_character_positions():
    """An ASCII name is matched as its bytes (faster through RE2's wrapper), any other as text: both
    give the matches and character positions RE2 gives the text itself (Python's where no match is
    empty; RE2's wrapper steps past an empty match its own way, and may find one twice)."""
    import re

    import re2
    for pattern in (r"x*", r"\b", r"(a|)", r"layers?\.(\d+)", r"(?i)(H)\.(\d+)?"):
        ours, text_re2, python = compile_regex(pattern), re2.compile(pattern), re.compile(pattern)
        for name in ("", "xx.ax", "model.layers.12.mlp", "transformer.h.3.attn", "h.", "é.layers.4", "Ωh.7"):
            spans = [m.span() for m in ours.finditer(name)]
            assert spans == [m.span() for m in text_re2.finditer(name)], (pattern, name)
            assert ours.findall(name) == text_re2.findall(name), (pattern, name)
            if "|" not in pattern and "*" not in pattern and "\\b" not in pattern:
                assert ours.findall(name) == python.findall(name), (pattern, name)
                assert spans == [m.span() for m in python.finditer(name)], (pattern, name)
    assert compile_regex(r"layers\.(\d+)").search("ünicode.layers.42/mm").span(1) == (15, 17)


def test_regex_on_names_with_lone_surrogates():
    pattern = compile_regex(r"layer(\d+)")
    assert pattern.findall("\ud800layer12\udfff") == ["12"]
    assert pattern.search("\ud800layer12").span(1) == (6, 8)


# -- 6. non-finite and nonsensical numbers -----------------------------------------------------------------

@pytest.mark.parametrize("where, token", [
    ("compute", "NaN"), ("compute", "Infinity"), ("compute", "-Infinity"), ("compute", "1e400"),
    ("bytes", "NaN"), ("clock", "Infinity"), ("steps", "NaN"),
])
def test_non_finite_json_numbers(capsys, tmp_path, where, token):
    text = json.dumps(doc())
    if where == "compute":
        text = text.replace('"compute": 20.0', f'"compute": {token}')
    elif where == "bytes":
        text = text.replace('"bytes": 100', f'"bytes": {token}', 1)
    elif where == "clock":
        text = text.replace('"clock_hz": 1000000000.0', f'"clock_hz": {token}')
    else:
        text = text.replace('"steps": 4', f'"steps": {token}')
    assert token in text
    path = write_json(tmp_path / "nan.json", text)
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, str(path), "finite")


@pytest.mark.parametrize("text, key", [
    ('{"format": "stagesplit-profile", "format": "stagesplit-profile", "version": 1}', "format"),
    (json.dumps(doc()).replace('"steps": 4', '"steps": 4, "steps": 40'), "steps"),
    (json.dumps(doc()).replace('"bytes": 100,', '"bytes": 100, "bytes": -1,', 1), "bytes"),
])
def test_duplicate_json_keys(capsys, tmp_path, text, key):
    path = write_json(tmp_path / "dup.json", text)
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, str(path), "each key at most once", f"duplicate key '{key}'")


@pytest.mark.parametrize("option, value", [
    ("--time-limit", "-1"), ("--time-limit", "nan"), ("--time-limit", "inf"), ("--time-limit", "0"),
    ("--workers", "-1"), ("--workers", "0"), ("--workers", "100000"),
    ("--link-bandwidth", "-5"), ("--link-bandwidth", "nan"), ("--link-bandwidth", "inf"), ("--link-bandwidth", "0"),
    ("--headroom", "nan"), ("--headroom", "1"), ("--headroom", "-0.1"),
    ("--micro-batches", "-2"), ("--micro-batches", "1000000000"),
    ("--min-layers", "-1"), ("--max-layers", "0"),
])
def test_nonsensical_numeric_flags(capsys, profile, option, value):
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", option, value)
    one_error(code, err, f"argument {option}: expected ")


@pytest.mark.parametrize("text, field", [
    ("time_limit: .nan\n", "time_limit"), ("time_limit: .inf\n", "time_limit"), ("time_limit: -5\n", "time_limit"),
    ("time_limit: 0\n", "time_limit"), ("headroom: .nan\n", "headroom"), ("workers: -2\n", "workers"),
    ("micro_batches: 100000000\n", "micro_batches"), ("time_limit: 1e400\n", "time_limit"),
])
def test_nonsensical_solver_settings(capsys, tmp_path, profile, text, field):
    path = write_json(tmp_path / "settings.yaml", text)
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", "--config", path)
    one_error(code, err, f"{path}: {field}: expected ")


@pytest.mark.parametrize("text", ["'0': .nan\n", "'0': .inf\n", "'0': -1\n", "'0': 1e308\n'1': 1e308\n",
                                  '{"0": 1e400}'])
def test_nonsensical_layer_compute(capsys, tmp_path, profile, text):
    path = write_json(tmp_path / "compute.yaml", text)
    code, out, err = cli(capsys, "breakdown", profile, "--layer-compute", path)
    one_error(code, err, str(path))


@pytest.mark.parametrize("text", ["tiles: 1\nbytes_per_tile: 1000\nclock_hz: .inf\n",
                                  "tiles: 1\nbytes_per_tile: 1000\nlink_bytes_per_s: .nan\n",
                                  "tiles: .nan\nbytes_per_tile: 1000\n",
                                  "tiles: 1\nbytes_per_tile: 100000000000000000000000\n"])
def test_nonsensical_target_file(capsys, tmp_path, profile, text):
    path = write_json(tmp_path / "device.yaml", text)
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", "--target", path)
    one_error(code, err, str(path))


@pytest.mark.parametrize("bytes_each, count", [(2**62, 4), (2**63 - 1, 1), (2**51, 1), (2**49, 3)])
def test_byte_sums_past_int64_or_the_limit(capsys, tmp_path, bytes_each, count):
    d = doc()
    for i in range(count):
        d["variables"][i]["bytes"] = bytes_each
    path = write_json(tmp_path / "big.json", d)
    code, out, err = cli(capsys, "solve", path, "--devices", "2")
    one_error(code, err, str(path), "1 PiB")
    assert "-" not in err.split("expected")[1].split("got")[0]          # no wrapped negative sums


def test_byte_sum_limit_in_compact_and_layer_forms(capsys, tmp_path):
    arrays = profile_to_arrays(tiny_profile())
    arrays["var_bytes"] = np.full(len(arrays["var_bytes"]), 2**62, np.int64)
    path = tmp_path / "big.stagesplit"
    path.write_bytes(_compact_bytes(arrays))
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, str(path), "1 PiB")
    layers = {"format": "stagesplit-profile", "version": 1, "kind": "layers", "target": "ipu-mk2",
              "layers": [{"name": f"l{i}", "weights": 2**62} for i in range(3)]}
    path = write_json(tmp_path / "layers.json", layers)
    code, out, err = cli(capsys, "solve", path, "--devices", "2")
    one_error(code, err, str(path), "1 PiB")


@pytest.mark.parametrize("form", ["full", "layers", "compact"])
def test_compute_near_float_max(capsys, tmp_path, form):
    if form == "full":
        d = doc()
        for op in d["operations"]:
            op["compute"] = 1e308
        path = write_json(tmp_path / "huge.json", d)
    elif form == "layers":
        path = write_json(tmp_path / "huge.json", {
            "format": "stagesplit-profile", "version": 1, "kind": "layers", "target": "ipu-mk2",
            "layers": [{"name": f"l{i}", "weights": 10, "compute": 1e308} for i in range(3)]})
    else:
        arrays = profile_to_arrays(tiny_profile())
        arrays["op_compute"] = np.array([1e308, np.inf, 1.0, 1.0])
        path = tmp_path / "huge.stagesplit"
        path.write_bytes(_compact_bytes(arrays))
    code, out, err = cli(capsys, "solve", path, "--devices", "2")
    one_error(code, err, str(path), "compute")


def test_plan_with_bad_numbers(capsys, tmp_path, profile):
    plan_path = tmp_path / "plan.json"
    assert cli(capsys, "solve", profile, "--devices", "2", "--out", plan_path)[0] == 0
    plan = json.loads(plan_path.read_text())
    # a one-tile profile: its plan names the stage's memory breakdown ``memory`` (an IPU's: memory_total)
    for field, value in (("compute", "NaN"), ("bytes_received", '"lots"'), ("time_s", "Infinity"),
                         ("memory", "[1, 2]"), ("peak_bytes", "-5")):
        text = json.dumps(plan).replace(f'"{field}": ', f'"{field}": {value}, "was_{field}": ', 1)
        assert text != json.dumps(plan)
        bad = write_json(tmp_path / f"bad-{field}.json", text)
        code, out, err = cli(capsys, "diagnose", profile, "--plan", bad)
        one_error(code, err, str(bad))


@pytest.mark.parametrize("field, value, expected", [
    ("headroom", [1, 2], "request.headroom: expected a number in [0, 1)"),
    ("headroom", 1.5, "request.headroom: expected a number in [0, 1)"),
    ("micro_batches", "a\nb", "request.micro_batches: expected an integer >= 1"),
    ("layering", {"first_layer_regex": 5}, "request.layering.first_layer_regex: expected a regular expression"),
    ("layering", {"last_layer_regex": "(a+)+$"}, None),
    ("layering", {"last_layer_regex": "(?<=x)y"}, "lookaround"),
])
def test_plan_inputs_checked_before_use(capsys, tmp_path, profile, field, value, expected):
    plan_path = tmp_path / "plan.json"
    assert cli(capsys, "solve", profile, "--devices", "2", "--out", plan_path)[0] == 0
    plan = json.loads(plan_path.read_text())
    plan["request"][field] = value
    write_json(plan_path, plan)
    from stagesplit.exporters import FORMATS
    refused = 0
    for to in FORMATS:
        code, out, err = cli(capsys, "export", plan_path, "--to", to)
        assert "Traceback" not in err and "internal error" not in err, err
        if code != 0:
            one_error(code, err, expected)
            refused += 1
    assert refused > 0 if expected is not None else refused == 0


# -- 7. lone surrogates and newlines in names --------------------------------------------------------------

def _named_profile(tmp_path: Path, names: list[str]) -> Path:
    d = doc()
    for op, name in zip(d["operations"], names):
        op["layer"] = name
        op["name"] = name + "/op"
    path = tmp_path / "names.json"
    path.write_text(json.dumps(d))            # ensure_ascii: lone surrogates become \ud800 escapes
    return path


NASTY = ["a\ud800", "line\nbreak", "tab\there\r", "\x1b[31mred"]


def test_nasty_names_print_in_tables(tmp_path):
    path = _named_profile(tmp_path, NASTY)
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    done = sub(["breakdown", path, "--sections", "layers"], env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "\\ud800" in done.stdout
    out = tmp_path / "plan.yaml"
    done = sub(["solve", path, "--devices", "2", "--out", out, "--plot", tmp_path / "plan.png"], env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    done = sub(["sweep", path, "--devices", "1..3", "--plot", tmp_path / "sweep.svg"], env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_nasty_names_survive_the_compact_form(tmp_path):
    """Lone surrogates (legal JSON escapes) round-trip through the compact form."""
    path = _named_profile(tmp_path, NASTY)
    profile = load_profile(path)
    save_profile(profile, tmp_path / "names.stagesplit")
    again = load_profile(tmp_path / "names.stagesplit")
    assert again.operations.layer == profile.operations.layer == NASTY
    assert again.operations.name == [n + "/op" for n in NASTY]


@pytest.mark.parametrize("argv, fragment", [
    (["solve", "{p}", "--devices", "2", "--pin-split", "no\nsuch\ud800"], "no layer named 'no\\nsuch\\ud800'"),
    (["diagnose", "{p}", "--layers", "x\ny:z"], "got 'x\\ny:z'"),
    (["breakdown", "{p}", "--layer-regex", "(\n"], "--layer-regex"),
    (["breakdown", "{d}/missing\nfile\ud800.json"], "missing\\nfile\\ud800.json: "),
    (["solve", "{p}", "--devices", "2", "--target", "bad\ntarget"], "unknown target 'bad\\ntarget'"),
])
def test_nasty_names_in_messages_stay_one_line(capsys, tmp_path, argv, fragment):
    path = _named_profile(tmp_path, NASTY)
    argv = [a.replace("{p}", str(path)).replace("{d}", str(tmp_path)) for a in argv]
    code, out, err = cli(capsys, *argv)      # in-process: argv with lone surrogates cannot reach a child
    one_error(code, err, fragment)
    err.encode("utf-8")                      # printable on any UTF-8 terminal


def test_nasty_duplicate_layer_name(capsys, tmp_path):
    layers = {"format": "stagesplit-profile", "version": 1, "kind": "layers", "target": "ipu-mk2",
              "layers": [{"name": "a\nb\ud800", "weights": 1}, {"name": "a\nb\ud800", "weights": 1}]}
    path = write_json(tmp_path / "layers.json", layers)
    code, out, err = cli(capsys, "breakdown", path)
    one_error(code, err, "layers[1].name", "a\\nb\\ud800")


def test_one_line_escapes():
    assert one_line("a\nb\r\tc\x00\ud800\u2028\U000e0001ok") == "a\\nb\\r\\tc\\x00\\ud800\\u2028\\U000e0001ok"
    assert one_line("plain é ü 日本") == "plain é ü 日本"


# -- 8. outputs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["solve", "{p}", "--devices", "2", "--out", "{p}"],
    ["solve", "{p}", "--devices", "2", "--out", "{dir}/./base.json"],
    ["solve", "{p}", "--devices", "2", "--out", "{dir}/link.json"],
    ["breakdown", "{p}", "--out", "{p}"],
    ["sweep", "{p}", "--devices", "1..2", "--out", "{p}"],
    ["diagnose", "{p}", "--out", "{p}"],
    ["convert", "{p}", "-o", "{p}"],
    ["solve", "{p}", "--devices", "2", "--config", "{dir}/s.yaml", "--out", "{dir}/s.yaml"],
    ["solve", "{p}", "--devices", "2", "--out", "{dir}/same.json", "--plot", "{dir}/same.json"],
])
def test_output_that_is_an_input_is_refused(capsys, tmp_path, profile, argv):
    (tmp_path / "link.json").symlink_to(profile)
    (tmp_path / "s.yaml").write_text("time_limit: 5\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    argv = [a.replace("{p}", str(profile)).replace("{dir}", str(tmp_path)) for a in argv]
    code, out, err = cli(capsys, *argv)
    one_error(code, err)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_infeasible_solve_keeps_the_old_plan(capsys, tmp_path):
    d = doc()
    d["variables"][1]["bytes"] = 5000                 # layer 1 alone exceeds the 1000-byte device
    path = write_json(tmp_path / "too-big.json", d)
    old = tmp_path / "plan.json"
    old.write_text("the old plan\n")
    code, out, err = cli(capsys, "solve", path, "--devices", "3", "--out", old, "--plot", tmp_path / "p.png")
    assert code == 1
    assert "Traceback" not in err and "wrote" not in err
    assert old.read_text() == "the old plan\n"
    assert not (tmp_path / "p.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "too-big.json"]


@pytest.mark.parametrize("command, plot", [("solve", "plot.pdf"), ("solve", "plot"), ("sweep", "plot.jpg"),
                                           ("solve", "missing/plot.png"), ("diagnose", "plot.txt")])
def test_bad_plot_is_found_before_any_output_is_written(capsys, tmp_path, profile, command, plot, monkeypatch):
    old = tmp_path / "out.txt"
    old.write_text("old\n")
    devices = {"solve": ["--devices", "2"], "sweep": ["--devices", "1..2"], "diagnose": []}[command]

    def never(*args, **kw):
        raise AssertionError("the profile was read before the outputs were checked")
    monkeypatch.setattr("stagesplit.io.load_profile", never)        # refused before any reading or solving
    code, out, err = cli(capsys, command, profile, *devices, "--out", old, "--plot", tmp_path / plot)
    one_error(code, err, "--plot")
    assert old.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json", "out.txt"]


@pytest.mark.parametrize("out", ["missing/plan.json", ".", "/dev/null"])
def test_bad_out_is_found_before_any_output_is_written(capsys, tmp_path, profile, out):
    code, out_text, err = cli(capsys, "solve", profile, "--devices", "2", "--out", out, "--plot",
                              tmp_path / "plot.png")
    one_error(code, err, "--out")
    assert not (tmp_path / "plot.png").exists()


# -- 9. Ctrl-C ---------------------------------------------------------------------------------------------

def test_solve_interruptibly_stops_the_search():
    """The interrupt stops the search (StopSearch is called, and CP-SAT reports stopping long
    before its own 600 s limit without proving anything), instead of the interrupt waiting for
    the search to end."""
    from ortools.sat.python import cp_model
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 600
    solver.parameters.num_workers = 1
    stops = []
    stop = solver.StopSearch
    solver.StopSearch = lambda: (stops.append(1), stop())[1]
    previous = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        solve_interruptibly(solver, hard_cp_model())
    assert stops == [1]
    assert solver.wall_time < solver.parameters.max_time_in_seconds / 2
    assert solver.response_proto.status.name in ("FEASIBLE", "UNKNOWN")
    assert signal.getsignal(signal.SIGINT) is previous
    # without an interrupt the status comes back as usual
    solver.parameters.max_time_in_seconds = 0.2
    assert solve_interruptibly(solver, hard_cp_model()) in (cp_model.FEASIBLE, cp_model.OPTIMAL, cp_model.UNKNOWN)


CTRL_C_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import stagesplit.solver.cpsat as solver
    import stagesplit.common.interrupt as interrupt
    sys.path.insert(0, {tests!r})
    from helpers import hard_cp_model
    marker = Path({marker!r})

    def hard(s, model):                      # the real solve, on a model that takes minutes
        s.parameters.max_time_in_seconds = 600
        marker.write_text("solving")
        try:
            return interrupt.solve_interruptibly(s, hard_cp_model())
        finally:                             # CP-SAT's own account of the search it ran
            marker.write_text(f"{{s.wall_time}} {{s.response_proto.status.name}}")

    solver.solve_interruptibly = hard
    import stagesplit.plan.search as search
    search.dp_seconds_estimate = lambda problem: float("inf")   # CP-SAT searches (the DP would prove it at once)
    from stagesplit.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_ctrl_c_during_search_exits_130_and_keeps_files(tmp_path, profile):
    old = tmp_path / "plan.json"
    old.write_text("the old plan\n")
    marker = tmp_path / "marker"
    script = tmp_path / "run.py"
    script.write_text(CTRL_C_SCRIPT.format(tests=str(ROOT / "tests"), marker=str(marker)))
    proc = subprocess.Popen([PYTHON, str(script), "solve", str(profile), "--devices", "3", "--out", str(old)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), proc.communicate(timeout=5)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)          # a hang guard: the search's own limit is 600 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    searched, status = marker.read_text().split()
    assert float(searched) < 300 and status in ("FEASIBLE", "UNKNOWN")   # stopped, far from its limit
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "stagesplit: interrupted" and "Traceback" not in err
    assert old.read_text() == "the old plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json", "marker", "plan.json", "run.py"]


AFTER_SOLVE_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    # Python's own handler, whatever this process inherited (a shell's background job starts
    # with SIGINT ignored, and Python then leaves it ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from stagesplit.cli import main
    code = main(["solve", {profile!r}, "--devices", "2"])
    try:
        os.kill(os.getpid(), signal.SIGINT)   # the OS-level handler must still be Python's
        for _ in range(1000):
            pass
    except KeyboardInterrupt:
        print("caught", code)
""")


def test_sigint_handler_is_python_after_a_solve(tmp_path, profile):
    script = tmp_path / "after.py"
    script.write_text(AFTER_SOLVE_SCRIPT.format(profile=str(profile)))
    done = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "caught 0", (done.returncode, done.stderr)


INTERRUPTED_WRITE_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from stagesplit.common import fileio as fileio
    signal.signal(signal.SIGINT, signal.{handler})
    real_fsync = os.fsync
    def fsync_then_interrupt(fd):
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGINT)    # Ctrl-C while the temporary file exists
    fileio.os.fsync = fsync_then_interrupt
    try:
        fileio.atomic_write_text({target!r}, "new contents\\n")
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(130)
    print("not interrupted")
""")


@pytest.mark.parametrize("handler, status", [("default_int_handler", 130), ("SIG_DFL", -signal.SIGINT)])
def test_interrupted_atomic_write_leaves_no_temporary_file(tmp_path, handler, status):
    target = tmp_path / "out" / "plan.json"
    target.parent.mkdir()
    target.write_text("old contents\n")
    script = tmp_path / "write.py"
    script.write_text(INTERRUPTED_WRITE_SCRIPT.format(handler=handler, target=str(target)))
    done = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert done.returncode == status, done.stderr
    assert target.read_text() == "old contents\n"
    assert os.listdir(target.parent) == ["plan.json"]


@pytest.fixture
def python_sigint_handler():
    """SIGINT handled by Python's default handler for the test (a process started as a shell's
    background job inherits SIGINT ignored), and the inherited handler put back after."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def test_deferred_signals_hold_and_redeliver(python_sigint_handler):
    with pytest.raises(KeyboardInterrupt):
        with deferred_signals() as interrupted:
            assert not interrupted()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert interrupted()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_atomic_write_in_process_keeps_old_file_on_interrupt(tmp_path, monkeypatch, python_sigint_handler):
    target = tmp_path / "plan.json"
    target.write_text("old\n")
    real = os.fsync

    def interrupt(fd):
        real(fd)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr("stagesplit.common.fileio.os.fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(target, b"new\n")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["plan.json"]


# -- 10. issue 18: no output may be an input, for any command ---------------------------------------------

def _recorded_plan(capsys, tmp_path: Path, profile: Path) -> Path:
    plan = tmp_path / "r.json"
    assert cli(capsys, "solve", profile, "--devices", "2", "--out", plan)[0] == 0
    return plan


@pytest.mark.parametrize("argv", [
    ["solve", "--from-plan", "{r}", "--out", "{r}"],                                  # the plan it re-runs
    ["solve", "--from-plan", "{r}", "--out", "{p}"],                                  # the profile it records
    ["solve", "--from-plan", "{r}", "--out", "{dir}/sub/../base.json"],
    ["solve", "--from-plan", "{r}", "--devices", "2", "--plot", "{dir}/plot.png", "--out", "{dir}/r-link.json"],
    ["export", "{r}", "--to", "deepspeed", "-o", "{r}"],
    ["export", "{dir}/r-link.json", "--to", "megatron", "--output", "{r}"],
    ["diagnose", "{p}", "--plan", "{r}", "--out", "{r}"],
    ["diagnose", "{p}", "--plan", "{r}", "--out", "{dir}/hard-r.json"],
    ["breakdown", "{p}", "--layer-compute", "{dir}/lc.yaml", "--out", "{dir}/lc.yaml"],
    ["sweep", "{p}", "--devices", "1..2", "--config", "{dir}/s.yaml", "--out", "{dir}/linkdir/s.yaml"],
    ["solve", "{p}", "--devices", "2", "--target", "{dir}/t.yaml", "--out", "{dir}/t.yaml"],
    ["synth", "gpt", "--target", "{dir}/t.yaml", "-o", "{dir}/t.yaml"],
    ["convert", "{dir}/profile.pop", "{dir}/debug.cbor", "-o", "{dir}/debug.cbor"],
    ["convert", "{dir}/hard.json", "-o", "{p}"],
    ["convert", "{p}", "-o", "{dir}/dangling"],
    ["capture", "{dir}/factories.py:build", "-o", "{dir}/factories.py"],
    ["capture", "factories.py:build", "-o", "{dir}/linkdir/factories.py"],
    ["capture", "pkg.mod:build", "-o", "{dir}/pkg/mod.py"],
    ["capture", "pkg.mod:build", "-o", "{dir}/pkg/__init__.py"],
], ids=lambda a: " ".join(a)[:60])
def test_every_output_that_is_an_input_is_refused(capsys, tmp_path, profile, argv, monkeypatch):
    """Same device and inode (hard links, symlinks, a symlinked folder), or the same resolved path
    for a file not made yet: refused in one line before anything is read, run or written."""
    plan = _recorded_plan(capsys, tmp_path, profile)
    (tmp_path / "r-link.json").symlink_to(plan)
    os.link(plan, tmp_path / "hard-r.json")
    os.link(profile, tmp_path / "hard.json")
    (tmp_path / "linkdir").symlink_to(tmp_path)
    (tmp_path / "dangling").symlink_to("base.json")
    (tmp_path / "sub").mkdir()
    (tmp_path / "lc.yaml").write_text("'0': 5\n")
    (tmp_path / "s.yaml").write_text("time_limit: 5\n")
    (tmp_path / "t.yaml").write_text("tiles: 1\nbytes_per_tile: 1000\n")
    (tmp_path / "profile.pop").write_bytes(b"not read")
    (tmp_path / "debug.cbor").write_bytes(b"not read")
    (tmp_path / "factories.py").write_text("raise SystemExit('never imported')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('never imported')\n")
    (tmp_path / "pkg" / "mod.py").write_text("raise SystemExit('never imported')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    argv = [a.replace("{p}", str(profile)).replace("{r}", str(plan)).replace("{dir}", str(tmp_path)) for a in argv]
    code, out, err = cli(capsys, *argv)
    line = one_error(code, err, "is also an input (", "writing it would destroy that input")
    flag = next(a for a in ("--out", "--output", "--plot") if f"error: {a} " in line)
    assert flag in ("--out", "--output") and out == ""
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()} == before
    assert "pkg" not in sys.modules and "pkg.mod" not in sys.modules


def test_guard_same_file_cases(tmp_path):
    from stagesplit.common.guards import same_file
    a = tmp_path / "a.json"
    a.write_text("{}")
    os.link(a, tmp_path / "b.json")
    (tmp_path / "c.json").symlink_to(a)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert same_file(a, tmp_path / "b.json") and same_file(tmp_path / "c.json", a)
    assert same_file(tmp_path / "new.json", tmp_path / "x" / ".." / "new.json")     # neither exists yet
    assert not same_file(a, tmp_path / "new.json")
    assert not same_file(tmp_path / "loop", a) and same_file(tmp_path / "loop", tmp_path / "loop")
    assert not same_file(tmp_path / "nul\0.json", a)


def test_symlink_loops_as_inputs_or_outputs_are_one_line(capsys, tmp_path, profile):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    code, out, err = cli(capsys, "convert", tmp_path / "loop1", "-o", tmp_path / "out.json")
    one_error(code, err, str(tmp_path / "loop1"))
    code, out, err = cli(capsys, "solve", profile, "--devices", "2", "--config", tmp_path / "loop1")
    one_error(code, err, str(tmp_path / "loop1"), "symbolic links")
    code, out, err = cli(capsys, "breakdown", profile, "--out", tmp_path / "loop1" / "x.txt")
    one_error(code, err, "--out", "cannot write")


def test_outputs_that_are_distinct_files_are_written(capsys, tmp_path, profile):
    plan = _recorded_plan(capsys, tmp_path, profile)
    code, out, err = cli(capsys, "solve", "--from-plan", plan, "--out", tmp_path / "again.json")
    assert code == 0, err
    assert json.loads((tmp_path / "again.json").read_text())["stages"] == json.loads(plan.read_text())["stages"]
    code, out, err = cli(capsys, "export", plan, "--to", "deepspeed", "-o", tmp_path / "ds.json")
    assert code == 0 and (tmp_path / "ds.json").exists(), err


# -- 11. issue 18: a refused value names its field, in every profile form ----------------------------------

def _nodes(value, path=()):
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _nodes(child, path + (key,))
    elif isinstance(value, list):
        for k, child in enumerate(value):
            yield from _nodes(child, path + (k,))


def _with_token(document, path, token: str) -> str:
    """The JSON text of ``document`` with the value at ``path`` replaced by the raw ``token``."""
    import copy
    d = copy.deepcopy(document)
    target = d
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = "@@token@@"
    return json.dumps(d).replace('"@@token@@"', token)


def _full_document() -> dict:
    from stagesplit.io.jsonprofile import profile_to_document
    return profile_to_document(tiny_profile(True))


def _layer_document() -> dict:
    from stagesplit.io.layerform import LayerSpec, layer_document
    d = layer_document([LayerSpec("a", 10, 20, 30, 40, 50, 60.0), LayerSpec("b", 1, 2, 3, 4, 5, 6.0)],
                       {"name": "t", "tiles": 1, "bytes_per_tile": 10**6, "clock_hz": 1e9}, name="n")
    d["shared"] = {"weights": 5, "other": 6}
    return d


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "9" * 50]


@pytest.mark.parametrize("form", ["full", "layers"])
@pytest.mark.parametrize("token", NON_FINITE)
def test_non_finite_numbers_name_their_field(tmp_path, form, token):
    """Every number of a valid profile, replaced by NaN, an infinity, an overflowing float or a
    50-digit integer: the message names that number's field (``variables[0].bytes``)."""
    from stagesplit.common.safeinput import field_path
    document = _full_document() if form == "full" else _layer_document()
    numbers = [(p, v) for p, v in _nodes(document) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(numbers) >= 18
    path = tmp_path / "bytes-nan.json"
    for where, _ in numbers:
        path.write_text(_with_token(document, where, token))
        with pytest.raises(ProfileError) as excinfo:
            load_profile(path)
        expected = "a number of at most 40 digits" if token.startswith("9") else \
            "a finite number (this one overflows" if token[-1].isdigit() else "a finite JSON number (NaN, Infinity"
        assert str(excinfo.value).startswith(f"{path}: {field_path(list(where))}: expected {expected}"), \
            str(excinfo.value)


def test_nan_bytes_message_in_full(capsys, tmp_path):
    path = tmp_path / "bytes-nan.json"
    path.write_text(json.dumps(doc()).replace('"bytes": 100', '"bytes": NaN', 1))
    code, out, err = cli(capsys, "breakdown", path)
    assert one_error(code, err) == (f"stagesplit: error: {path}: variables[0].bytes: expected a finite JSON "
                                    "number (NaN, Infinity and -Infinity are not JSON), got 'NaN'")


@pytest.mark.parametrize("text, field", [
    ('{"a": 1, "a": 2}', "a"),
    ('{"x": {"y": [1, {"z": 1, "z": NaN}]}}', "x.y[1].z"),
    ('[1, 2, Infinity]', "[2]"),
    ('NaN', "document"),
    ('{"k": [[' + "1" * 60 + ']]}', "k[0][0]"),
])
def test_strict_json_names_the_path_of_the_first_refusal(text, field):
    with pytest.raises(ProfileError) as excinfo:
        load_json(text, "f.json")
    assert str(excinfo.value).startswith(f"f.json: {field}: expected "), str(excinfo.value)


@pytest.mark.parametrize("form", ["full", "layers"])
def test_any_value_of_the_wrong_type_names_its_record(tmp_path, form):
    """Every value (numbers, strings, lists, objects) replaced by each wrong type: accepted, or
    refused naming that field or its record (a cross-reference names the field that refers)."""
    from stagesplit.common.safeinput import field_path
    document = _full_document() if form == "full" else _layer_document()
    path = tmp_path / "typed.json"
    refused = 0
    for where, _ in list(_nodes(document))[1:]:
        for token in ('"x"', "null", "[]", "{}", "true", "-1", "1.5", "4611686018427387904", '"\\ud800"'):
            path.write_text(_with_token(document, where, token))
            try:
                load_profile(path)
            except ProfileError as exc:
                refused += 1
                message, full = str(exc), field_path(list(where))
                record = field_path(list(where[:2])) if len(where) > 1 and isinstance(where[1], int) else full
                parent = field_path(list(where[:-1])) or full           # a sibling: step_trace.tiles/.bytes
                assert message.startswith((f"{path}: {full}", f"{path}: {record}", f"{path}: {parent}",
                                           f"{path}: operations[", f"{path}: variables[")), (full, token, message)
    assert refused > 100


def _compact_with(tmp_path: Path, key: str, value) -> Path:
    arrays = profile_to_arrays(tiny_profile(True))
    array = arrays[key].astype(np.float64 if arrays[key].dtype.kind == "f" else np.int64)
    array.reshape(-1)[0] = value
    arrays[key] = array
    path = tmp_path / "bad.stagesplit"
    path.write_bytes(_compact_bytes(arrays))
    return path


@pytest.mark.parametrize("key, value, message", [
    ("var_bytes", -5, "variables[0].bytes: expected an integer >= 0 (stored in var_bytes[0]), got -5"),
    ("var_bytes", 2**62, "variables[0].bytes: expected a byte count <= 1,125,899,906,842,624 (1 PiB) (stored in "
                         "var_bytes[0]), got 4611686018427387904"),
    ("var_tile", 9, "variables[0].tile: expected a tile index in 0..1 (stored in var_tile[0]), got 9"),
    ("op_compute", np.inf, "operations[0].compute: expected a finite compute figure (stored in op_compute[0]), "
                           "got inf"),
    ("op_compute", -1.0, "operations[0].compute: expected a number >= 0 (stored in op_compute[0]), got -1.0"),
    ("program_cycles", 1e308, "programs[0].cycles: expected a compute figure <= 1e+30 (stored in "
                              "program_cycles[0]), got 1e+308"),
    ("op_vars", 99, "operations[0].vars[0]: expected a variable index in 0..6 (stored in op_vars[0]), got 99"),
    ("live_intervals", -3, "liveness[0].intervals[0]: expected an interval start in 0..6 (stored in "
                           "live_intervals[0]), got -3"),
    ("vertex_code_bytes", -2, "programs.vertex_code[0].bytes: expected an integer >= 0 (stored in "
                              "vertex_code_bytes[0]), got -2"),
    ("gt_step_bytes", -7, "ground_truth.step_trace.bytes[0][0]: expected a byte count >= 0 (stored in "
                          "gt_step_bytes[0][0]), got -7"),
    ("gt_category_1", 2**62, "ground_truth.categories.constant[0]: expected a byte count <= 1,125,899,906,842,624 "
                             "(1 PiB) (stored in gt_category_1[0]), got 4611686018427387904"),
    ("op_inputs_count", -1, "op_inputs_count: expected counts >= 0 summing to 5 (the number of op_inputs "
                            "strings), got -1"),
])
def test_compact_errors_name_the_field_and_its_array(capsys, tmp_path, key, value, message):
    path = _compact_with(tmp_path, key, value)
    code, out, err = cli(capsys, "breakdown", path)
    assert one_error(code, err) == f"stagesplit: error: {path}: {message}"


@pytest.mark.parametrize("change, message", [
    (lambda h: h["target"].update(clock_hz="@NaN"), "header.target.clock_hz: expected a finite JSON number"),
    (lambda h: h["info"].update(name="@1e999"), "header.info.name: expected a finite number"),
    (lambda h: h.update(version="@" + "7" * 45), "header.version: expected a number of at most 40 digits"),
])
def test_compact_header_refusals_keep_their_field(tmp_path, change, message):
    arrays = profile_to_arrays(tiny_profile(True))
    header = json.loads(arrays["header"].tobytes())
    change(header)
    text = json.dumps(header)
    for token in ("NaN", "1e999", "7" * 45):
        text = text.replace(f'"@{token}"', token)
    arrays["header"] = np.frombuffer(text.encode(), np.uint8)
    path = tmp_path / "header.stagesplit"
    path.write_bytes(_compact_bytes(arrays))
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    assert str(excinfo.value).startswith(f"{path}: {message}"), str(excinfo.value)


@pytest.mark.parametrize("layers, message", [
    ([{"name": "a", "weights": 2**62}], "layers[0].weights: expected a byte count <= 1,125,899,906,842,624 (1 PiB), "
                                        "got 4611686018427387904"),
    ([{"name": "a", "compute": 1e300}], "layers[0].compute: expected a number <= 1e+30, got 1e+300"),
    ([{"name": f"l{i}", "output": 2**49} for i in range(2)],
     "layers: expected byte counts summing to at most 1,125,899,906,842,624 (1 PiB), got 2251799813685248"),
])
def test_layer_form_limits_name_the_layer(capsys, tmp_path, layers, message):
    path = write_json(tmp_path / "layers.json", {"format": "stagesplit-profile", "version": 1, "kind": "layers",
                                                 "target": "ipu-mk2", "layers": layers})
    code, out, err = cli(capsys, "breakdown", path)
    assert one_error(code, err) == f"stagesplit: error: {path}: {message}"


def test_any_mutation_of_a_json_profile_is_accepted_or_one_clean_line(tmp_path):
    """Hypothesis: values anywhere in a valid full or per-layer document replaced by hostile ones
    (wrong types, huge and non-finite numbers, deep or empty containers, lone surrogates), keys
    added or deleted: the reader accepts, or raises one ProfileError line naming the file."""
    from hypothesis import HealthCheck, given, settings, strategies as st_
    documents = [_full_document(), _layer_document()]
    hostile = st_.sampled_from(['"x"', "null", "[]", "{}", "true", "-1", "0", "1.5", "NaN", "-Infinity", "1e999",
                                "4611686018427387904", "9" * 45, '"\\ud800\\n"', "[[[[[]]]]]", '{"a": NaN}',
                                "-9223372036854775809", "1e-400", '"' + "a" * 200 + '"'])

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(which=st_.integers(0, 1), picks=st_.lists(st_.tuples(st_.integers(0, 10**6), hostile, st_.booleans()),
                                                     min_size=1, max_size=3))
    def check(which, picks):
        import copy
        d = copy.deepcopy(documents[which])
        tokens = {}
        for n, (pick, token, delete) in enumerate(picks):
            places = [p for p, _ in _nodes(d)][1:]
            where = places[pick % len(places)]
            parent = d
            for part in where[:-1]:
                parent = parent[part]
            if delete and isinstance(parent, dict):
                del parent[where[-1]]
            else:
                parent[where[-1]] = f"@@{n}@@"
                tokens[f'"@@{n}@@"'] = token
        text = json.dumps(d)
        for marker, token in tokens.items():
            text = text.replace(marker, token)
        path = tmp_path / "mutant.json"
        path.write_text(text)
        try:
            load_profile(path)
        except ProfileError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"{path}: "), str(exc)

    check()


# -- 12. docs/safety.md: its examples run and print what it says ---------------------------------------------

def _console_blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """Each ```console block as (command, expected output lines) pairs; a command holding a
    quoted here-document (<<'EOF') runs on to its EOF line."""
    import re
    blocks = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        steps: list[tuple[str, list[str]]] = []
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            assert line.startswith("$ "), f"output before any command: {line!r}"
            command = line[2:]
            i += 1
            if "<<'EOF'" in command:
                while lines[i] != "EOF":
                    command += "\n" + lines[i]
                    i += 1
                command += "\nEOF"
                i += 1
            output = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            steps.append((command, output))
        blocks.append(steps)
    return blocks


def test_safety_doc_examples_print_what_they_say(tmp_path):
    pytest.importorskip("onnx")
    blocks = _console_blocks((ROOT / "docs" / "safety.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 4
    prelude = (f'stagesplit() {{ {PYTHON} -m stagesplit "$@"; }}\n'
               f'python() {{ {PYTHON} "$@"; }}\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for steps in blocks:
        for command, expected in steps:
            done = subprocess.run(["bash", "-c", prelude + command], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=120, env=env)
            assert (done.stdout + done.stderr).splitlines() == expected, command


@pytest.mark.parametrize("form", ["json", "compact"])
def test_program_code_bytes_past_the_limit_name_the_program(tmp_path, form):
    """A per-program code entry past 1 PiB: named as the JSON form writes it (program, entry,
    bytes column), and for a compact file also by its array."""
    from stagesplit.io.jsonprofile import profile_to_document, read_json_profile
    d = profile_to_document(tiny_profile(True))
    d["programs"][2]["exchange_code"][0][1] = 2**60
    path = write_json(tmp_path / "code.json", d)
    if form == "compact":
        target = tmp_path / "code.stagesplit"
        save_profile(read_json_profile(path), target)
        path = target
    with pytest.raises(ProfileError) as excinfo:
        load_profile(path)
    stored = " (stored in exchange_code_bytes, entry 0 of program 2)" if form == "compact" else ""
    assert str(excinfo.value) == (f"{path}: programs[2].exchange_code[0][1]: expected a byte count <= "
                                  f"1,125,899,906,842,624 (1 PiB){stored}, got 1152921504606846976")
