"""Import an ONNX model as a full-form profile (one tile): ``stagesplit import model.onnx``.

This module runs the import; each step is a module of its own. The file is read once and
parsed within bounded memory (``onnxread``); the graph is checked before anything else reads it
(``onnxcheck``); symbolic dimensions are bound by ``dims`` and ``batch`` and the
shapes inferred, shape arithmetic folded where inference cannot follow it (``onnxshapes``); each
node's FLOPs come from its operator and shapes (``onnxflops``); and the profile is built, with
training's gradients, optimizer state and backward steps (``training``: adam, sgd or none), from the
tensors' liveness (``onnxprofile``).
"""

from __future__ import annotations

from pathlib import Path

from ..common.text import one_line
from ..errors import OptionError, StagesplitError
from .onnxcheck import check_graph
from .onnxprofile import DTYPES, OnnxImport, build_profile
from .onnxread import load_model
from .onnxshapes import bind_dims, checked_dims, fold_shape_computations, infer_shapes
from .profile import Target

__all__ = ["import_onnx", "TRAINING"]

TRAINING = ("adam", "sgd", "none")


def _onnx():
    try:
        import onnx  # noqa: F401
        from onnx import shape_inference  # noqa: F401
    except ImportError:
        raise StagesplitError("import needs the onnx package: pip install 'stagesplit[onnx]' (from a checkout of "
                              "stagesplit: pip install '.[onnx]')") from None
    return onnx


def import_onnx(path: str | Path, target: Target, *, batch: int | None = None, dims: dict[str, int] | None = None,
                training: str = "adam", dtype: str | None = None, name: str | None = None) -> OnnxImport:
    """Read ``path`` and build its profile on ``target`` (see the module docstring)."""
    onnx = _onnx()
    if training not in TRAINING:
        raise OptionError("training", f"expected one of {', '.join(TRAINING)}, got '{one_line(str(training))}'")
    if dtype is not None and dtype not in DTYPES:
        raise OptionError("dtype", f"expected one of {', '.join(DTYPES)}, got '{one_line(str(dtype))}'")
    dims = checked_dims(dims, batch)
    path = Path(path)
    src = str(path)
    model = load_model(onnx, path)
    external = check_graph(onnx, model, path)
    bind_dims(model, dims, batch, src)
    model = infer_shapes(onnx, model, src)
    if fold_shape_computations(onnx, model):      # shapes computed from shapes: fold, then infer again
        model = infer_shapes(onnx, model, src)
    result = build_profile(onnx, model, target, training, dtype, name or path.stem, src)
    result.external_files = external
    return result
