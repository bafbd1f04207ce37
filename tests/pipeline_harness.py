"""A real pipeline for tests: a model cut into chunks runs across P processes (gloo on CPU, one
process per rank, ``torch.multiprocessing``) under torch's own schedule class, and each rank
reports what torch actually did.

Per rank: the compute actions torch executed, in order (recorded by wrapping the PipelineStage
methods the schedule calls, in torch's notation: ``3F1`` forward of stage 3 for micro-batch 1,
``3I1`` input-gradient backward, ``3W1`` weight-gradient backward, ``3B1`` full backward); the
live tensor bytes before, at the peak of and after each of those actions, and the peak of the
whole step (and of the optimizer step, if one is asked for), counted by torch's MemTracker
(``torch.distributed._tools.mem_tracker``, without its module hooks: see ``_peak_tracker``);
the per-micro-batch losses (on the rank of the last chunk) and the gradient of every parameter
of the rank's chunks. ``reference`` gives the loss and gradients of the same model run whole,
unpipelined, for comparison.

The measured step is a steady-state one: an untracked warm-up step (the stages infer shapes and
allocate their receive buffers, the optimizer makes its state), then two tracked steps, of which
the second is reported. The optimizer runs with learning rate 0, so its state and temporaries
are real while the weights stay put, and the gradients stay comparable with ``reference``.

Nothing here comes from stagesplit except the schedule kind's name and torch class: the chunk
placement is torch's own (``generate_rank_to_stage_mapping``) and the executed order is what the
runtime calls. A case may instead bring its own stages and schedule (``stages_from``: an
export's ``build_pipeline``), measured the same way.

Usage::

    case = PipelineCase("zbv", micro_batches=4, chunks_per_rank=2,
                        build=functools.partial(mlp_chunks, 4), make_batch=functools.partial(regression_batch, 8))
    per_rank = run_pipeline(case, devices=2)

``run_pipelines`` runs several cases in one set of processes (process start-up dominates here).
The callables in a case must be picklable (module-level functions or ``functools.partial``).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np

from vision import torchvision_model_code

# a spawned worker has the test process's path (with torchvision's folder) but not its modules
torchvision_model_code()

__all__ = ["ExportedCase", "PipelineCase", "RankResult", "mlp_chunks", "mse", "reference", "regression_batch", "run_pipeline",
           "run_exported", "run_pipelines"]


def mse(output, target):
    """Mean squared error (module level, so that a case can be pickled)."""
    import torch
    return torch.nn.functional.mse_loss(output, target)


def mlp_chunks(chunks: int, width: int = 16, layers_per_chunk: int = 2, widths: Sequence[int] | None = None,
               dtype: str = "float64") -> list:
    """``chunks`` chunks of ``layers_per_chunk`` (Linear, Tanh) pairs; ``widths`` (length
    chunks + 1) gives each chunk its input and output width, else all are ``width``."""
    import torch
    widths = list(widths) if widths is not None else [width] * (chunks + 1)
    out = []
    for c in range(chunks):
        layers: list[torch.nn.Module] = []
        for i in range(layers_per_chunk):
            n_in = widths[c] if i == 0 else widths[c + 1]
            layers += [torch.nn.Linear(n_in, widths[c + 1]), torch.nn.Tanh()]
        out.append(torch.nn.Sequential(*layers).to(getattr(torch, dtype)))
    return out


def regression_batch(batch: int, width: int = 16, out_width: int | None = None, dtype: str = "float64",
                     seed: int = 1234) -> tuple:
    """A fixed random (input, target) pair."""
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, width, generator=g, dtype=getattr(torch, dtype))
    y = torch.randn(batch, out_width or width, generator=g, dtype=getattr(torch, dtype))
    return x, y


@dataclass(frozen=True)
class PipelineCase:
    """One pipelined training step to run: ``build()`` (called after ``torch.manual_seed(seed)``
    on every rank) returns the ``chunks_per_rank x P`` chunks in model order; ``make_batch()``
    the whole batch (input, target); ``optimizer`` "adam", "sgd" or None (no optimizer step).
    ``grads_set_to_none`` is what ``zero_grad`` does between steps (torch's default: the
    gradients are made anew in each step); ``return_outputs`` is ``step``'s argument (torch's
    default: the last stage keeps every micro-batch's output to merge them)."""

    kind: str
    micro_batches: int
    chunks_per_rank: int
    build: Callable[[], list]
    make_batch: Callable[[], tuple]
    loss: Callable = mse
    optimizer: str | None = None
    grads_set_to_none: bool = True
    return_outputs: bool = True
    seed: int = 0
    #: instead of ``build`` and torch's own placement: ``stages_from(rank, devices, loss)`` returns
    #: this rank's ``(stages, schedule)`` (an export's ``build_pipeline``, say); ``build`` unused
    stages_from: Callable | None = None


