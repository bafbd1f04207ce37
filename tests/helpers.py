"""Shared test helpers: tiny hand-built profiles, random profile generators, equality checks."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from stagesplit.io.builder import ProfileBuilder
from stagesplit.io.layerform import LayerSpec, build_layer_profile
from stagesplit.io.profile import GroundTruth, Profile, Target
from stagesplit.io.targets import load_target
from stagesplit.model.analysis import Analysis
from stagesplit.solver.problem import SolveOptions

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "profiles"


def tiny_profile(with_ground_truth: bool = False) -> Profile:
    """Two layers on a 2-tile device, 6 steps. Hand-computed expectations live in the tests.

    steps:   0 1 | 2 | 3 4 | 5
    ops:     A   | B | C   | D        A, B: layer0   C: layer1   D: no layer (shared)
    v0 w0   100 B tile 0 always          (A)
    v1 w1    50 B tile 1 always          (C)
    v2 a     30 B tile 0 live [0, 3)     (A, B)
    v3 b     40 B tile 0 live [2, 5)     (B, C)   used by both layers
    v4 c     20 B tile 1 live [3, 4)     (C)
    v5 buf   10 B tile 0 always          (no operation: shared)
    v6 ctr    5 B tile 1 live [5, 6)     (D: shared)
    """
    b = ProfileBuilder(Target("tiny", tiles=2, bytes_per_tile=1000, clock_hz=1e9), 6)
    v0 = b.variable(100, 0, "always", name="layer0.w")
    v1 = b.variable(50, 1, "always", name="layer1.w")
    v2 = b.variable(30, 0, [(0, 3)], name="layer0/a")
    v3 = b.variable(40, 0, [(2, 5)], name="layer0/b")
    v4 = b.variable(20, 1, [(3, 4)], name="layer1/c")
    b.variable(10, 0, "always", name="stream/buffer")
    v6 = b.variable(5, 1, [(5, 6)], name="optimizer/counter")
    p0 = b.program("layer0/matmul/compute", cycles=100, vertex_code=[(0, "MatMul", 60), (1, "MatMul", 60)],
                   vertex_state=[(0, 8), (1, 8)], control_code=[(0, 4)])
    p1 = b.program("layer0/add/exchange", "DoExchange", cycles=10, vertex_code=[(0, "Add", 20)],
                   vertex_state=[(0, 4)], exchange_code=[(0, 12)])
    p2 = b.program("layer1/matmul/compute", cycles=200, vertex_code=[(0, "MatMul", 60), (1, "MatMul", 60)],
                   vertex_state=[(1, 16)], exchange_code=[(1, 6)], control_code=[(1, 3)])
    p3 = b.program("optimizer/step", cycles=7, control_code=[(0, 2), (1, 2)])
    b.operation("layer0/matmul", 0, 1, vars=[v0, v2], programs=[p0], inputs=["x", "layer0.w"])
    b.operation("layer0/add", 2, 2, vars=[v2, v3], programs=[p1], inputs=["layer0/a"])
    b.operation("layer1/matmul", 3, 4, vars=[v1, v3, v4], programs=[p2], inputs=["layer0/b", "layer1.w"])
    b.operation("optimizer/step", 5, 5, vars=[v6], programs=[p3])
    if with_ground_truth:
        b.ground_truth = GroundTruth(always_live=np.array([110, 50]), not_always_live=np.array([70, 20]),
                                     categories={"vertex_code": np.array([80, 60]), "constant": np.array([7, 0])},
                                     step_tiles=np.array([0]), step_bytes=np.array([[30, 30, 70, 40, 40, 0]]))
    return b.build()


def assert_profiles_equal(a: Profile, b: Profile) -> None:
    """Every field of two profiles is equal (arrays element-wise)."""
    _equal(a, b, "profile")


def _equal(x, y, path: str) -> None:
    if dataclasses.is_dataclass(x):
        assert type(x) is type(y), path
        for f in dataclasses.fields(x):
            if f.compare:                   # not content: e.g. the hash of the file a profile was read from
                _equal(getattr(x, f.name), getattr(y, f.name), f"{path}.{f.name}")
    elif isinstance(x, np.ndarray):
        assert isinstance(y, np.ndarray), path
        assert x.shape == y.shape, f"{path}: shape {x.shape} != {y.shape}"
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), path
    elif isinstance(x, dict):
        assert x.keys() == y.keys(), path
        for k in x:
            _equal(x[k], y[k], f"{path}[{k}]")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), f"{path}: {len(x)} != {len(y)}"
        for i, (p, q) in enumerate(zip(x, y)):
            _equal(p, q, f"{path}[{i}]")
    elif isinstance(x, float) and np.isnan(x):
        assert np.isnan(y), path
    else:
        assert x == y, f"{path}: {x!r} != {y!r}"


def random_block_profile(rng: np.random.Generator, *, layers: int, training: bool, tiles: int = 2,
                         shared_ops: bool = True, max_vars: int = 14) -> Profile:
    """A random profile laid out as compiled programs are: each layer's operations run as a block
    (forward, then, when training, backward in reverse layer order); every variable goes live at
    the step its writer runs and dies after the step of its last reader."""
    order = list(range(layers)) + (list(reversed(range(layers))) if training else [])
    ops: list[tuple[int, int, int]] = []
    step = 0
    for layer in order:
        for _ in range(int(rng.integers(1, 3))):
            width = int(rng.integers(1, 3))
            ops.append((layer, step, step + width - 1))
            step += width
        if shared_ops and rng.random() < 0.2:
            ops.append((-1, step, step))
            step += 1
    return _random_vars_and_programs(rng, ops, step, tiles, max_vars)


def random_profile(rng: np.random.Generator, *, layers: int, tiles: int = 2, max_vars: int = 14) -> Profile:
    """A random profile with operations of any layer in any order (no block structure)."""
    ops = []
    step = 0
    seq = list(range(layers)) + [int(x) for x in rng.integers(-1, layers, int(rng.integers(0, 2 * layers)))]
    for layer in seq:
        width = int(rng.integers(1, 3))
        ops.append((layer, step, step + width - 1))
        step += width
    return _random_vars_and_programs(rng, ops, step, tiles, max_vars)


def _random_vars_and_programs(rng, ops, steps, tiles, max_vars) -> Profile:
    b = ProfileBuilder(Target("random", tiles=tiles, bytes_per_tile=10**9, clock_hz=1e9), steps)
    uses: list[list[int]] = [[] for _ in ops]
    for _ in range(int(rng.integers(1, max_vars))):
        tile = int(rng.integers(0, tiles))
        nbytes = int(rng.integers(1, 100))
        w = int(rng.integers(0, len(ops)))
        if rng.random() < 0.25:
            v = b.variable(nbytes, tile, "always")
            readers = [int(r) for r in rng.integers(0, len(ops), int(rng.integers(0, 3)))]
        else:
            _, first, last = ops[w]
            start = int(rng.integers(first, last + 1))
            readers = [int(r) for r in rng.integers(0, len(ops), int(rng.integers(0, 3))) if ops[r][2] >= start]
            end = max([start] + [int(rng.integers(max(ops[r][1], start), ops[r][2] + 1)) for r in readers]) + 1
            v = b.variable(nbytes, tile, [(start, end)])
        for o in {w, *readers}:
            uses[o].append(v)
    if rng.random() < 0.3:
        b.variable(int(rng.integers(1, 50)), int(rng.integers(0, tiles)), "always")   # used by no operation
    types = ["A", "B", "C"]
    for i, (layer, first, last) in enumerate(ops):
        progs = []
        for _ in range(int(rng.integers(0, 3))):
            t = int(rng.integers(0, tiles))
            vtype = types[int(rng.integers(0, 3))]
            progs.append(b.program(f"p{b.num_programs}", cycles=float(rng.integers(1, 50)),
                                   vertex_code=[(t, vtype, 10 * (1 + types.index(vtype)))],
                                   vertex_state=[(t, int(rng.integers(0, 9)))],
                                   exchange_code=[(int(rng.integers(0, tiles)), int(rng.integers(0, 9)))],
                                   control_code=[(t, int(rng.integers(0, 5)))]))
        if progs and rng.random() < 0.2 and i > 0:
            progs.append(int(rng.integers(0, b.num_programs)))   # a program shared with an earlier op
        name = f"layer{layer}/op{i}" if layer >= 0 else f"optimizer/op{i}"
        b.operation(name, first, last, vars=uses[i], programs=progs)
    return b.build()


# ---- added for the core test suite ---------------------------------------------------------------

SAMPLE_NAMES = ("bert-base", "gpt", "cnn")


def sample_path(name: str) -> Path:
    return PROFILES / f"{name}.stagesplit"


@functools.cache
def load_sample(name: str) -> Profile:
    """A shipped sample profile, read once per test module (conftest forgets it after each; treat it
    as read-only)."""
    from stagesplit.io import load_profile
    return load_profile(sample_path(name))


@functools.cache
def sample_json_text(name: str) -> str:
    """The full-form JSON text of a shipped sample (slow to make: cached for the module)."""
    from stagesplit.io.jsonprofile import dumps_profile
    return dumps_profile(load_sample(name))


def error_line(excinfo, *, file: str | Path | None = None, field: str | None = None,
               expected: str | None = None) -> str:
    """The message of a raised StagesplitError, checked to be one line that names ``file``,
    the ``field`` path (as ``file: field: expected ...``) and what was ``expected``."""
    message = str(excinfo.value)
    assert "\n" not in message and "\r" not in message, f"not one line: {message!r}"
    if file is not None:
        assert message.startswith(f"{file}: "), message
    if field is not None:
        where = f"{file}: " if file is not None else ""
        assert f"{where}{field}: expected " in message, message
    if expected is not None:
        assert expected in message, message
    return message


# ---- small per-layer models and random split problems (solver, oracle, plan and plot tests) ------

UNIT = 1000


def layer_model(weights, compute, training=False, activations=None, output=None):
    """Per-layer profile on one tile: with no activations in inference, a stage needs exactly
    the sum of its layers' weights."""
    activations = activations or [0] * len(weights)
    output = output or [0] * len(weights)
    specs = [LayerSpec(f"l{i}", weights=w * UNIT, activations=a * UNIT, output=o * UNIT, compute=c)
             for i, (w, c, a, o) in enumerate(zip(weights, compute, activations, output))]
    return Analysis.of(build_layer_profile(specs, load_target("a100-80gb"), training=training)).model


