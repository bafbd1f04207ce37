"""Tensor-parallel training steps run for real: N gloo processes on the CPU, each rank measured by
torch's MemTracker, to check a tensor-parallel capture against.

Each rank builds the same model from the same seed, applies the same plan with torch's
``parallelize_module`` (the styles stagesplit's ``capturing.tensorparallel`` makes from the plan:
the oracle here is the memory torch allocates when it runs them, which the capture predicts under
fake tensors), runs a warm-up step (Adam's state is made, ``zero_grad(set_to_none=False)`` keeps
the gradients, as the capture counts both as always live) and one measured step: forward, loss,
backward, optimizer step. Each rank writes its MemTracker peak and the step's loss.

The models: a tiny Hugging Face Llama from a config (its declared plan) and the example GPT
(``examples/gpt.py``, its plan in ``examples/gpt-tp.yaml``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from vision import torchvision_model_code

# a spawned worker has the test process's path (with torchvision's folder) but not its modules
torchvision_model_code()

ROOT = Path(__file__).resolve().parents[1]
GPT_FILE = ROOT / "examples" / "gpt.py"
GPT_PLAN = ROOT / "examples" / "gpt-tp.yaml"

__all__ = ["GPT_FILE", "GPT_PLAN", "TPCase", "RankMeasure", "build", "inputs", "loss_of", "run_tp", "reference_loss"]


@dataclass(frozen=True)
class TPCase:
    """``model``: llama or gpt; ``degree`` ranks, with ``sequence_parallel`` or not, and with
    ``loss_parallel`` or not (the head's logits kept split, the loss under torch's ``loss_parallel``)."""

    model: str
    degree: int = 2
    sequence_parallel: bool = False
    loss_parallel: bool = False

    @property
    def plan_file(self) -> str | None:
        return str(GPT_PLAN) if self.model == "gpt" else None


@dataclass(frozen=True)
class RankMeasure:
    rank: int
    peak_bytes: int
    loss: float


def _gpt_module():
    spec = importlib.util.spec_from_file_location("stagesplit_example_gpt_tp", GPT_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def llama_config():
    import transformers
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, vocab_size=256,
                                      max_position_embeddings=64)
    # SDPA named, not left to transformers' choice: a worker process must run the kernel the capture ran
    config._attn_implementation = "sdpa"
    return config


def gpt_config():
    return _gpt_module().GPTConfig(vocab_size=512, context=32, d_model=64, heads=4, layers=2, batch=2)


def build(model: str, device: str = "cpu"):
    """The model with weights from seed 0 (on ``device``: meta for a capture)."""
    import torch
    torch.manual_seed(0)
    with torch.device(device):
        if model == "llama":
            import transformers
            return transformers.LlamaForCausalLM(llama_config())
        gpt = _gpt_module()
        return gpt.GPT(gpt_config())


def inputs(model: str, device: str = "cpu"):
    """Token ids from seed 1 (a dict of keyword arguments for Llama: ids and labels)."""
    import torch
    g = torch.Generator().manual_seed(1)
    if model == "llama":
        ids = torch.randint(0, 256, (2, 32), generator=g)
        ids = ids.to(device)
        return {"input_ids": ids, "labels": ids}
    cfg = gpt_config()
    return torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.context), generator=g).to(device)


def loss_of(model: str, net, batch):
    """The loss the capture starts its backward from: Llama's cross entropy, the GPT's logits' sum."""
    if model == "llama":
        return net(**batch).loss
    return net(batch).sum()


def reference_loss(model: str) -> float:
    """The unparallelised model's loss on the same batch, in this process."""
    import torch
    net = build(model)
    with torch.no_grad():
        return float(loss_of(model, net, inputs(model)))


def _rank(rank: int, case: TPCase, workdir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh

    from stagesplit.capturing.tensorparallel import loss_parallel_context, parallelize, resolve_plan
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=case.degree,
                            timeout=timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (case.degree,))
        net = build(case.model)
        plan = resolve_plan(torch, net, case.degree, case.sequence_parallel, case.plan_file, case.loss_parallel)
        parallelize(torch, net, mesh, plan)
        batch = inputs(case.model)
        opt = torch.optim.Adam(net.parameters(), foreach=False)
        with loss_parallel_context(torch, plan):
            first = loss_of(case.model, net, batch)
            loss = float(first.detach())
            first.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        del first
        tracker = MemTracker()
        tracker.track_external(net, opt, batch)
        with tracker:
            with loss_parallel_context(torch, plan):
                loss_of(case.model, net, batch).backward()
            opt.step()
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        Path(workdir, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "peak": peak, "loss": loss}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_tp(case: TPCase) -> list[RankMeasure]:
    """Run ``case`` on ``case.degree`` gloo processes; each rank's peak and first loss, in rank order."""
    import ranks
    with tempfile.TemporaryDirectory(prefix="tp-harness-") as tmp:
        ranks.start(_rank, (case, tmp), case.degree)
        out = []
        for r in range(case.degree):
            d = json.loads(Path(tmp, f"rank{r}.json").read_text())
            out.append(RankMeasure(d["rank"], int(d["peak"]), float(d["loss"])))
        return out
