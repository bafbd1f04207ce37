"""Check capture's per-stage memory on a real GPU (issue 7): capture examples/gpt.py on the CPU
under fake tensors, solve it for 4 stages (1F1B, 8 micro-batches), then run each planned stage
for real on the GPU and compare the predicted peak with torch.cuda.max_memory_allocated.
Target: every stage within 5%.

Each stage runs alone: its layers' modules (the first stage has the embeddings, the last the
final norm, the head and the loss; the tied embedding is on both), its parameters, gradients
(kept, as gradient accumulation does) and Adam state, and ``in flight`` micro-batches: all their
forwards, then all their backwards, then the optimizer step. The peak is measured from a
reset after a warm-up step, so it counts only this stage's tensors (not the CUDA context).

Run from the repository root on a machine with CUDA:  python benchmarks/validate_gpu.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    try:
        import torch
    except ImportError:
        print("validate_gpu: needs PyTorch: pip install 'stagesplit[torch]'", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("validate_gpu: no CUDA device here: run this on a machine with an NVIDIA GPU and a CUDA build of "
              "PyTorch", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    gpt = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gpt
    spec.loader.exec_module(gpt)

    from stagesplit.plan.advise import advise
    from stagesplit.model.analysis import Analysis
    from stagesplit.capturing.pytorch import capture
    from stagesplit.solver.problem import SolveOptions
    profile = capture(str(ROOT / "examples" / "gpt.py") + ":build")          # 512-byte rounding, as CUDA
    analysis = Analysis.of(profile)
    device = torch.device("cuda")
    rows = []
    for schedule in ("none", "1f1b"):
        plan = advise(analysis.model, SolveOptions(devices=4, exact=True, schedule=schedule, micro_batches=8)).plan
        for s in plan.stages:
            measured = run_stage(torch, gpt, device, s.first_layer, s.last_layer, s.in_flight)
            predicted = analysis.model.stage_memory(s.first_layer, s.last_layer).worst_bytes(s.in_flight)
            rows.append((schedule, s.stage, f"{s.layers[0]}..{s.layers[-1]}", s.in_flight, predicted, measured))
    name = torch.cuda.get_device_name(device)
    title = f"Predicted vs measured stage peak on {name} (torch {torch.__version__})"
    print(title)
    print("=" * len(title))
    print(f"{'schedule':<8}  {'stage':>5}  {'layers':>6}  {'in flight':>9}  {'predicted (MiB)':>15}  "
          f"{'measured (MiB)':>14}  {'error':>7}")
    worst = 0.0
    for schedule, stage, span, k, pred, meas in rows:
        err = (pred - meas) / meas
        worst = max(worst, abs(err))
        print(f"{schedule:<8}  {stage:>5}  {span:>6}  {k:>9}  {pred / 2**20:>15.2f}  {meas / 2**20:>14.2f}  "
              f"{100 * err:>+6.1f}%")
    print(f"worst error {100 * worst:.1f}% (target: within 5%)")
    return 0 if worst <= 0.05 else 1


def run_stage(torch, gpt, device, first: int, last: int, in_flight: int) -> int:
    model, _ = gpt.build_real()
    model = model.to(device)
    stage = gpt.PipelineStage(model, first, last, device)
    keep = {id(t) for t in stage.params + stage.buffers}
    for m in model.modules():                      # free what this stage does not hold
        for table in (m._parameters, m._buffers):
            for key, t in list(table.items()):
                if t is not None and id(t) not in keep:
                    table[key] = None
    opt = torch.optim.Adam(stage.params, foreach=False)
    stage.backward(stage.forward(stage.make_input()))
    opt.step()
    opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    xs = [stage.make_input() for _ in range(in_flight)]
    outs = [stage.forward(x) for x in xs]
    for out in outs:
        stage.backward(out)
    del outs, xs
    opt.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device)
    del model, opt, stage
    torch.cuda.empty_cache()
    return peak


if __name__ == "__main__":
    sys.exit(main())
