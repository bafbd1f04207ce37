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
    "SolveRequest": ".options", "Objective": ".options", "Schedule": ".options", "SharedPolicy": ".options",
    "MemoryBreakdown": ".stagememory", "OptionError": ".errors", "LayerRangeError": ".errors",
    "Advice": ".advise",
    "Analysis": ".analysis",
    "Breakdown": ".breakdowns",
    "diagnose": ".api",
    "SolverSettings": ".config", "known_targets": ".config", "load_solver_settings": ".config",
    "load_target": ".config",
    "RangeTable": ".costmodel", "StageCostModel": ".costmodel", "StageMemory": ".costmodel",
    "ProfileError": ".errors", "StagesplitError": ".errors",
    "load_profile": ".io", "save_profile": ".io",
    "LayerSpec": ".io.layerform", "build_layer_profile": ".io.layerform",
    "LayerAssignment": ".layers", "LayerOptions": ".layers", "group_layers": ".layers",
    "exact_optimum": ".oracle", "greedy": ".oracle", "uniform": ".oracle",
    "export_plan": ".export",
    "capture": ".torchcapture", "capture_model": ".torchcapture",
    "import_onnx": ".io.onnximport",
    "apply_roofline": ".roofline",
    "Plan": ".plan", "read_plan": ".plan", "write_plan": ".plan",
    "SolveOptions": ".problem", "Split": ".problem", "SplitProblem": ".problem", "build_problem": ".problem",
    "Profile": ".profile", "Target": ".profile",
    "solve_cpsat": ".solver",
    "ProfileBuilder": ".builder",
    "synthesize": ".synth",
    "Traffic": ".traffic", "layer_traffic": ".traffic",
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
