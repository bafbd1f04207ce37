"""stagesplit: a pipeline-stage partition advisor.

Read a single-device memory profile, group its operations into layers, price every contiguous
range of layers as a pipeline stage, and choose split points for N devices. The front door is
one function per command, taking names as the command line does (``stagesplit.api``):

    plan = stagesplit.solve("profiles/bert-base.stagesplit", devices=4, schedule="1f1b")

plus the records they return and the errors they raise. Everything else lives in the
subpackages, by stage of the data flow: ``io`` (readers and capture) -> ``layers`` ->
``model`` (the stage cost model) -> ``solver`` -> ``plan`` -> ``reporting`` and ``exporters``
-> ``api`` -> ``cli``. Public names are imported on first use, so ``import stagesplit`` (and
the command line's light commands) do not pay for the solver, plotting or pandas. No public
name is also the name of a module of the package (importing the module would replace it).
"""

from __future__ import annotations

import importlib
from typing import Any

from .common.versions import VERSION as __version__

# public name -> the module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # one function per command
    "solve": ".api", "sweep": ".api", "reproduce": ".api", "breakdown": ".api", "diagnose": ".api",
    "analyze": ".api", "convert": ".api", "import_onnx": ".api", "capture": ".api", "synthesize": ".api",
    "export": ".api", "targets": ".api", "report": ".api", "plot": ".api", "Events": ".api", "Reproduction": ".api",
    "layouts": ".api", "layout_sweep": ".api", "layout_comparison": ".api",
    # the records they take and return
    "SolveRequest": ".solver.request", "Objective": ".solver.request", "Schedule": ".solver.request",
    "SharedPolicy": ".solver.request", "LayerOptions": ".layers",
    "Profile": ".io.profile", "Target": ".io.profile", "load_profile": ".io", "save_profile": ".io",
    "Analysis": ".model.analysis", "MemoryBreakdown": ".model.stagememory",
    "Plan": ".plan.records", "StagePlan": ".plan.records", "PlanInputs": ".plan.records",
    "read_plan": ".plan.files", "write_plan": ".plan.files", "SweepResult": ".plan.sweep",
    "LayoutPlan": ".plan.layouts", "LayoutRow": ".plan.layouts", "GpuSweep": ".plan.layouts",
    "Comparison": ".plan.layout_compare",
    "Breakdown": ".reporting.breakdown", "Diagnosis": ".reporting.diagnosis",
    # the errors
    "StagesplitError": ".errors", "ProfileError": ".errors", "OptionError": ".errors", "LayerRangeError": ".errors",
    "FileOptionError": ".errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def _plan_plot(plan: Any) -> Any:
    # a function of the plan alone (reporting/plot.py): nothing read or solved again
    return importlib.import_module(".reporting.plot", __name__).figure_of(plan)


def _plan_report(plan: Any, *args: Any, **kwargs: Any) -> Any:
    return importlib.import_module(".api", __name__).report(plan, *args, **kwargs)


# Plan.plot() and Plan.report() are drawn by the reporting stage, bound here (common/hooks.py)
from .common import hooks as _hooks  # noqa: E402

_hooks.register("plan.plot", _plan_plot)
_hooks.register("plan.report", _plan_report)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stagesplit' has no attribute '{name}'")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
