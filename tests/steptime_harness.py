"""The plan's step time against a real one on this CPU (issue #32): everything the test
(tests/plan/test_steptime_real.py) and ``benchmarks/bench_steptime.py`` share.

The path, as a user would take it with a machine of their own (``compare`` runs it):

1. The machine, by two gloo processes (one thread each, as the pipeline runs; each on a core of
   its own where the system allows: ``_own_core``): gloo's point-to-point link (a ping-pong at
   several sizes) and an all-reduce; every block of a small Hugging Face Llama (from a config,
   nothing downloaded) timed as a stage of its own (the torch-pipelining export's own stage
   modules, one block each: the first with the embeddings, the last with the final norm, head and
   loss): forward, backward and its parameters' optimizer step, both ranks at once, blocks
   interleaved, the median of the runs; a matrix product's FLOP rate and a copy's bytes per
   second on one thread.
2. ``target_mapping`` / ``layer_compute``: a target file for this CPU (the FLOP and copy rates,
   the link) and the ``--layer-compute`` mapping: each layer's forward, backward and optimizer seconds
   given apart (by phase), each as FLOPs at the target's FLOP rate, which the target turns back into
   those seconds (``OPTIMIZER`` says why by phase).
3. The CLI, as a user runs it: ``stagesplit solve PROFILE --target cpu-gloo.yaml --layer-compute
   layers.yaml --communication`` (the solver's split, or one forced with ``--pin-split``),
   ``stagesplit export --to torch-pipelining``.
4. Each export's own program (``build_pipeline``, ``train_step``, the optimizer's step, ``zero_grad``) on
   the same two processes, the plans interleaved round by round, each step just after one more
   timing of every block (so that the blocks and the steps see the machine's load alike), after a
   warm-up round; a step's time is the slower rank's, from a barrier to its optimizer step's end;
   the median over rounds. Each rank's busy time (its compute actions, clocked inside the
   runtime, and its optimizer step) is recorded beside it. Both processes keep the memory they free
   for their next step, as a device's caching allocator does (``_spawn``); each rank's core is kept
   busy while the rank waits, as the other rank's blocks were timed beside a busy core (``_Filler``).

The prediction is the plan's ``schedule.step_time`` for the split that ran, solved again (pinned to
that split) from the blocks timed in step 4: the tool's own model, into which nothing measured of
the pipeline's steps goes.

``compare_layouts`` does the same for three layouts of the two processes and one global batch: TP 2
(the model's declared tensor-parallel plan applied by torch's ``parallelize_module`` on a gloo mesh,
as ``capture --tp 2`` applied it; both ranks' losses recorded), PP 2 (the exported pipeline, as
above) and DP 2 (torch's DDP), interleaved round by round with the whole model's blocks and one
tensor-parallel rank's (the same plan over torch's fake process group: the rank's compute, DTensor's
work included, with collectives that move nothing). Each prediction is the layout search's step for
that layout as a user asks for it (``layout_prediction``: ``stagesplit layouts PROFILE --tp T --pp P
--dp D --zero 0 --global-batch B --micro-batch-size 4 --layer-compute layers.yaml --format json``, a
TP 2 rank's profile and its own measured blocks given with ``--tp-profile 2=FILE`` and
``--tp-layer-compute 2=FILE``), the collectives priced on the target's node, whose links are fitted
to gloo's all-reduces (``Machine.reduce_link``). Only where the search's split of PP 2 is not the
split that ran (solved from the blocks timed before the steps) is the prediction made by the
functions the search calls with that split pinned (``layout_step``: the command line has no
``--pin-split`` for the layout search).
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

from vision import torchvision_model_code

# a spawned worker has the test process's path (with torchvision's folder) but not its modules
torchvision_model_code()

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "stagesplit" / "exporters" / "templates" / "stage_modules.py"

__all__ = ["BATCH", "LAYERS", "LAYOUTS", "SEQUENCE", "Case", "LayoutRow", "Machine", "Row", "batch", "capture_spec",
           "compare", "compare_layouts", "factory", "layer_compute", "layout_name", "layout_prediction", "layout_step",
           "model", "reference_loss", "solve", "target_mapping", "tp_layer_compute", "write_yaml"]

#: sequences per micro-batch and tokens per sequence; blocks
BATCH, SEQUENCE, LAYERS = 4, 64, 8
VOCAB = 256


#: the training step's optimizer, as ``stagesplit capture --optimizer`` records it: Adam (its learning
#: rate 0 keeps the weights, so every round computes the same). Each block's forward, backward and
#: optimizer step are given apart (``--layer-compute`` by phase): given as one total, the model shares a
#: layer's figure out over its phases as the roofline times their operations, which gives Adam's
#: memory-bound step 31.6% of a block where this CPU spends about 19% there, and with 4 micro-batches
#: every step was under-predicted by about 8% (SGD, 9% by the roofline, was the harness's way round it
#: until the figures could be given by phase: docs/benchmarks.md).
OPTIMIZER = "adam"


def _optimizer(parameters):
    import torch
    return torch.optim.Adam(parameters, lr=0.0)


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
    seconds of one micro-batch and of its parameters' optimizer step; the link's one-way latency (s) and bandwidth
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
    #: the link a two-rank ring all-reduce of ``n`` bytes runs at ``2 latency + n / bandwidth`` on
    #: (model/communication.py's ``ring_time``), fitted to the all-reduces: (latency s, bytes/s)
    reduce_link: tuple[float, float] = (0.0, 1.0)
    #: one tensor-parallel rank's blocks (of two), timed as ``forward`` ... are (``compare_layouts``)
    tp_forward: tuple[float, ...] = ()
    tp_backward: tuple[float, ...] = ()
    tp_optimizer: tuple[float, ...] = ()


# -- step 1: the machine ---------------------------------------------------------------------------------

class _Blocks:
    """Every block of the model as a stage of its own (the export's stage modules, one block each),
    each with its own optimizer over the stage's parameters: ``once`` times each block's forward,
    backward and optimizer step, one after the other. ``mesh``: the blocks of one tensor-parallel
    rank instead, the model's declared plan applied on that device mesh by torch's
    ``parallelize_module`` (as the capture applies it), its parameters DTensors."""

    def __init__(self, mesh=None) -> None:
        import torch
        torch.manual_seed(0)
        net = model()
        if mesh is not None:
            _tensor_parallel(net, mesh)
        self.ids, self.labels = batch(1)
        self.stages = _stage_modules().model_stages(net, "model.layers", list(range(LAYERS)), self.ids)
        self.hidden = torch.randn(BATCH, SEQUENCE, net.config.hidden_size)
        self.grad = torch.randn_like(self.hidden)
        self.optimizers = [_optimizer(stage.parameters()) for stage in self.stages]

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


def _tensor_parallel(net, mesh) -> None:
    """The model's declared tensor-parallel plan (its ``_tp_plan``) applied on ``mesh`` by torch's
    ``parallelize_module``, through the capture's own code (capturing/tensorparallel.py), so that
    the rank runs what ``stagesplit capture --tp`` recorded."""
    import torch

    from stagesplit.capturing.tensorparallel import parallelize, resolve_plan
    parallelize(torch, net, mesh, resolve_plan(torch, net, mesh.size(), False, None))


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


#: all-reduces timed back to back in one run of ``_all_reduce``
BURST = 8


def _all_reduce(sizes: Sequence[int], repeats: int) -> dict[int, list[float]]:
    """Seconds of an all-reduce (sum) over both ranks per message size: each run ``BURST`` of them
    back to back, their mean, as a tensor-parallel rank's collectives follow each other in step. The
    burst is timed from the end of a first all-reduce after the barrier, not from the barrier: the
    ranks leave a barrier apart (up to a millisecond on a loaded machine), and that first all-reduce
    absorbs the skew, which a rank's collectives inside its step do not pay each time (timed from the
    barrier, their mean priced the TP 2 step 5-9% over what it measured, in three runs)."""
    import torch
    import torch.distributed as dist
    out: dict[int, list[float]] = {}
    for size in sizes:
        buffer = torch.zeros(size // 4)
        for run in range(repeats + 2):
            dist.barrier()
            dist.all_reduce(buffer)
            start = time.perf_counter()
            for _ in range(BURST):
                dist.all_reduce(buffer)
            if run >= 2:
                out.setdefault(size, []).append((time.perf_counter() - start) / BURST)
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


def _fit_all_reduce(all_reduce: dict[int, float]) -> tuple[float, float]:
    """The link whose ring all-reduce over two ranks (``2 latency + bytes / bandwidth``) fits the
    measured ones best: least squares of the relative error through the medians (each size counts
    alike, the small ones a tensor-parallel rank sends as much as the large ones data parallelism
    sends), the latency at least 0."""
    import numpy as np
    x = np.array(sorted(all_reduce), float)
    y = np.array([all_reduce[int(s)] for s in x])
    slope, intercept = np.polyfit(x, y, 1, w=1 / y)
    return max(float(intercept), 0.0) / 2, 1.0 / max(float(slope), 1e-15)


def _median(records: Sequence[dict], key: str) -> dict[int, float]:
    """Per message size, the median over both ranks' runs."""
    return {int(s): statistics.median(v for r in records for v in r[key][s]) for s in records[0][key]}