def options(devices, capacity, **kw):
    caps = tuple(c * UNIT for c in capacity) if isinstance(capacity, (list, tuple)) else (capacity * UNIT,) * devices
    return SolveOptions(devices=devices, capacities=caps, time_limit=20, **kw)


def stage_ranges(split):
    return [(a, b) for _, a, b in split.stages]


@st.composite
def random_problems(draw, max_layers=32, max_devices=8):
    layers = draw(st.integers(1, max_layers))
    devices = draw(st.integers(1, max_devices))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    training = draw(st.booleans())
    weights = rng.integers(1, 20, layers).tolist()
    acts = rng.integers(0, 10, layers).tolist()
    outs = rng.integers(0, 4, layers).tolist()
    compute = rng.integers(0, 50, layers).tolist()
    model = layer_model(weights, compute, training=training, activations=acts, output=outs)
    biggest = max(model.stage_memory(l, l).worst_bytes() for l in range(layers)) // UNIT
    whole = model.stage_memory(0, layers - 1).worst_bytes() // UNIT
    schedule = draw(st.sampled_from(["none", "1f1b", "gpipe"]))
    micro = draw(st.integers(1, 6))
    mixed = draw(st.booleans())
    low, high = biggest, max(biggest + 1, 3 * whole // devices + 2)
    caps = [int(x) for x in rng.integers(low, high, devices)] if mixed else [int(rng.integers(low, high))] * devices
    pins = ()
    if layers > 1 and draw(st.integers(0, 3)) == 0:
        pins = (int(rng.integers(1, layers)),)
    pinned_layers = ()
    if draw(st.integers(0, 5)) == 0:
        pinned_layers = ((int(rng.integers(0, layers)), int(rng.integers(0, devices))),)
    exact = devices <= layers and draw(st.integers(0, 3)) == 0
    min_layers = 1 + (draw(st.integers(0, 4)) == 0)
    max_layers = None if draw(st.integers(0, 2)) else max(min_layers, -(-layers // devices) + draw(st.integers(0, 2)))
    # communication on half the instances, with the link rate drawn so that a cut costs from a
    # tenth of to ten times a layer's compute (compute is in FLOPs at the target's rate)
    communication = draw(st.booleans())
    link = None
    if communication:
        flop_s = 1.0 / model.profile.target.seconds_per_unit("flops")
        link = float(UNIT * flop_s / 10 ** rng.uniform(-1, 1) / 10)
    opts = SolveOptions(devices=devices, capacities=tuple(c * UNIT for c in caps),
                        objective=draw(st.sampled_from(["compute", "memory", "devices"])), exact=exact,
                        schedule=schedule, micro_batches=micro, min_layers=min_layers, max_layers=max_layers,
                        pinned_splits=pins, communication=communication, link_bytes_per_s=link,
                        pinned_layers=pinned_layers, time_limit=30)
    return model, opts


def hard_cp_model():
    """A CP-SAT model that takes far longer than any test waits (for the Ctrl-C tests)."""
    from ortools.sat.python import cp_model
    m = cp_model.CpModel()
    xs = [m.NewIntVar(0, 10**6, f"x{i}") for i in range(60)]
    for i in range(60):
        for j in range(i + 1, 60):
            m.Add(xs[i] * (i + 3) - xs[j] * (j + 5) != (i * j) % 97)
    m.Add(sum(xs) <= 10**6 + 7)
    m.Maximize(sum(x * ((i * 7919) % 101) for i, x in enumerate(xs)))
    return m


def plan_inputs(devices: int = 1, *, micro_batches_auto: bool = False, **request):
    """A plan's typed inputs for hand-built plans: a ``SolveRequest`` with ``request``'s fields
    and its resolved options (the micro-batch count given, or 1; ``micro_batches_auto`` as given)."""
    from stagesplit.plan.records import PlanInputs
    from stagesplit.solver.request import SolveRequest
    req = SolveRequest(devices=devices, **request)
    options = SolveOptions(devices=devices, objective=req.objective, exact=req.exact, schedule=req.schedule,
                           micro_batches=req.micro_batches or 1, micro_batches_auto=micro_batches_auto,
                           headroom=req.headroom, communication=req.communication,
                           link_bytes_per_s=1e9 if req.communication else None)
    return PlanInputs(request=req, options=options)


# -- the console examples of a docs page, run in-process ---------------------------------------------

def console_examples(page: Path) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of every ``$`` line in the page's console blocks."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
            if chunk.strip():
                command, *expected = chunk.rstrip("\n").split("\n")
                out.append((command, expected))
    return out


def lines_match(expected: list[str], got: list[str], same=lambda want, line: want == line) -> bool:
    """``got`` against ``expected``, where a line ``...`` matches any run of lines and other lines
    are compared by ``same``."""
    if not expected:
        return not got
    if expected[0] == "...":
        return any(lines_match(expected[1:], got[i:], same) for i in range(len(got) + 1))
    return bool(got) and same(expected[0], got[0]) and lines_match(expected[1:], got[1:], same)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """The CLI in process on ``argv`` (any values, made strings): exit code, stdout, stderr."""
    from stagesplit.cli import main
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused_line(capsys, *argv) -> str:
    """The one error line of a refused command (exit 2, nothing on stdout), without its prefix."""
    code, out, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert (code, out) == (2, ""), err
    assert len(lines) == 1 and lines[0].startswith("stagesplit: error: ") and "Traceback" not in err, err
    return lines[0].removeprefix("stagesplit: error: ")
