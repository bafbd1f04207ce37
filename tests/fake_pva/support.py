"""Put the fake ``pva`` module (tests/fake_pva/pva.py) in place for one test, so stagesplit's
real reader code path (``import pva`` inside ``read_popvision``) runs against it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

FAKE_DIR = Path(__file__).resolve().parent


def load_fake_pva(monkeypatch):
    """A fresh fake ``pva`` module (empty registry) on sys.path and in sys.modules, both undone
    by ``monkeypatch`` when the test ends."""
    spec = importlib.util.spec_from_file_location("pva", FAKE_DIR / "pva.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.syspath_prepend(str(FAKE_DIR))
    monkeypatch.setitem(sys.modules, "pva", module)
    return module