def _mean(records: Sequence[dict], key: str) -> dict[int, float]:
    """Per message size, the mean over both ranks' runs: what the all-reduces are priced at. A
    tensor-parallel step pays the sum of its hundreds of collectives, so the mean of one is what it
    pays per collective; on this machine gloo's bursts run anywhere from 0.1 to 5 ms per all-reduce
    (the process waking on its core), a skewed spread whose median sits under its mean (priced at
    the median, the TP 2 step came out 3-11% short, in six runs)."""
    return {int(s): statistics.fmean(v for r in records for v in r[key][s]) for s in records[0][key]}


def _machine(records: Sequence[dict], blocks: Sequence[dict] | None = None) -> Machine:
    """The figures from both ranks' records (``blocks``: the block times from these instead; a
    tensor-parallel rank's from their ``tp_blocks`` where they have them)."""
    one_way = _median(records, "link")
    latency, bandwidth = _fit_link(one_way)
    all_reduce = _mean(records, "all_reduce")

    def per_block(key: str) -> tuple[tuple[float, ...], ...]:
        runs = [run for r in (blocks or records) for run in r.get(key, [])]      # each: per block (f, b, o)
        if not runs:
            return (), (), ()
        return tuple(tuple(statistics.median(run[i][k] for run in runs) for k in range(LAYERS)) for i in range(3))
    whole, tp = per_block("blocks"), per_block("tp_blocks")
    return Machine(forward=whole[0], backward=whole[1], optimizer=whole[2], latency_s=latency,
                   bytes_per_s=bandwidth, one_way=one_way, all_reduce=all_reduce,
                   flops_per_s=statistics.median(r["flops"] for r in records),
                   memory_bytes_per_s=statistics.median(r["memory"] for r in records),
                   own_cores=all(r["own_core"] for r in records), reduce_link=_fit_all_reduce(all_reduce),
                   tp_forward=tp[0], tp_backward=tp[1], tp_optimizer=tp[2])


