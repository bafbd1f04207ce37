"""stagesplit: a pipeline-stage partition advisor.

Read a single-device memory profile, group its operations into layers, price every contiguous
range of layers as a pipeline stage, and (see ``solve``) choose split points for N devices.
"""

__version__ = "0.1.0"

from .advise import Advice, advise, sweep
from .analysis import Analysis
from .breakdown import Breakdown
from .diagnose import diagnose
from .config import SolverSettings, known_targets, load_solver_settings, load_target
from .costmodel import RangeTable, StageCostModel, StageMemory
from .errors import ProfileError, StagesplitError
from .io import load_profile, save_profile
from .io.layerform import LayerSpec, build_layer_profile
from .layers import LayerAssignment, LayerOptions, group_layers
from .oracle import exact_optimum, greedy, uniform
from .plan import Plan, read_plan, write_plan
from .problem import SolveOptions, Split, SplitProblem, build_problem
from .profile import Profile, Target
from .solver import solve_cpsat
from .builder import ProfileBuilder
from .synth import synthesize
from .traffic import Traffic, layer_traffic

__all__ = [
    "Advice", "Analysis", "Breakdown", "LayerAssignment", "LayerOptions", "LayerSpec", "Plan", "Profile",
    "ProfileBuilder", "ProfileError", "RangeTable", "SolveOptions", "SolverSettings", "Split", "SplitProblem",
    "StageCostModel", "StageMemory", "StagesplitError", "Target", "Traffic", "advise", "build_layer_profile",
    "build_problem", "diagnose", "exact_optimum", "greedy", "group_layers", "known_targets", "layer_traffic",
    "load_profile", "load_solver_settings", "load_target", "read_plan", "save_profile", "solve_cpsat", "sweep",
    "synthesize", "uniform", "write_plan",
]