@dataclass(frozen=True)
class RankResult:
    """What one rank did and measured in one case."""

    rank: int
    stages: tuple[int, ...]           #: the chunks (torch's stage indices) this rank held
    executed: tuple[str, ...]         #: compute actions in the order torch ran them, torch's notation
    peak_bytes: int                   #: MemTracker's peak total over the step (and optimizer step)
    trace: np.ndarray                 #: per executed action: live bytes before it, its peak, after it
    optimizer_trace: tuple[int, int, int]   #: the same for the optimizer step (all equal without one)
    losses: tuple[float, ...]         #: per micro-batch, on the rank of the last chunk; else empty
    grads: dict[str, np.ndarray] = field(repr=False)   #: "chunk.param" -> gradient after the step
    seconds: float = 0.0              #: wall time of the measured step
    #: ``run_exported``: each parameter's name in the model -> its name in the rank's stage module
    stage_names: dict[str, str] = field(default_factory=dict, repr=False)


def _placement(kind: str, devices: int, chunks: int) -> dict[int, list[int]]:
    from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping
    style = "v" if kind in ("zbv", "dualpipev") else "loop"
    return generate_rank_to_stage_mapping(devices, chunks, style=style)


def _record(stage, log: list[str], trace: list[list[int]], tracker) -> None:
    """Wrap the three compute methods the schedules call: log each call and measure it. An
    action's entry is [live bytes before it, peak, live bytes after]; the peak and the after
    are taken again when the next action starts (``_close``), so that what the schedule does
    between two calls belongs to the earlier one: the last chunk's loss after its forward, the
    sends a forward or backward starts. The last action keeps what it had when it returned
    (what follows is the step's end, which frees what it kept)."""
    forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def measured(name: str, call):
        _close(trace, tracker)
        log.append(name)
        entry = [tracker.restart_peak(), -1, -1]
        trace.append(entry)
        result = call()
        entry[1], entry[2] = tracker.peak_since_restart(), tracker.live_bytes()
        return result

    def forward_one_chunk(mb, *args, **kwargs):
        return measured(f"{stage.stage_index}F{mb}", lambda: forward(mb, *args, **kwargs))

    def backward_one_chunk(mb, *args, full_backward: bool = True, **kwargs):
        return measured(f"{stage.stage_index}{'B' if full_backward else 'I'}{mb}",
                        lambda: backward(mb, *args, full_backward=full_backward, **kwargs))

    def backward_weight_one_chunk(mb, *args, **kwargs):
        return measured(f"{stage.stage_index}W{mb}", lambda: weight(mb, *args, **kwargs))

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _close(trace: list[list[int]], tracker) -> None:
    """Finish the last entry of ``trace`` with the peak since it started and the live bytes now."""
    if trace:
        trace[-1][1] = tracker.peak_since_restart()
        trace[-1][2] = tracker.live_bytes()


def _receive_buffers(stages) -> list:
    """The tensors the stages keep to receive activations and gradients into (allocated at their
    first step, outside the tracker, yet live during every step)."""
    import torch
    out = []
    for stage in stages:
        for infos in list(stage.args_recv_info.values()) + list(getattr(stage, "grad_recv_info", {}).values()):
            for info in infos if isinstance(infos, tuple) else ():
                buffer = getattr(info, "buffer", None)
                if isinstance(buffer, torch.Tensor):
                    out.append(buffer)
    return out