# -- step 2: the target and the layers' compute ----------------------------------------------------------

def target_mapping(machine: Machine) -> dict:
    """A target file for this CPU: one "tile" of 8 GiB, the measured FLOP and copy rates and link.
    The link (``link_bytes_per_s``, what a pipeline's transfers are priced with: bytes over it) is
    the rate gloo achieves for a message of the size the stages send, the hidden state: its bytes
    over its one-way time, so that a crossing costs what one measured, latency included. The
    node's links (what the layout search prices collectives on: tensor parallelism's all-reduces,
    data parallelism's gradient all-reduce) are the latency and bandwidth that make the ring
    all-reduce's time fit gloo's measured all-reduces (``Machine.reduce_link``); and they take the
    compute's own core (``overlaps_compute: false``: each rank runs on one core, gloo's threads
    on it, so DDP's all-reduce cannot hide under the backward as NCCL's does on a GPU)."""
    lat, bw = float(f"{machine.reduce_link[0]:.3g}"), round(machine.reduce_link[1])
    return {"name": "cpu-gloo", "kind": "cpu",
            "description": "this CPU, one thread per process, gloo between processes (measured)",
            "tiles": 1, "bytes_per_tile": 8 * 2**30, "flops_per_s": round(machine.flops_per_s),
            "memory_bytes_per_s": round(machine.memory_bytes_per_s),
            "link_bytes_per_s": round(HIDDEN_BYTES / machine.one_way[HIDDEN_BYTES]),
            "node": {"gpus_per_node": 2, "intra_bytes_per_s": bw, "intra_latency_s": lat,
                     "inter_bytes_per_s": bw, "inter_latency_s": lat, "overlaps_compute": False}}


def layer_compute(machine: Machine) -> dict[str, dict[str, float]]:
    """``--layer-compute``: each layer (named as the capture names them: its block's index) its
    forward, backward and optimizer step seconds measured apart (one micro-batch's forward and
    backward, the step's optimizer), each as FLOPs at the target's rate (``target_mapping``), given by
    phase (``{forward, backward, optimizer}``), so that each phase of the layer takes its own figure."""
    return _layer_compute(machine.forward, machine.backward, machine.optimizer, machine.flops_per_s)


def tp_layer_compute(machine: Machine) -> dict[str, dict[str, float]]:
    """``layer_compute`` of one tensor-parallel rank: its blocks' seconds (``Machine.tp_forward``...:
    the sharded block's compute, DTensor's dispatch included, its collectives not: the layout search
    prices those on the node's links)."""
    return _layer_compute(machine.tp_forward, machine.tp_backward, machine.tp_optimizer, machine.flops_per_s)


