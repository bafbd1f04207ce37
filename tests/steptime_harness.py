"""The plan's step time against a real one on this CPU (issue #32): everything the test
(tests/plan/test_steptime_real.py) and ``benchmarks/bench_steptime.py`` share.

The path, as a user would take it with a machine of their own (``compare`` runs it):

1. The machine, by two gloo processes (one thread each, as the pipeline runs; each on a core of
   its own where the system allows: ``_own_core``): gloo's point-to-point link (a ping-pong at
   several sizes) and an all-reduce; every block of a small Hugging Face Llama (from a config,
   nothing downloaded) timed as a stage of its own (the torch-pipelining export's own stage
   modules, one block each: the first with the embeddings, the last with the final norm, head and
   loss): forward, backward and its parameters' Adam step, both ranks at once, blocks
   interleaved, the median of the runs; a matrix product's FLOP rate and a copy's bytes per
   second on one thread.
2. ``target_mapping`` / ``layer_compute``: a target file for this CPU (the FLOP and copy rates,
   the link) and the ``--layer-compute`` mapping: each layer's forward + backward + Adam seconds
   as FLOPs at the target's FLOP rate, which the target turns back into those seconds (the model
   shares each layer's figure out over its phases as the roofline times its operations:
   model/phases.py; Adam's by its bytes at the copy rate).
3. The CLI, as a user runs it: ``stagesplit solve PROFILE --target cpu-gloo.yaml --layer-compute
   layers.yaml --communication`` (the solver's split, or one forced with ``--pin-split``),
   ``stagesplit export --to torch-pipelining``.
4. Each export's own program (``build_pipeline``, ``train_step``, Adam's step, ``zero_grad``) on
   the same two processes, the plans interleaved round by round, each round first timing every
   block once more (so that the blocks and the steps see the machine's load alike), after a
   warm-up round; a step's time is the slower rank's, from a barrier to its optimizer step's end;
   the median over rounds. Each rank's busy time (its compute actions, clocked inside the
   runtime, and its optimizer step) is recorded beside it.

The prediction is the plan's ``schedule.step_time`` for the split that ran, solved again (pinned to
that split) from the blocks timed in step 4: the tool's own model, into which nothing measured of
the pipeline's steps goes.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "stagesplit" / "exporters" / "templates" / "stage_modules.py"

__all__ = ["BATCH", "LAYERS", "SEQUENCE", "Case", "Machine", "Row", "batch", "capture_spec", "compare", "factory",
           "layer_compute", "model", "solve", "target_mapping", "write_yaml"]

#: sequences per micro-batch and tokens per sequence; blocks
BATCH, SEQUENCE, LAYERS = 4, 64, 8
VOCAB = 256


def _config():
    import transformers as tf
    config = tf.LlamaConfig(vocab_size=VOCAB, use_cache=False, bos_token_id=1, eos_token_id=2, hidden_size=256,
                            intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=SEQUENCE, num_hidden_layers=LAYERS, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    return config


def model(device: str | None = None):
    """The Llama with random weights (seeded by the caller), float32, in training mode."""
    import torch
    import transformers as tf
    if device == "meta":
        with torch.device("meta"):
            return tf.LlamaForCausalLM(_config())
    return tf.LlamaForCausalLM(_config()).train()


def batch(micro_batches: int, seed: int = 7) -> tuple:
    """``micro_batches`` micro-batches of token ids, and the labels (the ids themselves)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH * micro_batches, SEQUENCE), generator=g)
    return ids, ids


def factory():
    """The ``stagesplit capture`` factory: the model on the meta device, one micro-batch, labels = ids."""
    import torch
    ids = torch.zeros(BATCH, SEQUENCE, dtype=torch.long, device="meta")
    return model("meta"), {"input_ids": ids, "labels": ids}


def capture_spec() -> str:
    return f"{Path(__file__).resolve()}:factory"