def _peak_tracker():
    """torch's MemTracker without its module tracking. Its ModTracker puts multi-grad hooks on
    every module's inputs and outputs, which autograd refuses inside the ``autograd.grad`` calls
    of the zero-bubble schedules' split backward, and it refuses a module called twice in one
    tracked region (it takes that for a second iteration) where a pipeline calls each chunk
    once per micro-batch. The count of live tensor bytes, and its peak, do not need it: they
    come from the dispatch mode (every tensor an operation returns), the storages' deletion
    callbacks, the optimizer hooks and ``track_external``. Without module tracking every
    tensor made in the step counts as an activation (none as a backward temporary)."""
    from torch._guards import active_fake_mode
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
    from torch.utils._python_dispatch import TorchDispatchMode

    class PeakTracker(MemTracker):
        """Also gives the live bytes now, and the peak since the last ``restart_peak``."""

        overall = 0

        def live_bytes(self) -> int:
            return sum(snap[_TOTAL_KEY] for snap in self._curr_mem_snap.values())

        def peak_since_restart(self) -> int:
            return sum(self._peak_mem.values())

        def restart_peak(self) -> int:
            """Fold the running peak into ``overall`` and restart it from the live bytes now."""
            self.overall = max(self.overall, self.peak_since_restart())
            self._peak_mem = {dev: snap[_TOTAL_KEY] for dev, snap in self._curr_mem_snap.items()}
            return self.live_bytes()

        def __enter__(self):
            self._fake_mode_on_entry = active_fake_mode()
            self._register_global_optimizer_hook()
            self._track_resize()
            self._peak_mem_snap = self.get_tracker_snapshot()
            self._peak_mem = {dev: snap[_TOTAL_KEY] for dev, snap in self._peak_mem_snap.items()}
            TorchDispatchMode.__enter__(self)
            return self

        def __exit__(self, *args):
            self._deregister_param_and_optimizer_hooks()
            self._restore_resize()
            TorchDispatchMode.__exit__(self, *args)

    return PeakTracker()


def _tracked(stages, held: list) -> tuple[list[str], list[list[int]], object]:
    """A peak tracker over the stages' actions (each logged and measured by ``_record``), counting
    ``held`` (the modules and optimizer of this rank) and the stages' receive buffers as live."""
    log: list[str] = []
    trace: list[list[int]] = []
    tracker = _peak_tracker()
    for stage in stages:
        _record(stage, log, trace, tracker)
    tracker.track_external(*held, *_receive_buffers(stages))
    return log, trace, tracker


def _run_case(rank: int, devices: int, case: PipelineCase, index: int, workdir: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, schedules

    from stagesplit.solver.schedule_kinds import traits

    torch.manual_seed(case.seed)
    if case.stages_from is not None:
        stages, schedule = case.stages_from(rank, devices, case.loss)
        C = stages[0].num_stages
        mine = [s.stage_index for s in stages]
        chunks = {s.stage_index: s.submod for s in stages}
    else:
        built = case.build()
        C = len(built)
        if C != case.chunks_per_rank * devices:
            raise ValueError(f"{C} chunks built for {case.chunks_per_rank} x {devices}")
        chunks = dict(enumerate(built))
        mine = _placement(case.kind, devices, C)[rank]
        stages = [PipelineStage(chunks[c], c, C, torch.device("cpu")) for c in mine]
        t = traits(case.kind)
        cls = getattr(schedules, t.torch_class)
        schedule = cls(stages if t.multi_stage else stages[0], n_microbatches=case.micro_batches, loss_fn=case.loss)
    x, y = case.make_batch()
    args = (x,) if 0 in mine else ()
    last = C - 1 in mine
    params = [p for c in mine for p in chunks[c].parameters()]
    # lr 0: the optimizer's state and temporaries are real, the weights never move, so the
    # measured step's gradients are the unpipelined model's
    optimizer = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, None: None}[case.optimizer]
    optimizer = optimizer(params, lr=0.0) if optimizer else None

    def step(losses: list | None) -> None:
        schedule.step(*args, target=y if last else None, losses=losses if last else None,
                      return_outputs=case.return_outputs)

    # warm-up step: the stages infer shapes and allocate their receive buffers, the optimizer
    # makes its state; the measured step is a steady-state one
    step([])
    if optimizer is not None:
        optimizer.step()
    for c in mine:
        chunks[c].zero_grad(set_to_none=case.grads_set_to_none)
    dist.barrier()
    log, trace, tracker = _tracked(stages, [chunks[c] for c in mine] + ([optimizer] if optimizer else []))
    with tracker:
        # two tracked steps, the second one reported: what the first leaves behind for the next
        # one (the runtime keeps some tensors until the next step replaces them) is counted
        for measured_step in (False, True):
            if measured_step:
                log.clear()
                trace.clear()
                tracker.restart_peak()
                tracker.overall = 0
            losses: list = []
            start = time.perf_counter()
            step(losses)
            # the loss tensors keep their graphs (so the last chunk's outputs) alive: keep numbers
            losses = [float(v.detach()) for v in losses]
            grads = {f"{c}.{name}": p.grad.detach().numpy().copy() for c in mine
                     for name, p in chunks[c].named_parameters() if p.grad is not None}
            before = tracker.restart_peak()
            if optimizer is not None:
                optimizer.step()
            optimizer_trace = (before, tracker.peak_since_restart(), tracker.live_bytes())
            if not measured_step:
                for c in mine:
                    chunks[c].zero_grad(set_to_none=case.grads_set_to_none)
                dist.barrier()
    seconds = time.perf_counter() - start
    total = max(tracker.overall, tracker.peak_since_restart())
    record = {"rank": rank, "stages": mine, "executed": log, "peak_bytes": total, "trace": trace,
              "optimizer_trace": optimizer_trace, "losses": losses, "seconds": seconds}
    base = workdir / f"case{index}-rank{rank}"
    (base.with_suffix(".json")).write_text(json.dumps(record))
    np.savez(base.with_suffix(".npz"), **grads)


