"""Which files a parsed command line names: its inputs (profiles, plans, settings, targets, the
capture factory's source) and outputs, checked together before anything is read or written."""

from __future__ import annotations

import argparse

from .. import api

__all__ = ["check_command_files", "command_inputs", "command_outputs"]


#: per command, the options (argparse destinations) that name input files
_FILE_INPUTS = {
    "breakdown": ("profile", "debug_cbor", "layer_compute"),
    "solve": ("profile", "debug_cbor", "config", "layer_compute", "from_plan"),
    "sweep": ("profile", "debug_cbor", "config", "layer_compute"),
    "diagnose": ("profile", "debug_cbor", "layer_compute", "plan"),
    "convert": ("profile", "debug_cbor"),
    "import": ("model", "layer_compute"),
    "export": ("plan",),
    "report": ("plan", "profile"),
    "layouts": ("profile", "debug_cbor"),
}


def command_inputs(args: argparse.Namespace) -> list[str]:
    """Every input file a parsed command line names: profiles, plans, settings, layer-compute
    files, YAML targets, the ONNX model, and the source file of a ``capture`` factory."""
    command = getattr(args, "command", None)
    names = _FILE_INPUTS.get(command, ()) if command is not None else ()
    inputs = []
    for name in names:
        value = getattr(args, name, None)
        for item in (value if isinstance(value, list) else [value] if value else []):
            inputs.append(str(item))
            if isinstance(value, list) and "=" in str(item):      # solve's PROFILE=PROPORTION words
                inputs.append(str(item).rpartition("=")[0])
    for word in getattr(args, "tp_profile", None) or []:    # the layout search's T=FILE words
        if "=" in str(word):
            inputs.append(str(word).partition("=")[2])
    if command == "capture":
        inputs += api.capture_inputs(getattr(args, "model", None))
    target = getattr(args, "target", None)
    if isinstance(target, str):
        inputs += [t.strip() for t in target.split(",") if t.strip().lower().endswith((".yaml", ".yml"))]
    return inputs


def command_outputs(args: argparse.Namespace, plot_suffixes: tuple[str, ...]) -> list[tuple[str, str | None,
                                                                                          tuple[str, ...] | None]]:
    """(flag, path, allowed suffixes or None) of every output a parsed command line names."""
    plot = getattr(args, "plot", None)
    return [("--out", getattr(args, "out", None), None), ("--plot", plot, plot_suffixes),
            ("--output", getattr(args, "output", None), None)]


def check_command_files(args: argparse.Namespace, plot_suffixes: tuple[str, ...]) -> None:
    """Every output path checked before any input is read or any file written, against every
    input, the profiles a variants file lists included (``api.check_outputs``)."""
    api.check_outputs(command_outputs(args, plot_suffixes), command_inputs(args))
