"""Reading the YAML settings the package ships (configs/targets.yaml, configs/solver.yaml), and
their parsed twin, configs/parsed.json.

Every solve reads configs/targets.yaml and configs/solver.yaml. Parsing them is cheap, but
importing PyYAML to do it is not (about a tenth of a small per-layer solve's CPU time, issue 31).
So the package also ships each file's parsed document as JSON, with a digest of the YAML bytes it
was parsed from. A reader that finds a twin whose digest matches the bytes it just read takes
the twin's document; any other case (the YAML edited in a checkout, no twin, a twin that cannot
be read) parses the YAML as before. The YAML stays the one source: the twin is rebuilt from it
(``python -m stagesplit.common.shippedyaml configs``), and tests/common/test_shipped_yaml.py fails when
the committed twin is not what that command writes.

A document is twinned only when JSON gives it back unchanged (string keys, no dates, no
non-finite floats); one that JSON would alter is left out and always parsed as YAML.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from ..errors import StagesplitError
from .limits import MAX_CONFIG_BYTES, MAX_YAML_NODES
from .safeinput import _expanded_nodes, _YAMLRefused, check_depth, decode_text, load_yaml, read_input

__all__ = ["TWIN_NAME", "TWINNED", "read_shipped_yaml", "twin_document", "twin_text"]

#: the twin's file name, beside the YAML files it mirrors
TWIN_NAME = "parsed.json"
#: the shipped files that have a twin
TWINNED = ("solver.yaml", "targets.yaml")


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def read_shipped_yaml(path: str | Path, what: str = "YAML file") -> Any:
    """A YAML file the package ships, read on every solve: its twin's document while the twin was
    built from exactly these bytes (then PyYAML is not imported at all). Otherwise composed by
    libyaml's C parser where PyYAML has it (a tenth of the pure-Python parse), held to the same
    limits as ``load_yaml`` (aliases expanded, nesting, each key once) and constructed by the same
    safe constructor, so the document is the one ``read_yaml_file`` gives. Any refusal or error is
    left to ``load_yaml``, whose message names the file and line as always."""
    data = read_input(path, what)
    twinned, document = twin_document(Path(path), data)
    if twinned:
        return document
    import yaml
    text = decode_text(data, path)
    if getattr(yaml, "CSafeLoader", None) is None:
        return load_yaml(text, str(path))

    class Loader(yaml.CSafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                keys = [(k.tag, k.value) for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
                if len(set(keys)) != len(keys):
                    raise _YAMLRefused("each key at most once in a mapping")
            return super().construct_mapping(node, deep)

    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None or _expanded_nodes(node) > MAX_YAML_NODES:
            raise _YAMLRefused("")
        doc = loader.construct_document(node)
        check_depth(doc, str(path))
        return doc
    except (_YAMLRefused, yaml.YAMLError, StagesplitError, RecursionError, ValueError, OverflowError):
        return load_yaml(text, str(path))            # the strict reader refuses it, naming the file and line
    finally:
        loader.dispose()


def twin_document(path: Path, data: bytes) -> tuple[bool, Any]:
    """(True, the twin's document) when the twin beside ``path`` was built from exactly ``data``
    (the bytes just read from ``path``); (False, None) otherwise, and the caller parses the YAML."""
    try:
        with open(path.parent / TWIN_NAME, "rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:          # not a twin this package writes: parse the YAML
            return False, None
        twin = json.loads(text)
        entry = twin["files"][path.name]
        if isinstance(entry, dict) and entry.get("blake2b") == _digest(data) and "document" in entry:
            return True, entry["document"]
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        pass
    return False, None


def _json_keeps(value: Any) -> bool:
    """Whether JSON gives ``value`` back equal and of the same types."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_keeps(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_keeps(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def twin_text(folder: Path) -> str:
    """The twin of the TWINNED files in ``folder`` (each parsed by the strict YAML reader), as
    written to ``folder / TWIN_NAME``."""
    files: dict[str, Any] = {}
    for name in TWINNED:
        path = folder / name
        data = path.read_bytes()
        document = load_yaml(decode_text(data, path), str(path))
        if _json_keeps(document):
            files[name] = {"blake2b": _digest(data), "document": document}
    doc = {"about": "generated from the YAML files beside it by `python -m stagesplit.common.shippedyaml configs`; "
                    "read in their place only while each file's blake2b digest matches",
           "files": files}
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Rebuild the twin of the configs folder named on the command line (a checkout's ``configs``)."""
    import sys

    from .fileio import atomic_write_text
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        raise SystemExit("usage: python -m stagesplit.common.shippedyaml CONFIGS_FOLDER")
    folder = Path(args[0])
    atomic_write_text(folder / TWIN_NAME, twin_text(folder))
    print(f"wrote {folder / TWIN_NAME}")


if __name__ == "__main__":
    main()