def _layer_compute(forward, backward, optimizer, flops_per_s: float) -> dict[str, dict[str, float]]:
    rate = round(flops_per_s)
    return {str(k): {"forward": f * rate, "backward": b * rate, "optimizer": o * rate}
            for k, (f, b, o) in enumerate(zip(forward, backward, optimizer))}


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
    """One export's pipeline on this rank, as its comments say, with the optimizer (learning rate 0)."""
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
    return (ns, built, schedule, tied, _optimizer(params), x if first else None, y if last else None,
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
    """One training step of a built export (``train_step``, tied gradients, the optimizer, ``zero_grad``): its
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


def _own_core(rank: int) -> int | None:
    """This rank on a core of its own and ahead of the machine's other work, where the operating
    system allows it: the core, or None where it could not. The ranks of a pipeline are meant to run side by side,
    each on its own device; on a machine shared with other jobs, Linux's autogroups give every
    session an equal share of the cores (``nice`` counts only inside one), so two ranks of one
    session would share one session's share and a rank that waits makes the other faster, which
    no model of devices sees. So each rank starts a session of its own, pinned to a core, with the
    session's priority raised (root, or CAP_SYS_NICE) for the few seconds it runs."""
    import os
    try:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            return None
        os.sched_setaffinity(0, {cores[rank]})
        os.setsid()
        Path("/proc/self/autogroup").write_text("-15")
        return cores[rank]
    except (OSError, AttributeError):      # not allowed here: the timings carry the machine's load
        return None


#: what ``_Filler`` runs: the blocks' forward, backward and optimizer step, over and over, on one core at the
#: lowest priority Linux has (``SCHED_IDLE``, in a session of its own, itself of the lowest priority: an idle
#: task in the rank's session would take the session's raised share from every other process of the machine,
#: the test's own among them), once it has started at its rank's priority
_FILLER = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
sys.path[:0] = sys.argv[2:]
import torch
torch.set_num_threads(1)
import steptime_harness
blocks = steptime_harness._Blocks()
blocks.once()
# made at the rank's priority (on a loaded machine an idle task would never start); from here on idle
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
os.setsid()
with open("/proc/self/autogroup", "w") as group:
    group.write("19")
print("ready", flush=True)
parent = os.getppid()
while os.getppid() == parent:
    blocks.once()
"""


class _Filler:
    """The work a device does not do while its rank waits, done on the rank's core: a process that runs
    the model's blocks at ``SCHED_IDLE`` priority pinned to that core (its rank takes the core back the
    moment it wakes: a task of normal priority preempts an idle one). Two devices compute at their own
    speed whatever the other does; two cores of one processor need not (hyper-threads of one physical
    core, a shared cache or memory bus, a host that boosts a lone busy core): a block timed while both
    ranks compute would then run faster in a pipeline whenever the other rank waits, most on the heavy
    rank of an unbalanced split. With the filler, a core is busy whether its rank computes or waits, so
    that each rank computes as fast in the pipeline's steps as its blocks ran when timed side by side.
    Started where the rank has its core (``_own_core``); a context manager, which stops it."""

    def __init__(self, core: int | None, timeout_s: float = 120.0) -> None:
        self.process = None
        if core is not None:
            import select
            import subprocess
            self.process = subprocess.Popen([sys.executable, "-c", _FILLER, str(core), str(ROOT / "tests"), str(ROOT)],
                                            stdout=subprocess.PIPE, text=True)
            ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
            if not ready or self.process.stdout.readline().strip() != "ready":
                # not started in time (or failed): the rank runs without it, as before the filler
                self.__exit__()

    def __enter__(self) -> _Filler:
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def _worker(rank: int, workdir: str, repeats: int, rounds: int, timeout_s: float) -> None:
    """One rank, on its own core with a ``_Filler`` where it has one: the machine (link, blocks: step 1),
    then, once the parent has written the exports (``cases.json``), rounds of: for every export, every
    block timed once, then one step of the export (step 4)."""
    import torch
    torch.set_num_threads(1)
    core = _own_core(rank)
    with _Filler(core):
        _worker_body(rank, workdir, core is not None, repeats, rounds, timeout_s)


def _worker_body(rank: int, workdir: str, own: bool, repeats: int, rounds: int, timeout_s: float) -> None:
    import torch.distributed as dist
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
        for round_ in range(rounds + 1):       # the first: warm-up (shapes, receive buffers, the momentum)
            for i, run in enumerate(built):    # each step just after a timing of every block: both see one load
                dist.barrier()
                times = blocks.once()
                dist.barrier()
                seconds, busy = _step(run)
                if round_:
                    steps[i].append(seconds)
                    working[i].append(busy)
                    interleaved.append(list(zip(*times)))
        Path(workdir, f"steps{rank}.json").write_text(json.dumps({"steps": steps, "busy": working,
                                                                     "blocks": interleaved}))
    finally:
        dist.destroy_process_group()


#: glibc's malloc told to keep what a process frees (``mallopt``'s settings, read from the
#: environment when a process starts): never trim the heap's top, and serve every allocation below
#: 1 GiB from the heap rather than a fresh ``mmap``
KEEP_FREED_MEMORY = {"MALLOC_TRIM_THRESHOLD_": str(2**40), "MALLOC_MMAP_THRESHOLD_": str(2**30)}


def _spawn(worker, args: tuple):
    """The two ranks, spawned with ``KEEP_FREED_MEMORY`` in their environment. A device's caching
    allocator keeps the blocks a step frees for the next step (the reserved pool the plan prices);
    glibc by default hands large frees back to the operating system and takes them fresh, page by
    zeroed page, next time. A schedule with many micro-batches in flight (GPipe) then pays page faults
    each step that no device pays: measured on this machine, GPipe's steps 1-6% slower than
    1F1B's on the same split (the fuller rank's busy time 6-18 ms higher) by default, and within
    1.5% of them with the memory kept (docs/benchmarks.md)."""
    import os

    import torch.multiprocessing as mp
    saved = {k: os.environ.get(k) for k in KEEP_FREED_MEMORY}
    os.environ.update(KEEP_FREED_MEMORY)
    try:
        return mp.spawn(worker, args=args, nprocs=2, join=False)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
    #: the step the same blocks predict given as one total per layer (the model sharing each out over
    #: its phases by the roofline), not by phase, seconds
    predicted_from_totals: float = 0.0

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
    profile = folder / "llama.stagesplit"
    if not profile.exists():
        _cli("capture", capture_spec(), "--optimizer", OPTIMIZER, "-o", profile)
    with tempfile.TemporaryDirectory(prefix="steptime-") as tmp:
        context = _spawn(_worker, (tmp, repeats, rounds, timeout_s))
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
    totals = write_yaml(folder / "layers-totals.yaml", {k: sum(v.values()) for k, v in layer_compute(machine).items()})
    rows = []
    for i, (case, plan) in enumerate(zip(cases, plans)):
        at = plan["stages"][1]["first_layer"]
        again = json.loads(solve(folder, profile, target, layers, case, at, "-with-steps").read_text())
        total = json.loads(solve(folder, profile, target, totals, case, at, "-totals").read_text())
        s = again["schedule"]
        steps = [max(a, b) for a, b in zip(measured[0]["steps"][i], measured[1]["steps"][i])]
        busy = tuple(statistics.median(measured[r]["busy"][i]) for r in range(2))
        rows.append(Row(case, again["split"], float(s["step_time"]), float(plan["schedule"]["step_time"]),
                        tuple(steps), float(sum(s["transfer_times"])), tuple(s["optimizer_times"]),
                        tuple(float(r["busy"]) for r in s["ranks"]), busy, float(total["schedule"]["step_time"])))
    return machine, rows


# -- the layouts: TP 2, PP 2 and DP 2 of the same batch on the same two processes -------------------------

#: (tensor, pipeline, data) parallel degrees of two processes
LAYOUTS = ((2, 1, 1), (1, 2, 1), (1, 1, 2))


def layout_name(tp: int, pp: int, dp: int) -> str:
    return f"TP {tp} x PP {pp} x DP {dp}"


class _TensorParallelRun:
    """One rank of a real tensor-parallel run of the whole model: the model's declared plan applied on
    ``mesh`` (gloo) by torch's ``parallelize_module``, as the capture at ``--tp 2`` applied it; a step
    is every micro-batch's forward and backward (the gradients accumulated), the optimizer's step and
    ``zero_grad``. Both ranks take the whole batch (tensor parallelism shares the layers, not the data)."""

    def __init__(self, mesh, micro_batches: int) -> None:
        import torch
        torch.manual_seed(0)
        self.net = model()
        _tensor_parallel(self.net, mesh)
        self.optimizer = _optimizer(self.net.parameters())
        self.ids = batch(micro_batches)[0].chunk(micro_batches)

    def step(self) -> float:
        start = time.perf_counter()
        for ids in self.ids:
            loss = self.net(input_ids=ids, labels=ids).loss
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        seconds = time.perf_counter() - start
        self.loss = float(loss.detach())
        return seconds


class _DataParallelRun:
    """One rank of a real data-parallel run (torch's ``DistributedDataParallel`` over gloo, its default
    buckets): this rank's half of the batch, ``micro_batches`` of them, the gradients accumulated
    under ``no_sync`` until the last micro-batch, whose backward all-reduces them; the optimizer, ``zero_grad``."""

    def __init__(self, rank: int, micro_batches: int) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel
        torch.manual_seed(0)
        self.net = DistributedDataParallel(model())
        self.optimizer = _optimizer(self.net.parameters())
        mine = batch(2 * micro_batches)[0].chunk(2)[rank]
        self.ids = mine.chunk(micro_batches)

    def step(self) -> float:
        import contextlib
        start = time.perf_counter()
        for i, ids in enumerate(self.ids):
            with self.net.no_sync() if i < len(self.ids) - 1 else contextlib.nullcontext():
                self.net(input_ids=ids, labels=ids).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return time.perf_counter() - start


def _fake_mesh():
    """A device mesh of both ranks over torch's fake process group (collectives that move nothing),
    beside the gloo one: a tensor-parallel rank's blocks timed without their communication."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
    from torch.distributed.device_mesh import DeviceMesh
    # named apart from the gloo mesh (``_gloo_mesh``): DTensor takes meshes of the same ranks and names for
    # one, so that the first used would run the other's collectives
    return DeviceMesh.from_group(dist.new_group(ranks=[0, 1], backend="fake"), "cpu", mesh_dim_names=("fake",))


