"""Device targets and per-layer compute files, read from YAML (always with a safe loader)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..common.layerfigures import LayerFigure, figure_total, read_layer_figure
from ..common.limits import MAX_BYTES, MAX_COMPUTE, MAX_TILES
from ..common.safeinput import read_yaml_file
from ..common.shippedyaml import read_shipped_yaml
from ..common.text import show
from ..errors import ProfileError, StagesplitError
from .profile import Target

__all__ = ["config_dir", "exact_fields", "file_field", "known_targets", "load_layer_compute", "load_target",
           "read_yaml", "shipped_targets_document", "target_from_mapping",
           "target_record", "yaml_number"]

INT64_MAX = 2**63 - 1
MAX_FINITE = 1e300      # clock rates, bandwidths and FLOP rates: finite, with room for arithmetic


def config_dir() -> Path:
    """The shipped ``configs`` folder: the source checkout's when running from one (so edits
    take effect in an editable install), else the copy installed inside the package."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs" / "targets.yaml").is_file():
        return checkout / "configs"
    from importlib import resources  # an installed package's (it brings tempfile: 3 ms)
    return Path(str(resources.files("stagesplit") / "configs"))


# YAML 1.1 (PyYAML) reads exponent numbers without a dot or sign (``1e9``, ``1.5e14``) as
# strings; YAML 1.2 reads them as floats. Numeric fields accept them.
_EXPONENT_NUMBER = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


def read_yaml(path: Path, what: str = "YAML file") -> Any:
    """Parse a YAML (or JSON) file safely: opened once, at most MAX_CONFIG_BYTES, no deep
    nesting, alias bombs or duplicate keys (see stagesplit/safeinput.py)."""
    return read_yaml_file(path, what)


#: the shipped targets file as last parsed, with the (size, modification time) it had: a solve
#: reads it for the profile's device and again for its runtime figures; parsing YAML in pure
#: Python once per process is enough while the file is unchanged
_SHIPPED: dict[Path, tuple[tuple[int, int], Any]] = {}


def shipped_targets_document() -> tuple[Path, Any]:
    """configs/targets.yaml (its path, its parsed document), parsed again only when it changed.
    The document is shared: callers read it and build their own records from it."""
    path = config_dir() / "targets.yaml"
    try:
        st = path.stat()
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        return path, read_yaml(path)                 # read_yaml says why it cannot be read
    cached = _SHIPPED.get(path)
    if cached is None or cached[0] != stamp:
        cached = _SHIPPED[path] = (stamp, read_shipped_yaml(path))
    return path, cached[1]


def yaml_number(value: Any) -> Any:
    """``value``, or the float a YAML 1.1 exponent string (``1e9``) stands for."""
    if isinstance(value, str) and _EXPONENT_NUMBER.match(value):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            pass
    return value


def _number(path, field_path, value, *, integer=False, minimum=None, optional=False, maximum=None):
    """A finite number (an integer with ``integer``) in [minimum, maximum]."""
    if value is None and optional:
        return None
    value = yaml_number(value)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if ok and not isinstance(value, bool) and isinstance(value, float) and not math.isfinite(value):
        ok = False
    top = maximum if maximum is not None else INT64_MAX if integer else MAX_FINITE
    if isinstance(value, bool) or not ok or (minimum is not None and value < minimum) or value > top:
        text = "an integer" if integer else "a number"
        if minimum is not None:
            text += f" >= {minimum}"
        if maximum is not None or (ok and value > top):
            text += f" and <= {top:,}" if integer else f" and <= {top:g}"
        if isinstance(value, float) and not math.isfinite(value):
            text += " (finite: not inf or nan)"
        raise ProfileError(path, field_path, text, value)
    return value


def exact_fields(spec: Any, fields: tuple[str, ...], path: Path | str | None, prefix: str) -> dict:
    """``spec`` read strictly as a mapping with exactly ``fields``: one line naming the first that is
    unknown or missing (a target file's ``node`` and ``runtime`` fields are read so)."""
    if not isinstance(spec, dict):
        raise ProfileError(path, prefix, "a mapping with " + ", ".join(fields), spec)
    for key in spec:
        if key not in fields:
            raise ProfileError(path, f"{prefix}.{key}", "one of " + ", ".join(fields), key)
    for key in fields:
        if key not in spec:
            raise ProfileError(path, f"{prefix}.{key}", "a value (the field is missing)", None)
    return spec


