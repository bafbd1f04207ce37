"""Check capture's per-stage memory on a real GPU (issue 7): capture examples/gpt.py on the CPU
under fake tensors, solve it for 4 stages (1F1B, 8 micro-batches), then run each planned stage
for real on the GPU and compare the predicted peak with torch.cuda.max_memory_allocated.
Target: every stage within 5%. The cuBLAS workspaces (allocated once per process, not in the
profile) are measured first and taken off every peak.

Each stage runs alone: its layers' modules (the first stage has the embeddings, the last the
final norm, the head and the loss; the tied embedding is on both), its parameters, gradients
(kept, as gradient accumulation does) and Adam state, and ``in flight`` micro-batches: all their
forwards, then all their backwards, then the optimizer step. The peak is measured from a
reset after a warm-up step, so it counts only this stage's tensors (not the CUDA context).

Run from the repository root on a machine with CUDA:  python benchmarks/validate_gpu.py
Or in two halves, where the GPU machine has PyTorch but not stagesplit's dependencies: here
``python benchmarks/validate_gpu.py --predict FILE`` (capture and solve, CPU only), there
``python benchmarks/validate_gpu.py --measure FILE`` (PyTorch and examples/gpt.py only).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))      # tests/indexed_inputs.py: plan inputs for options in layer indices


def predict() -> list[dict]:
    """The planned stages of examples/gpt.py for 4 devices (no schedule, and 1F1B with 8
    micro-batches) and each one's predicted peak, from a capture on the CPU."""
    from indexed_inputs import indexed_inputs
    from stagesplit.capturing.pytorch import capture
    from stagesplit.model.analysis import Analysis
    from stagesplit.plan.advise import advise
    from stagesplit.solver.problem import SolveOptions
    profile = capture(str(ROOT / "examples" / "gpt.py") + ":build")          # 512-byte rounding, as CUDA
    analysis = Analysis.of(profile)
    rows = []
    for schedule in ("none", "1f1b"):
        options = SolveOptions(devices=4, exact=True, schedule=schedule, micro_batches=8)
        plan = advise(analysis.model, indexed_inputs(analysis.model, options)).plan
        for s in plan.stages:
            predicted = analysis.model.stage_memory(s.first_layer, s.last_layer).worst_bytes(s.in_flight)
            rows.append(dict(schedule=schedule, stage=s.stage, span=f"{s.layers[0]}..{s.layers[-1]}",
                             first=s.first_layer, last=s.last_layer, in_flight=s.in_flight, predicted=int(predicted)))
    return rows


def measure(rows: list[dict]) -> int:
    """Each predicted stage run for real on the GPU, and the table of predicted against measured."""
    import torch
    if not torch.cuda.is_available():
        print("validate_gpu: no CUDA device here: run this on a machine with an NVIDIA GPU and a CUDA build of "
              "PyTorch", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    gpt = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gpt
    spec.loader.exec_module(gpt)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    title = f"Predicted vs measured stage peak on {name} (torch {torch.__version__})"
    print(title)
    print("=" * len(title))
    base = workspaces(torch, device)
    print(f"cuBLAS workspaces, allocated before any stage and not in the profile (keep them back with "
          f"--reserve): {base:,} bytes ({base / 2**20:.2f} MiB); measured = each stage's peak less these")
    print(f"{'schedule':<8}  {'stage':>5}  {'layers':>6}  {'in flight':>9}  {'predicted (MiB)':>15}  "
          f"{'measured (MiB)':>14}  {'error':>7}")
    worst = 0.0
    for row in rows:
        peak = run_stage(torch, gpt, device, row["first"], row["last"], row["in_flight"])
        if peak <= 0:
            print("validate_gpu: the CUDA allocator keeps no statistics here (PYTORCH_NO_CUDA_MEMORY_CACHING is "
                  "set?): nothing to compare", file=sys.stderr)
            return 2
        measured = peak - base
        err = (row["predicted"] - measured) / measured
        worst = max(worst, abs(err))
        print(f"{row['schedule']:<8}  {row['stage']:>5}  {row['span']:>6}  {row['in_flight']:>9}  "
              f"{row['predicted'] / 2**20:>15.2f}  {measured / 2**20:>14.2f}  {100 * err:>+6.1f}%  "
              f"({row['predicted']:,} vs {measured:,} bytes)", flush=True)
    print(f"worst error {100 * worst:.1f}% (target: within 5%)")
    return 0 if worst <= 0.05 else 1


def main() -> int:
    import argparse
    import json
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predict", metavar="FILE", help="capture and solve only (CPU), the predictions to FILE")
    parser.add_argument("--measure", metavar="FILE", help="run the predictions in FILE on the GPU only")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("validate_gpu: needs PyTorch: pip install 'stagesplit[torch]'", file=sys.stderr)
        return 2
    if args.measure:
        return measure(json.loads(Path(args.measure).read_text(encoding="utf-8")))
    rows = predict()
    if args.predict:
        from stagesplit.common.fileio import atomic_write_text
        atomic_write_text(Path(args.predict), json.dumps(rows, indent=1) + "\n")
        print(f"{len(rows)} stage predictions written to {args.predict}")
        return 0
    return measure(rows)


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


def workspaces(torch, device) -> int:
    """What the process keeps allocated once cuBLAS has run forward (this thread) and backward
    (autograd's thread), with and without a bias (cuBLAS and cuBLASLt): its workspaces, one per
    handle, kept for the process's life; the profile does not hold them (docs/gpu.md: --reserve)."""
    linear = torch.nn.Linear(64, 64, device=device)
    weight = torch.randn(64, 64, device=device, requires_grad=True)
    x = torch.randn(8, 64, device=device, requires_grad=True)
    (linear(x) @ weight).sum().backward()
    del linear, weight, x
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(device)


if __name__ == "__main__":
    sys.exit(main())