def _gloo_mesh():
    """The device mesh of both ranks over the default (gloo) group, for the real tensor-parallel run."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("tp",))


def _layout_worker(rank: int, workdir: str, micro_batches: int, repeats: int, rounds: int, timeout_s: float) -> None:
    """One rank: the machine (link, all-reduce, the whole model's blocks and a tensor-parallel rank's),
    then, once the parent has written the pipeline's export, rounds of: both block sets timed once,
    then one step of each layout (``LAYOUTS``: the real TP run, the export's pipeline, DDP)."""
    import torch
    torch.set_num_threads(1)
    core = _own_core(rank)
    with _Filler(core):
        _layout_worker_body(rank, workdir, core is not None, micro_batches, repeats, rounds, timeout_s)


def _layout_worker_body(rank: int, workdir: str, own: bool, micro_batches: int, repeats: int, rounds: int,
                        timeout_s: float) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=2,
                            timeout=timedelta(seconds=timeout_s))
    try:
        tensor_parallel = _TensorParallelRun(_gloo_mesh(), micro_batches)
        link = _ping_pong(rank, LINK_SIZES, repeats)
        reduce = _all_reduce(LINK_SIZES, 2 * repeats)       # what the node's links are fitted to: more runs
        blocks, tp_blocks = _Blocks(), _Blocks(_fake_mesh())
        dist.barrier()
        runs = [(blocks.once(), tp_blocks.once()) for _ in range(repeats + 2)][2:]
        record = {"link": link, "all_reduce": reduce, "blocks": [list(zip(*r[0])) for r in runs],
                  "tp_blocks": [list(zip(*r[1])) for r in runs], "flops": _flop_rate(), "memory": _memory_rate(),
                  "own_core": own}
        Path(workdir, f"machine{rank}.json").write_text(json.dumps(record))
        cases = _wait_for(Path(workdir, "cases.json"), timeout_s)
        pipeline = _build(0, cases["code"], micro_batches)
        steps_of = {(2, 1, 1): tensor_parallel.step,
                    (1, 2, 1): lambda: _step(pipeline)[0],
                    (1, 1, 2): _DataParallelRun(rank, micro_batches // 2).step}
        steps: list[list[float]] = [[] for _ in LAYOUTS]
        interleaved, tp_interleaved = [], []
        reduce_interleaved: dict[str, list[float]] = {}
        for round_ in range(rounds + 1):       # the first: warm-up (shapes, buffers, the momentum)
            dist.barrier()
            times = blocks.once()
            dist.barrier()
            tp_times = tp_blocks.once()
            reduced = _all_reduce(LINK_SIZES, 2)       # the node's links too: timed with the steps
            for i, layout in enumerate(LAYOUTS):
                dist.barrier()
                seconds = steps_of[layout]()
                if round_:
                    steps[i].append(seconds)
            if round_:
                interleaved.append(list(zip(*times)))
                tp_interleaved.append(list(zip(*tp_times)))
                for size, runs in reduced.items():
                    reduce_interleaved.setdefault(str(size), []).extend(runs)
        Path(workdir, f"steps{rank}.json").write_text(json.dumps({"steps": steps, "blocks": interleaved,
                                                                     "tp_blocks": tp_interleaved,
                                                                     "all_reduce": reduce_interleaved,
                                                                     "tp_loss": tensor_parallel.loss}))
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class LayoutRow:
    tp: int
    pp: int
    dp: int
    split: str                    #: the pipeline's split, as the plan prints it
    predicted: float              #: the layout search's step, seconds
    pipeline: float               #: of which the pipeline's step (compute, bubble, transfers), seconds
    tp_comm: float                #: the tensor-parallel collectives, seconds
    dp_comm: float                #: the exposed data-parallel communication, seconds
    measured: tuple[float, ...]   #: the measured steps, seconds (one per round: the slower rank's)
    #: TP 2: each rank's loss of the last micro-batch (the run's collectives ran: the ranks agree, and
    #: with the unparallelised model: ``reference_loss``)
    losses: tuple[float, ...] = ()

    @property
    def name(self) -> str:
        return layout_name(self.tp, self.pp, self.dp)

    @property
    def median(self) -> float:
        return statistics.median(self.measured)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured, the measured step's median."""
        return (self.predicted - self.median) / self.median


def layout_step(profile: Path, target: Path, layers: Path, tp: int, pp: int, dp: int, micro_batches: int,
                split_at: int | None = None):
    """The layout search's step for one layout (plan/layouts.py, the calls ``search`` makes for a
    combination: ``solve_request``, the engine's solve of the schedule's split, ``step_of``; its
    communication priced on the target's node), with each layer's compute measured (``layers``: the ``--layer-compute`` mapping,
    given to the solve as ``solve --layer-compute`` gives it) and the pipeline's split pinned to start
    its second stage at ``split_at`` where given. ``profile``: one rank's at tensor-parallel degree
    ``tp``; ``micro_batches``: the global batch's, which each data-parallel rank divides. Returns
    (step, pipeline, TP seconds, DP seconds, the plan)."""
    from dataclasses import replace

    from stagesplit import api
    from stagesplit.common.deadline import Deadline
    from stagesplit.common.events import Events
    from stagesplit.io.targets import load_target
    from stagesplit.io.topology import node_of
    from stagesplit.model.datasharding import DataLayout, parameter_bytes_by_layer
    from stagesplit.plan import engine, layouts as search
    lay = search.Layout(tp, pp, dp, 0, micro_batches // dp)
    req = search.LayoutRequest(gpus=tp * pp * dp, global_batch=BATCH * micro_batches, target=load_target(str(target)),
                               node=node_of(str(target)), micro_batch_size=BATCH, sequence_length=SEQUENCE, tp=tp,
                               pp=pp, dp=dp, zero=0)
    whole = api.analyze(str(profile))
    analysis = api.analyze(str(profile), layout=DataLayout(dp, 0)) if dp > 1 else whole
    request = replace(search.solve_request(lay, req, 60.0), layer_compute=tuple(json.loads(layers.read_text()).items()),
                      layer_compute_source=str(layers), pin_splits=() if split_at is None else (str(split_at),))
    plan = engine.solve(analysis, request, Deadline.after(60.0), Events())
    params = parameter_bytes_by_layer(whole.profile, whole.layers)[0]
    return (*search.step_of(lay, plan, analysis, req, params), plan)


def layout_prediction(profiles: dict[int, Path], target: Path, layers: dict[int, Path], tp: int, pp: int, dp: int,
                      micro_batches: int) -> dict:
    """The layout search's answer for one layout, asked as a user asks it: ``stagesplit layouts`` with
    every degree fixed (ZeRO 0: DDP), the global batch of ``micro_batches`` micro-batches of ``BATCH``
    sequences, the measured per-layer compute of ``layers[1]`` (``--layer-compute``) and, for TP 2,
    the tensor-parallel rank's profile and its own measured blocks (``--tp-profile 2=``,
    ``--tp-layer-compute 2=``). The ``--format json`` document: ``best`` (step, pipeline, TP and DP
    seconds) and the best plan's ``split`` and ``stages``."""
    degree = ["--tp-profile", f"2={profiles[2]}", "--tp-layer-compute", f"2={layers[2]}"] if tp > 1 else []
    out = _cli("layouts", profiles[1], *degree, "--gpus", tp * pp * dp, "--tp", tp, "--pp", pp, "--dp", dp,
               "--zero", 0, "--global-batch", BATCH * micro_batches, "--micro-batch-size", BATCH, "--seq-len",
               SEQUENCE, "--schedule", "1f1b", "--target", target, "--layer-compute", layers[1], "--format", "json")
    return json.loads(out)


def compare_layouts(folder: Path, micro_batches: int = 4, rounds: int = 5, repeats: int = 4,
                    timeout_s: float = 300.0) -> tuple[Machine, list[LayoutRow]]:
    """Each layout of ``LAYOUTS`` for a global batch of ``micro_batches`` micro-batches, predicted by the
    layout search (``layout_prediction``) and run for real on two gloo processes, the layouts interleaved round by
    round. The pipeline runs the plan of ``stagesplit solve --layer-compute --communication`` (1F1B), exported
    with ``--to torch-pipelining``, as ``compare`` runs them. Each prediction is made from the blocks timed
    in the same rounds as the steps (a tensor-parallel rank's blocks for TP 2, from ``capture --tp 2``'s
    profile), the node's links from gloo's all-reduces; nothing measured of the steps goes into it."""
    profiles = {1: folder / "llama.stagesplit", 2: folder / "llama-tp2.stagesplit"}
    for tp, profile in profiles.items():
        if not profile.exists():
            _cli("capture", capture_spec(), "--optimizer", OPTIMIZER, *(["--tp", tp] if tp > 1 else []), "-o", profile)
    case = Case("1f1b", micro_batches)
    with tempfile.TemporaryDirectory(prefix="steptime-layouts-") as tmp:
        context = _spawn(_layout_worker, (tmp, micro_batches, repeats, rounds, timeout_s))
        try:
            records = _await_files(context, [Path(tmp, f"machine{r}.json") for r in range(2)], timeout_s)
            before = _machine(records)
            target = write_yaml(folder / "cpu-gloo.yaml", target_mapping(before))
            layers = write_yaml(folder / "layers-before.yaml", layer_compute(before))
            plan_file = solve(folder, profiles[1], target, layers, case)
            split_at = json.loads(plan_file.read_text())["stages"][1]["first_layer"]
            code = folder / "pipeline.py"
            _cli("export", plan_file, "--to", "torch-pipelining", "-o", code)
            cases_file = Path(tmp, "cases.json.part")
            cases_file.write_text(json.dumps({"code": code.read_text()}))
            cases_file.rename(Path(tmp, "cases.json"))
            while not context.join():
                pass
            measured = [json.loads(Path(tmp, f"steps{r}.json").read_text()) for r in range(2)]
        finally:                       # a failure here: the workers wait for nothing
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
    records = [r | {"all_reduce": {size: runs + m["all_reduce"][size] for size, runs in r["all_reduce"].items()}}
               for r, m in zip(records, measured)]      # the all-reduces of the rounds join the first ones
    machine = _machine(records, measured)
    # the predictions' links and rates from every measurement, the rounds' included (the plan that ran was
    # solved before the rounds, from the first ones)
    target = write_yaml(folder / "cpu-gloo.yaml", target_mapping(machine))
    mappings = {1: write_yaml(folder / "layers.yaml", layer_compute(machine)),
                2: write_yaml(folder / "layers-tp2.yaml", tp_layer_compute(machine))}
    rows = []
    for i, (tp, pp, dp) in enumerate(LAYOUTS):
        doc = layout_prediction(profiles, target, mappings, tp, pp, dp, micro_batches)
        best = doc["best"]
        step, pipeline, tp_s, dp_s, split = (best["step_s"], best["pipeline_s"], best["tp_comm_s"],
                                             best["dp_comm_s"], doc["split"])
        if pp > 1 and doc["stages"][1][0] != split_at:      # not the split that ran: that one, pinned
            step, pipeline, tp_s, dp_s, plan = layout_step(profiles[tp], target, mappings[tp], tp, pp, dp,
                                                           micro_batches, split_at)
            split = plan.split_text
        steps = tuple(max(a, b) for a, b in zip(measured[0]["steps"][i], measured[1]["steps"][i]))
        losses = tuple(float(m["tp_loss"]) for m in measured) if tp > 1 else ()
        rows.append(LayoutRow(tp, pp, dp, split, step, pipeline, tp_s, dp_s, steps, losses))
    return machine, rows


def reference_loss(micro_batches: int) -> float:
    """The unparallelised model's loss of the last micro-batch (the weights as every run starts them;
    the optimizer's learning rate 0 keeps them), what the tensor-parallel run's ranks each compute."""
    import torch
    torch.manual_seed(0)
    ids = batch(micro_batches)[0].chunk(micro_batches)[-1]
    with torch.no_grad():
        return float(model()(input_ids=ids, labels=ids).loss)


if __name__ == "__main__" and sys.argv[1:] == ["layouts"]:    # python tests/steptime_harness.py layouts
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as folder:
        found, layout_rows = compare_layouts(Path(folder))
    print(found.reduce_link, found.all_reduce)
    for layout_row in layout_rows:
        print(layout_row.name, layout_row.split, f"{layout_row.predicted * 1e3:.1f} ms (pipeline "
              f"{layout_row.pipeline * 1e3:.1f}, TP {layout_row.tp_comm * 1e3:.1f}, DP {layout_row.dp_comm * 1e3:.1f})",
              f"{layout_row.median * 1e3:.1f} ms", f"{layout_row.error:+.1%}", layout_row.losses)
elif __name__ == "__main__":      # a quick look: python tests/steptime_harness.py
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as folder:
        found, table = compare(Path(folder), [Case(s, 4, k) for s in ("1f1b", "gpipe") for k in (None, 2, 1, 6)])
    print(found)
    for row in table:
        print(row.case, row.split, f"{row.predicted * 1e3:.1f} ms (before {row.predicted_before * 1e3:.1f})",
              f"{row.median * 1e3:.1f} ms", f"{row.error:+.1%}",
              "busy", [f"{b * 1e3:.1f}" for b in row.busy], [f"{b * 1e3:.1f}" for b in row.busy_measured])
