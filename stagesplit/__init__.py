"""stagesplit: a pipeline-stage partition advisor.

Read a single-device memory profile, group its operations into layers, price every contiguous
range of layers as a pipeline stage, and choose split points for N devices: ``solve``,
``sweep``, ``breakdown``, ``diagnose`` and ``reproduce`` take names, as the command line does
(see api.py). Public names are imported on first use, so ``import stagesplit`` (and the
command line's light commands) do not pay for the solver, plotting or pandas. No public
function shares its name with a module of the package (importing the module would replace it).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    "solve": ".api", "sweep": ".api", "breakdown": ".api", "analyze": ".api", "reproduce": ".api",
    "SolveRequest": ".solver.request", "Objective": ".solver.request", "Schedule": ".solver.request", "SharedPolicy": ".solver.request",
    "MemoryBreakdown": ".model.stagememory", "OptionError": ".errors", "LayerRangeError": ".errors",
    "Advice": ".solver.advise",
    "Analysis": ".model.analysis",
    "Breakdown": ".reporting.breakdown",
    "diagnose": ".api",
    "SolverSettings": ".io.targets", "known_targets": ".io.targets", "load_solver_settings": ".io.targets",
    "load_target": ".io.targets",
    "RangeTable": ".model.costmodel", "StageCostModel": ".model.costmodel", "StageMemory": ".model.costmodel",
    "ProfileError": ".errors", "StagesplitError": ".errors",
    "load_profile": ".io", "save_profile": ".io",
    "LayerSpec": ".io.layerform", "build_layer_profile": ".io.layerform",
    "LayerAssignment": ".layers", "LayerOptions": ".layers", "group_layers": ".layers",
    "exact_optimum": ".solver.dp", "greedy": ".solver.dp", "uniform": ".solver.dp",
    "export_plan": ".export",
    "capture": ".io.capture", "capture_model": ".io.capture",
    "import_onnx": ".io.onnximport",
    "apply_roofline": ".model.roofline",
    "Plan": ".plan.records", "read_plan": ".plan.records", "write_plan": ".plan.records",
    "SolveOptions": ".solver.problem", "Split": ".solver.problem", "SplitProblem": ".solver.problem", "build_problem": ".solver.problem",
    "Profile": ".io.profile", "Target": ".io.profile",
    "solve_cpsat": ".solver.cpsat",
    "ProfileBuilder": ".io.builder",
    "synthesize": ".io.synth",
    "Traffic": ".model.traffic", "layer_traffic": ".model.traffic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stagesplit' has no attribute '{name}'")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
