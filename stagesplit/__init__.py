"""stagesplit: a pipeline-stage partition advisor.

Read a single-device memory profile, group its operations into layers, price every contiguous
range of layers as a pipeline stage, and (see ``solve``) choose split points for N devices.
"""

__version__ = "0.1.0"

from .analysis import Analysis
from .breakdown import Breakdown
from .config import SolverSettings, known_targets, load_solver_settings, load_target
from .costmodel import RangeTable, StageCostModel, StageMemory
from .errors import ProfileError, StagesplitError
from .io import load_profile, save_profile
from .io.layerform import LayerSpec, build_layer_profile
from .layers import LayerAssignment, LayerOptions, group_layers
from .profile import Profile, Target
from .builder import ProfileBuilder
from .synth import synthesize
from .traffic import Traffic, layer_traffic

__all__ = [
    "Analysis", "Breakdown", "LayerAssignment", "LayerOptions", "LayerSpec", "Profile", "ProfileBuilder",
    "ProfileError", "RangeTable", "SolverSettings", "StageCostModel", "StageMemory", "StagesplitError", "Target",
    "Traffic", "build_layer_profile", "group_layers", "known_targets", "layer_traffic", "load_profile",
    "load_solver_settings", "load_target", "save_profile", "synthesize",
]