def _stage_modules():
    """The export's template (stage modules of a Hugging Face causal language model), loaded from its file."""
    spec = importlib.util.spec_from_file_location("stagesplit_steptime_stage_modules", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Machine:
    """What the two processes measured (``compare``): per block, the median forward and backward
    seconds of one micro-batch and of its parameters' Adam step; the link's one-way latency (s) and bandwidth
    (bytes/s) fitted to the ping-pong (and the medians it was fitted to: bytes -> seconds), and an
    all-reduce's seconds by bytes; a matrix product's FLOP rate and a copy's bytes per second on
    one thread."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    optimizer: tuple[float, ...]
    latency_s: float
    bytes_per_s: float
    one_way: dict[int, float]
    all_reduce: dict[int, float]
    flops_per_s: float
    memory_bytes_per_s: float
    #: whether each rank had a core of its own, ahead of the machine's other work (``_own_core``)
    own_cores: bool = False


# -- step 1: the machine ---------------------------------------------------------------------------------

class _Blocks:
    """Every block of the model as a stage of its own (the export's stage modules, one block each),
    each with its own Adam over the stage's parameters: ``once`` times each block's forward,
    backward and optimizer step, one after the other."""

    def __init__(self) -> None:
        import torch
        torch.manual_seed(0)
        net = model()
        self.ids, self.labels = batch(1)
        self.stages = _stage_modules().model_stages(net, "model.layers", list(range(LAYERS)), self.ids)
        self.hidden = torch.randn(BATCH, SEQUENCE, net.config.hidden_size)
        self.grad = torch.randn_like(self.hidden)
        self.optimizers = [torch.optim.Adam(stage.parameters(), lr=0.0) for stage in self.stages]

    def once(self) -> list[tuple[float, float, float]]:
        out = []
        for stage, optimizer in zip(self.stages, self.optimizers):
            x = self.ids if stage.is_first else self.hidden.detach().requires_grad_(True)
            start = time.perf_counter()
            y = stage(x)
            if stage.is_last:
                y = stage.loss(y, self.labels)
            middle = time.perf_counter()
            y.backward(None if stage.is_last else self.grad)
            end = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            out.append((middle - start, end - middle, time.perf_counter() - end))
        return out


def _memory_rate(repeats: int = 9) -> float:
    """Bytes per second a copy of 32 MiB moves on this thread (read and written; the median run)."""
    import torch
    a = torch.randn(8 * 2**20)
    b = torch.empty_like(a)
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        b.copy_(a)
        times.append(time.perf_counter() - start)
    return 2 * a.numel() * 4 / statistics.median(times[2:])


def _flop_rate(repeats: int = 9) -> float:
    """A float32 matrix product's FLOP rate on this thread (the median run)."""
    import torch
    a, b = torch.randn(256, 512), torch.randn(512, 512)
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        for _ in range(8):
            torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 8 * 2 * 256 * 512 * 512 / statistics.median(times[2:])


def _ping_pong(rank: int, sizes: Sequence[int], repeats: int) -> dict[int, list[float]]:
    """One-way seconds per message size: half a round trip rank 0 -> 1 -> 0."""
    import torch
    import torch.distributed as dist
    out: dict[int, list[float]] = {}
    for size in sizes:
        buffer = torch.zeros(size // 4)
        for run in range(repeats + 2):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(buffer, 1)
                dist.recv(buffer, 1)
            else:
                dist.recv(buffer, 0)
                dist.send(buffer, 0)
            if run >= 2:
                out.setdefault(size, []).append((time.perf_counter() - start) / 2)
    return out


def _all_reduce(sizes: Sequence[int], repeats: int) -> dict[int, list[float]]:
    """Seconds of an all-reduce (sum) over both ranks per message size."""
    import torch
    import torch.distributed as dist
    out: dict[int, list[float]] = {}
    for size in sizes:
        buffer = torch.zeros(size // 4)
        for run in range(repeats + 2):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if run >= 2:
                out.setdefault(size, []).append(time.perf_counter() - start)
    return out


#: the bytes of one micro-batch's hidden state, what a pipeline's stages send each other (float32)
HIDDEN_BYTES = BATCH * SEQUENCE * 256 * 4
#: the ping-pong's message sizes, bytes: from a few words to a few hidden states
LINK_SIZES = (4096, 65536, HIDDEN_BYTES, 1048576, 4194304)


def _fit_link(one_way: dict[int, float]) -> tuple[float, float]:
    """Least-squares ``latency + bytes / bandwidth`` through the medians (latency at least 0)."""
    import numpy as np
    x = np.array(sorted(one_way), float)
    y = np.array([one_way[int(s)] for s in x])
    slope, intercept = np.polyfit(x, y, 1)
    return max(float(intercept), 0.0), 1.0 / max(float(slope), 1e-15)


def _median(records: Sequence[dict], key: str) -> dict[int, float]:
    """Per message size, the median over both ranks' runs."""
    return {int(s): statistics.median(v for r in records for v in r[key][s]) for s in records[0][key]}


def _machine(records: Sequence[dict], blocks: Sequence[dict] | None = None) -> Machine:
    """The figures from both ranks' records (``blocks``: the block times from these instead)."""
    one_way = _median(records, "link")
    latency, bandwidth = _fit_link(one_way)
    runs = [run for r in (blocks or records) for run in r["blocks"]]       # each: per block (f, b, o)

    def per_block(i: int) -> tuple[float, ...]:
        return tuple(statistics.median(run[i][k] for run in runs) for k in range(LAYERS))
    return Machine(forward=per_block(0), backward=per_block(1), optimizer=per_block(2), latency_s=latency,
                   bytes_per_s=bandwidth, one_way=one_way, all_reduce=_median(records, "all_reduce"),
                   flops_per_s=statistics.median(r["flops"] for r in records),
                   memory_bytes_per_s=statistics.median(r["memory"] for r in records),
                   own_cores=all(r["own_core"] for r in records))


# -- step 2: the target and the layers' compute ----------------------------------------------------------

def target_mapping(machine: Machine) -> dict:
    """A target file for this CPU: one "tile" of 8 GiB, the measured FLOP and copy rates and link.
    The link (``link_bytes_per_s``, what a pipeline's transfers are priced with: bytes over it) is
    the rate gloo achieves for a message of the size the stages send, the hidden state: its bytes
    over its one-way time, so that a crossing costs what one measured, latency included (the
    latency and bandwidth fitted over every size are the node's, for collectives)."""
    bw, lat = round(machine.bytes_per_s), float(f"{machine.latency_s:.3g}")
    return {"name": "cpu-gloo", "kind": "cpu",
            "description": "this CPU, one thread per process, gloo between processes (measured)",
            "tiles": 1, "bytes_per_tile": 8 * 2**30, "flops_per_s": round(machine.flops_per_s),
            "memory_bytes_per_s": round(machine.memory_bytes_per_s),
            "link_bytes_per_s": round(HIDDEN_BYTES / machine.one_way[HIDDEN_BYTES]),
            "node": {"gpus_per_node": 2, "intra_bytes_per_s": bw, "intra_latency_s": lat,
                     "inter_bytes_per_s": bw, "inter_latency_s": lat}}


def layer_compute(machine: Machine) -> dict[str, float]:
    """``--layer-compute``: each layer (named as the capture names them: its block's index) its
    forward, backward and optimizer step seconds (what the layer's operations add up to: one
    micro-batch's forward and backward, the step's optimizer) as FLOPs at the target's rate
    (``target_mapping``); the model shares each layer's figure out over its phases as the roofline
    times its operations (model/phases.py)."""
    rate = round(machine.flops_per_s)
    return {str(k): (f + b + o) * rate for k, (f, b, o) in enumerate(zip(machine.forward, machine.backward,
                                                                       machine.optimizer))}


def write_yaml(path: Path, mapping: dict) -> Path:
    """A mapping as YAML (JSON is YAML)."""
    path.write_text(json.dumps(mapping, indent=1) + "\n")
    return path


# -- the two processes -----------------------------------------------------------------------------------

def _wait_for(path: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not written in {timeout_s:.0f} s")
        time.sleep(0.05)
    return json.loads(path.read_text())


def _build(index: int, code: str, micro_batches: int) -> tuple:
    """One export's pipeline on this rank, as its comments say, with Adam (learning rate 0)."""
    import torch
    ns: dict = {}
    exec(compile(code, f"export{index}.py", "exec"), ns)
    torch.manual_seed(0)
    net = model()
    x, y = batch(micro_batches)
    group = ns["setup_parallel"](net, torch.device("cpu")) if "setup_parallel" in ns else None
    built, schedule, tied = ns["build_pipeline"](net, x[: x.shape[0] // micro_batches], torch.device("cpu"),
                                                 group=group)
    stages = list(built) if isinstance(built, (list, tuple)) else [built]
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
    busy = [0.0]
    for stage in stages:
        _clocked(stage, busy)
    return (ns, built, schedule, tied, torch.optim.Adam(params, lr=0.0), x if first else None, y if last else None,
            busy)


def _clocked(stage, busy: list[float]) -> None:
    """Add the time of each compute action the schedule calls on ``stage`` (forward, backward, weight
    gradients: the work the plan's busy time counts) to ``busy[0]``."""
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        method = getattr(stage, name)

        def timed(*args, _method=method, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                busy[0] += time.perf_counter() - start
        setattr(stage, name, timed)


def _step(run: tuple) -> tuple[float, float]:
    """One training step of a built export (``train_step``, tied gradients, Adam, ``zero_grad``): its
    seconds, and the seconds of its compute actions and optimizer step (the rank's busy time)."""
    ns, built, schedule, tied, optimizer, x, y, busy = run
    busy[0] = 0.0
    start = time.perf_counter()
    ns["train_step"](built, schedule, x, y)
    ns["sum_tied_gradients"](tied)
    before = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=ns["GRADIENTS_SET_TO_NONE"])
    end = time.perf_counter()
    return end - start, busy[0] + end - before


def _own_core(rank: int) -> bool:
    """This rank on a core of its own and ahead of the machine's other work, where the operating
    system allows it; whether it could. The ranks of a pipeline are meant to run side by side,
    each on its own device; on a machine shared with other jobs, Linux's autogroups give every
    session an equal share of the cores (``nice`` counts only inside one), so two ranks of one
    session would share one session's share and a rank that waits makes the other faster, which
    no model of devices sees. So each rank starts a session of its own, pinned to a core, with the
    session's priority raised (root, or CAP_SYS_NICE) for the few seconds it runs."""
    import os
    try:
        if len(os.sched_getaffinity(0)) >= 2:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
        os.setsid()
        Path("/proc/self/autogroup").write_text("-15")
        return True
    except (OSError, AttributeError):      # not allowed here: the timings carry the machine's load
        return False


def _worker(rank: int, workdir: str, repeats: int, rounds: int, timeout_s: float) -> None:
    """One rank: the machine (link, blocks: step 1), then, once the parent has written the exports
    (``cases.json``), rounds of: every block timed once, then one step of every export (step 4)."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    own = _own_core(rank)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=2,
                            timeout=timedelta(seconds=timeout_s))
    try:
        link = _ping_pong(rank, LINK_SIZES, repeats)
        reduce = _all_reduce(LINK_SIZES, repeats)
        blocks = _Blocks()
        dist.barrier()
        runs = [blocks.once() for _ in range(repeats + 2)][2:]       # both ranks at once, as in the pipeline
        record = {"link": link, "all_reduce": reduce, "blocks": [list(zip(*r)) for r in runs],
                  "flops": _flop_rate(), "memory": _memory_rate(), "own_core": own}
        Path(workdir, f"machine{rank}.json").write_text(json.dumps(record))
        cases = _wait_for(Path(workdir, "cases.json"), timeout_s)
        built = [_build(i, code, m) for i, (code, m) in enumerate(zip(cases["codes"], cases["micro_batches"]))]
        steps: list[list[float]] = [[] for _ in built]
        working: list[list[float]] = [[] for _ in built]
        interleaved = []
        for round_ in range(rounds + 1):       # the first: warm-up (shapes, receive buffers, Adam's state)
            dist.barrier()
            times = blocks.once()
            for i, run in enumerate(built):
                dist.barrier()
                seconds, busy = _step(run)
                if round_:
                    steps[i].append(seconds)
                    working[i].append(busy)
            if round_:
                interleaved.append(list(zip(*times)))
        Path(workdir, f"steps{rank}.json").write_text(json.dumps({"steps": steps, "busy": working,
                                                                     "blocks": interleaved}))
    finally:
        dist.destroy_process_group()


# -- the whole path --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One plan to solve and run: ``schedule`` (gpipe, 1f1b) with ``micro_batches``, its split the
    solver's (``split_at`` None) or forced to start the second stage at block ``split_at``."""

    schedule: str
    micro_batches: int
    split_at: int | None = None


@dataclass(frozen=True)
class Row:
    case: Case
    split: str                    #: the plan's split, as it prints it
    predicted: float              #: the plan's step time (layers timed with the steps), seconds
    predicted_before: float       #: the plan's step time from the layers timed before the steps, seconds
    measured: tuple[float, ...]   #: the measured steps, seconds (one per round)
    transfer: float               #: the plan's transfer time of one crossing, seconds
    optimizer: tuple[float, ...]  #: the plan's optimizer step per rank, seconds
    busy: tuple[float, ...]       #: per rank, the plan's busy time (its actions and optimizer step), seconds
    busy_measured: tuple[float, ...]   #: per rank, the median over rounds of the same, measured

    @property
    def median(self) -> float:
        return statistics.median(self.measured)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured, the measured step's median."""
        return (self.predicted - self.median) / self.median


def _cli(*args) -> str:
    import contextlib
    import io

    from stagesplit.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    if code != 0:
        raise RuntimeError(f"stagesplit {' '.join(map(str, args))}: exit {code}: {err.getvalue().strip()}")
    return out.getvalue()


def solve(folder: Path, profile: Path, target: Path, layers: Path, case: Case, split_at: int | None = None,
          tag: str = "") -> Path:
    """Step 3: ``stagesplit solve`` (the second stage pinned at ``split_at`` or the case's); the plan file."""
    at = case.split_at if split_at is None else split_at
    plan = folder / f"{case.schedule}-{case.micro_batches}-{'auto' if at is None else at}{tag}.json"
    pin = [] if at is None else ["--pin-split", at]
    _cli("solve", profile, "--devices", 2, "--exact", "--target", target, "--layer-compute", layers,
         "--communication", "--schedule", case.schedule, "--micro-batches", case.micro_batches, *pin, "--out", plan)
    return plan


def _await_files(context, paths: Sequence[Path], timeout_s: float) -> list[dict]:
    """The workers' records once written (a worker's failure raises here, with its traceback)."""
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if context.join(timeout=0.05) or time.monotonic() > deadline:
            raise RuntimeError(f"the workers stopped before writing {', '.join(p.name for p in paths)}")
    time.sleep(0.2)                    # written whole: each is one write_text of a small file
    return [json.loads(p.read_text()) for p in paths]


def compare(folder: Path, cases: Sequence[Case], rounds: int = 5, repeats: int = 5,
            timeout_s: float = 300.0) -> tuple[Machine, list[Row]]:
    """The whole path (module docstring) for each case; the rows in the cases' order. The plan each
    case runs is solved from the layers timed before the steps; its prediction is the same split's
    plan solved again from the layers timed in the same rounds as the steps (the machine's load
    changes by the minute: both see the same)."""
    import torch.multiprocessing as mp
    profile = folder / "llama.stagesplit"
    if not profile.exists():
        _cli("capture", capture_spec(), "-o", profile)
    with tempfile.TemporaryDirectory(prefix="steptime-") as tmp:
        context = mp.spawn(_worker, args=(tmp, repeats, rounds, timeout_s), nprocs=2, join=False)
        try:
            records = _await_files(context, [Path(tmp, f"machine{r}.json") for r in range(2)], timeout_s)
            before = _machine(records)
            target = write_yaml(folder / "cpu-gloo.yaml", target_mapping(before))
            layers = write_yaml(folder / "layers-before.yaml", layer_compute(before))
            plans = [json.loads(solve(folder, profile, target, layers, case).read_text()) for case in cases]
            codes = []
            for case, plan in zip(cases, plans):
                out = folder / f"{case.schedule}-{case.micro_batches}-{plan['stages'][1]['first_layer']}.py"
                _cli("export", folder / f"{case.schedule}-{case.micro_batches}-"
                     f"{'auto' if case.split_at is None else case.split_at}.json", "--to", "torch-pipelining",
                     "-o", out)
                codes.append(out.read_text())
            cases_file = Path(tmp, "cases.json.part")
            cases_file.write_text(json.dumps({"codes": codes, "micro_batches": [c.micro_batches for c in cases]}))
            cases_file.rename(Path(tmp, "cases.json"))
            while not context.join():
                pass
            measured = [json.loads(Path(tmp, f"steps{r}.json").read_text()) for r in range(2)]
        finally:                       # a failure here: the workers wait for nothing
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
    machine = _machine(records, measured)
    layers = write_yaml(folder / "layers.yaml", layer_compute(machine))
    rows = []
    for i, (case, plan) in enumerate(zip(cases, plans)):
        again = json.loads(solve(folder, profile, target, layers, case, plan["stages"][1]["first_layer"],
                                 "-with-steps").read_text())
        s = again["schedule"]
        steps = [max(a, b) for a, b in zip(measured[0]["steps"][i], measured[1]["steps"][i])]
        busy = tuple(statistics.median(measured[r]["busy"][i]) for r in range(2))
        rows.append(Row(case, again["split"], float(s["step_time"]), float(plan["schedule"]["step_time"]),
                        tuple(steps), float(sum(s["transfer_times"])), tuple(s["optimizer_times"]),
                        tuple(float(r["busy"]) for r in s["ranks"]), busy))
    return machine, rows


if __name__ == "__main__":      # a quick look: python tests/steptime_harness.py
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as folder:
        found, table = compare(Path(folder), [Case(s, 4, k) for s in ("1f1b", "gpipe") for k in (None, 2, 1, 6)])
    print(found)
    for row in table:
        print(row.case, row.split, f"{row.predicted * 1e3:.1f} ms (before {row.predicted_before * 1e3:.1f})",
              f"{row.median * 1e3:.1f} ms", f"{row.error:+.1%}",
              "busy", [f"{b * 1e3:.1f}" for b in row.busy], [f"{b * 1e3:.1f}" for b in row.busy_measured])
