"""torchvision and timm in the test processes only (tests/conftest.py, and the processes
tests/pipeline_harness.py spawns, which inherit the test process's path)."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["VISION", "torchvision_model_code"]

#: where the README's test command installs torchvision and timm (their model code only), outside
#: site-packages so that no other process sees them (transformers imports torchvision wherever it
#: is installed, and PyPI's torchvision cannot load beside the CPU build of torch)
VISION = Path(__file__).resolve().parent.parent / ".venv" / "vision"


def torchvision_model_code() -> None:
    """Make ``import torchvision`` give torchvision's model code, here in the test process only:
    PyPI's torchvision is built for CUDA torch, and beside the CPU torch its ``__init__`` fails
    registering its C++ operators ("operator torchvision::nms does not exist"). The model
    definitions (torchvision's and timm's ResNets, the tests' captures) use none of them. Done
    before anything imports transformers or timm, which import torchvision."""
    import importlib.metadata
    import importlib.util
    import types
    if VISION.is_dir() and str(VISION) not in sys.path:
        sys.path.append(str(VISION))
        importlib.invalidate_caches()
    if "torchvision" in sys.modules:
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    package = types.ModuleType("torchvision")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    try:
        package.__version__ = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        package.__version__ = "0"
    sys.modules["torchvision"] = package