def file_field(name_or_path: str, key: str) -> tuple[Path, Any] | None:
    """A YAML target file's ``key`` field (its path and value), for the readers of a target's other
    mappings (node, runtime); None where ``name_or_path`` names no such file or the file no such field."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return None
    data = read_yaml(path)
    if isinstance(data, dict) and key in data:
        return path, data[key]
    return None


def target_from_mapping(name: str, spec: Any, path: Path | str | None, prefix: str = "") -> Target:
    """Build a Target from a YAML/JSON mapping, naming the file and field on bad input."""
    def at(key: str) -> str:      # field paths inside the file ("" prefix: the file is the target)
        return f"{prefix}.{key}" if prefix else key

    if not isinstance(spec, dict):
        raise ProfileError(path, prefix, "a mapping with tiles and bytes_per_tile", spec)
    known = {"name", "kind", "description", "tiles", "bytes_per_tile", "clock_hz", "link_bytes_per_s", "flops_per_s",
             "memory_bytes_per_s", "node", "runtime"}    # node: io/topology.py; runtime: io/runtimefigures.py
    for key in spec:
        if key not in known:
            raise ProfileError(path, at(str(key)), "one of " + ", ".join(sorted(known)), key)
    kind = spec.get("kind", "ipu")
    if not isinstance(kind, str):
        raise ProfileError(path, at("kind"), "a string", kind)
    return Target(
        name=str(spec.get("name", name)),
        kind=kind,
        description=str(spec.get("description", "")),
        tiles=_number(path, at("tiles"), spec.get("tiles"), integer=True, minimum=1, maximum=MAX_TILES),
        bytes_per_tile=_number(path, at("bytes_per_tile"), spec.get("bytes_per_tile"), integer=True, minimum=1,
                               maximum=MAX_BYTES),
        clock_hz=_number(path, at("clock_hz"), spec.get("clock_hz"), minimum=0, optional=True),
        link_bytes_per_s=_number(path, at("link_bytes_per_s"), spec.get("link_bytes_per_s"), minimum=0, optional=True),
        flops_per_s=_number(path, at("flops_per_s"), spec.get("flops_per_s"), minimum=0, optional=True),
        memory_bytes_per_s=_number(path, at("memory_bytes_per_s"), spec.get("memory_bytes_per_s"), minimum=0,
                                   optional=True),
    )


def known_targets() -> dict[str, Target]:
    """The shipped device targets by name (configs/targets.yaml)."""
    path, data = shipped_targets_document()
    if not isinstance(data, dict) or not isinstance(data.get("targets"), dict):
        raise ProfileError(path, "targets", "a mapping of target names to targets")
    return {name: target_from_mapping(name, spec, path, f"targets.{name}") for name, spec in data["targets"].items()}


def load_target(name_or_path: str) -> Target:
    """A shipped target by name (``ipu-mk2``), or a YAML file holding one target."""
    targets = known_targets()
    if name_or_path in targets:
        return targets[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        data = read_yaml(path)
        return target_from_mapping(path.stem, data, path, "")
    raise StagesplitError(f"unknown target '{name_or_path}': expected one of {', '.join(targets)} "
                          "or the path of a YAML target file")


def target_record(t: Target) -> dict[str, Any]:
    """A target as plain JSON values (``target_from_mapping`` reads it back)."""
    return {"name": t.name, "kind": t.kind, "description": t.description, "tiles": t.tiles,
            "bytes_per_tile": t.bytes_per_tile, "clock_hz": t.clock_hz, "link_bytes_per_s": t.link_bytes_per_s,
            "flops_per_s": t.flops_per_s, "memory_bytes_per_s": t.memory_bytes_per_s}


def load_layer_compute(path: str | Path) -> dict[str, LayerFigure]:
    """A YAML or JSON mapping of layer name to compute (in the profile's compute unit): each a number,
    or a mapping of its ``forward``, ``backward`` and ``optimizer`` parts (common/layerfigures.py)."""
    file = Path(path)
    data = read_yaml(file)
    if not isinstance(data, dict) or not data:
        raise ProfileError(file, "", "a mapping of layer names to compute figures", type(data).__name__)
    out: dict[str, LayerFigure] = {}

    def check(field: str, value: Any) -> float:
        return float(_number(file, field, value, minimum=0, maximum=MAX_COMPUTE))

    def refuse(field: str, expected: str, got: Any) -> None:
        raise ProfileError(file, field, expected, got)
    for name, value in data.items():
        out[str(name)] = read_layer_figure(value, show(name), check, refuse)
    total = sum(figure_total(v) for v in out.values())
    if total > MAX_COMPUTE:
        raise ProfileError(file, "", f"compute figures summing to at most {MAX_COMPUTE:g}", total)
    return out
