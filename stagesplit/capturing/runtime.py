"""The conditions a capture runs torch under, in one place.

torch is an optional extra: it is imported here only, lazily (``load_torch``), and a missing torch
is one line naming the extra. Its compile caches go to a private temporary folder removed when
the process exits. While a capture runs, logging and warnings are silenced (``quiet``; the command
line's ``--debug`` shows them), and transformers' data-dependent choices are made as a real run
makes them (``as_a_real_run``). An exception from torch or from the user's code is told in one
line (``first_line``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from ..errors import StagesplitError

__all__ = ["TORCH_MISSING", "CACHE_VARIABLES", "load_torch", "quiet", "as_a_real_run", "first_line"]

TORCH_MISSING = ("stagesplit capture needs PyTorch: pip install 'stagesplit[torch]' (from a checkout of stagesplit: "
                 "pip install '.[torch]')")
#: the environment variables naming torch's on-disk caches (inductor's is made when torch._dynamo is imported)
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def load_torch():
    """torch, imported on first use (its caches made private first); a missing torch is one line
    naming the extra to install."""
    _private_caches()
    try:
        import torch  # noqa: F401
    except ImportError:
        raise StagesplitError(TORCH_MISSING) from None
    return torch


_cache_folder: list[str] = []


def _private_caches() -> None:
    """Point torch's caches that the user has not placed at a private temporary folder, removed
    when the process exits (torch makes ``$TMPDIR/torchinductor_<user>`` on import otherwise)."""
    if _cache_folder or all(os.environ.get(name) for name in CACHE_VARIABLES):
        return
    folder = tempfile.mkdtemp(prefix="stagesplit-torch-")
    _cache_folder.append(folder)
    for name in CACHE_VARIABLES:
        if not os.environ.get(name):
            os.environ[name] = os.path.join(folder, name.split("_")[0].lower())
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


@contextlib.contextmanager
def quiet(show: bool) -> Iterator[None]:
    """Silence logging and warnings while the model runs (torch logs a traceback per failed fake
    kernel before the one-line error; models warn about options that do not matter here)."""
    if show:
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def as_a_real_run() -> Iterator[None]:
    """Make the data-dependent choices a model makes from its inputs' values as a real run makes
    them for ordinary inputs. Under fake tensors, transformers' ``find_packed_sequence_indices``
    cannot read the position ids and assumes packed sequences: it builds an explicit attention
    mask, which makes grouped-query attention repeat the keys and values - tensors a real step
    never holds (a Llama block held 8% more for backward). A capture is of one sequence per batch
    row, as the position ids transformers makes itself say."""
    masking: Any = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


def first_line(exc: BaseException) -> str:
    """``ValueError: the first line of its message``: an exception in one line."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
