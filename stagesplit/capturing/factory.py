"""The model factory of ``stagesplit capture MODEL``: user code, found and called.

``MODEL`` names a function (``path/to/file.py:function`` or ``package.module:function``) that
returns ``(model, inputs)`` or ``(model, inputs, loss_fn)``. Anything that code does, failing to
import, raising, calling ``sys.exit()`` or returning the wrong shape, ends in one line naming the
factory and what was expected.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StagesplitError
from .runtime import first_line, load_torch

__all__ = ["load_factory", "call_factory", "check_model"]


def load_factory(spec: str) -> Callable[[], Any]:
    """The function ``spec`` names: ``path/to/file.py:function`` or ``package.module:function``."""
    where, sep, func = spec.rpartition(":")
    if not sep or not where or not func.isidentifier():
        raise StagesplitError(f"{spec}: expected MODEL as path/to/file.py:function or package.module:function")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise StagesplitError(f"{spec}: cannot import {where}: no such file")
        name = f"_stagesplit_model_{abs(hash(str(path.resolve())))}"
        sys.path.insert(0, str(path.resolve().parent))    # so the file can import its neighbours
        try:
            module_spec = importlib.util.spec_from_file_location(name, path)
            # a spec of None (a file Python cannot load) fails in here, reported as the file's failure
            module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
            sys.modules[name] = module                      # dataclasses need their module registered
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except (Exception, SystemExit) as exc:           # sys.exit() in the file is its failure, not ours
            sys.modules.pop(name, None)
            raise StagesplitError(f"{spec}: cannot import {where}: {first_line(exc)}") from None
        finally:
            try:
                sys.path.remove(str(path.resolve().parent))
            except ValueError:
                pass
    else:
        try:
            module = importlib.import_module(where)
        except (Exception, SystemExit) as exc:
            raise StagesplitError(f"{spec}: cannot import {where}: {first_line(exc)}") from None
    factory = getattr(module, func, None)
    if factory is None:
        raise StagesplitError(f"{spec}: no function '{func}' in {where}")
    if not callable(factory):
        raise StagesplitError(f"{spec}: '{func}' in {where} is not a function")
    return factory


def call_factory(factory: Callable[[], Any], spec: str):
    """``(model, inputs, loss_fn)`` from the factory, checked."""
    torch = load_torch()
    try:
        result = factory()
    except (Exception, SystemExit) as exc:               # Ctrl-C (KeyboardInterrupt) still interrupts
        raise StagesplitError(f"{spec}: calling the factory raised {first_line(exc)}; expected it to return "
                              "(model, inputs) or (model, inputs, loss_fn)") from None
    return check_model(result, spec, torch)


def check_model(result: Any, spec: str, torch=None):
    """``(model, inputs, loss_fn)`` from what a factory returned, each item checked; a wrong one is
    one line naming ``spec``."""
    torch = torch or load_torch()
    shape = "(model, inputs) or (model, inputs, loss_fn)"
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise StagesplitError(f"{spec}: the factory returned {type(result).__name__}; expected {shape}")
    model, inputs = result[0], result[1]
    loss_fn = result[2] if len(result) == 3 else None
    if not isinstance(model, torch.nn.Module):
        raise StagesplitError(f"{spec}: the factory's first item is {type(model).__name__}; expected a "
                              f"torch.nn.Module in {shape}")
    if not isinstance(inputs, (torch.Tensor, tuple, list, dict)):
        raise StagesplitError(f"{spec}: the factory's inputs are {type(inputs).__name__}; expected a tensor, "
                              "a tuple of arguments or a dict of keyword arguments")
    if loss_fn is not None and not callable(loss_fn):
        raise StagesplitError(f"{spec}: the factory's loss_fn is {type(loss_fn).__name__}; expected a callable "
                              "taking the model's output and returning a scalar tensor")
    return model, inputs, loss_fn