def _worker(rank: int, devices: int, cases: list, workdir: str, timeout_s: float,
            run: Callable | None = None) -> None:
    """One rank: every case in turn (``run``: ``_run_case``, or ``_run_exported`` for an export's program)."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=devices,
                            timeout=timedelta(seconds=timeout_s))
    try:
        for index, case in enumerate(cases):
            (run or _run_case)(rank, devices, case, index, Path(workdir))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _load(base: Path) -> RankResult:
    record = json.loads(base.with_suffix(".json").read_text())
    with np.load(base.with_suffix(".npz"), allow_pickle=False) as z:
        grads = {k: z[k] for k in z.files}
    trace = np.array(record["trace"], np.int64).reshape(-1, 3)
    return RankResult(record["rank"], tuple(record["stages"]), tuple(record["executed"]), record["peak_bytes"],
                      trace, tuple(record["optimizer_trace"]), tuple(record["losses"]), grads, record["seconds"],
                      record.get("stage_names", {}))


def run_pipelines(cases: Sequence[PipelineCase], devices: int, timeout_s: float = 120.0) -> list[list[RankResult]]:
    """Run every case, one after the other, in one group of ``devices`` processes; per case, the
    ranks' results in rank order. A failure on any rank raises here (with that rank's traceback)."""
    import ranks
    with tempfile.TemporaryDirectory(prefix="pipeline-harness-") as tmp:
        ranks.start(_worker, (devices, list(cases), tmp, timeout_s), devices)
        return [[_load(Path(tmp) / f"case{i}-rank{r}") for r in range(devices)] for i in range(len(cases))]


def run_pipeline(case: PipelineCase, devices: int, timeout_s: float = 120.0) -> list[RankResult]:
    """Run one case on ``devices`` processes (see ``run_pipelines``)."""
    return run_pipelines([case], devices, timeout_s)[0]


def reference(case: PipelineCase) -> tuple[float, dict[str, np.ndarray]]:
    """The loss and the gradients ("chunk.param") of the same model run whole on the whole batch."""
    import torch
    torch.manual_seed(case.seed)
    chunks = case.build()
    x, y = case.make_batch()
    out = x
    for chunk in chunks:
        out = chunk(out)
    loss = case.loss(out, y)
    loss.backward()
    return float(loss.detach()), {f"{c}.{name}": p.grad.detach().numpy().copy() for c, chunk in enumerate(chunks)
                         for name, p in chunk.named_parameters()}



# -- an exported plan's own program -----------------------------------------------------------------------

@dataclass(frozen=True)
class ExportedCase:
    """The user's path: ``code`` (a torch-pipelining export's text) run as its comments say, on every
    rank: ``model()`` (called after ``torch.manual_seed(seed)``) builds the whole model,
    ``build_pipeline(model, one micro-batch, cpu, loss)``, then steps of ``train_step``,
    ``sum_tied_gradients``, Adam (learning rate 0, as above) and ``zero_grad`` as the export's
    ``GRADIENTS_SET_TO_NONE`` says. ``make_batch()`` gives the whole batch (inputs, targets)."""

    code: str
    model: Callable
    make_batch: Callable
    loss: Callable | None = None
    seed: int = 0


def _whole(tensor):
    """A tensor-parallel gradient (a DTensor) as the whole tensor (a collective over its group); others as they are."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _run_exported(rank: int, devices: int, case: ExportedCase, index: int, workdir: Path) -> None:
    import torch
    import torch.distributed as dist

    ns: dict = {}
    exec(compile(case.code, f"export{index}.py", "exec"), ns)
    torch.manual_seed(case.seed)
    model = case.model()
    x, y = case.make_batch()
    micro = x[: x.shape[0] // ns["N_MICROBATCHES"]]
    # a tensor-parallel plan's export applies its plan and returns the pipeline's group, as its comments say
    group = ns["setup_parallel"](model, torch.device("cpu")) if "setup_parallel" in ns else None
    built, schedule, tied = ns["build_pipeline"](model, micro, torch.device("cpu"), case.loss, group=group)
    stages = list(built) if isinstance(built, (list, tuple)) else [built]
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
    # a master-weights plan's program: the optimizer over the float32 masters, copied back after its step
    pairs = ns["master_weights"](stages) if ns.get("MASTER_WEIGHTS") else None
    optimizer = torch.optim.Adam([m for _, m in pairs] if pairs is not None else params, lr=0.0)
    set_to_none = ns["GRADIENTS_SET_TO_NONE"]

    def finish_step() -> None:
        if pairs is not None:
            ns["copy_masters"](pairs)
        else:
            optimizer.zero_grad(set_to_none=set_to_none)

    def gradient(p):
        return p.main_grad if pairs is not None else p.grad
    # each stage parameter's name in the model: a traced stage keeps the model's names (a tied parameter's
    # first one), a stage built from modules holds the model's own tensors
    canonical: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(p), n)
    alias = {n: canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
    names, stage_names = {}, {}
    for s in stages:
        for n, p in s.submod.named_parameters():
            plain = n.replace("_checkpoint_wrapped_module.", "")
            names[id(p)] = alias[plain] if plain in alias else canonical[id(p)]
            stage_names[names[id(p)]] = n

    def step() -> list:
        losses = ns["train_step"](built, schedule, x if first else None, y if last else None)
        ns["sum_tied_gradients"](tied)
        return losses

    step()
    optimizer.step()
    finish_step()
    dist.barrier()
    log, trace, tracker = _tracked(stages, [s.submod for s in stages] + [optimizer]
                                   + [t for _, master in pairs or () for t in (master, master.grad)])
    with tracker:
        for measured_step in (False, True):
            if measured_step:
                log.clear()
                trace.clear()
                tracker.restart_peak()
                tracker.overall = 0
            start = time.perf_counter()
            losses = [float(v.detach()) for v in step()]
            grads = {names[id(p)]: _whole(gradient(p)).detach().float().numpy().copy() for p in params
                     if getattr(p, "main_grad" if pairs is not None else "grad", None) is not None}
            before = tracker.restart_peak()
            optimizer.step()
            optimizer_trace = (before, tracker.peak_since_restart(), tracker.live_bytes())
            seconds = time.perf_counter() - start
            finish_step()
            if not measured_step:
                dist.barrier()
    total = max(tracker.overall, tracker.peak_since_restart())
    record = {"rank": rank, "stages": [s.stage_index for s in stages], "executed": log, "peak_bytes": total,
              "trace": trace, "optimizer_trace": optimizer_trace, "losses": losses, "seconds": seconds,
              "stage_names": stage_names}
    base = workdir / f"case{index}-rank{rank}"
    (base.with_suffix(".json")).write_text(json.dumps(record))
    np.savez(base.with_suffix(".npz"), **grads)


def run_exported(cases: Sequence[ExportedCase], devices: int, timeout_s: float = 300.0) -> list[list[RankResult]]:
    """Run each exported program, one after the other, in one group of ``devices`` processes (gloo);
    per case, the ranks' results in rank order (``grads`` keyed by the model's parameter names)."""
    import ranks
    with tempfile.TemporaryDirectory(prefix="exported-pipeline-") as tmp:
        ranks.start(_worker, (devices, list(cases), tmp, timeout_s, _run_exported), devices)
        return [[_load(Path(tmp) / f"case{i}-rank{r}") for r in range(devices)] for i in range(len(cases))]
