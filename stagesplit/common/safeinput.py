"""Reading untrusted input safely: one open per file, size caps for pipes and devices, JSON
and YAML parsing with nesting, alias and number checks, and bounded text for messages.

Every limit is a module constant here so the README, the readers and the tests agree on it.
A hostile file must end in a one-line ``ProfileError``/``StagesplitError``, never a hang, a
traceback or an allocation sized by the file's own claims.
"""

from __future__ import annotations

import json
import math
import os
import select
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ProfileError, StagesplitError
from .limits import FIFO_WAIT_S, MAX_CONFIG_BYTES, MAX_DEPTH, MAX_STREAM_BYTES, MAX_YAML_ALIASES, MAX_YAML_NODES
from .text import one_line, short_repr, show

__all__ = ["InputFile", "check_depth", "confined_path", "decode_text", "field_path", "load_json", "load_yaml",
           "read_document", "read_input", "read_yaml_file"]

_CHUNK = 1 << 20


# -- reading files once ---------------------------------------------------------------------------------

def _describe(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


class InputFile:
    """One open of an input file. Regular files report their size; pipes, FIFOs and devices
    are read in chunks up to a cap. ``head`` and ``read_all`` share the single handle, so
    sniffing the format never reopens (reopening a FIFO waits forever for a new writer)."""

    def __init__(self, path: str | Path, what: str = "file"):
        self.path = Path(path)
        self.what = what
        self._buffer = b""
        self._eof = False
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise StagesplitError(f"{show(self.path)}: cannot read: {exc.strerror or exc}") from None
        if stat.S_ISDIR(st.st_mode):
            raise StagesplitError(f"{show(self.path)}: is a folder, expected a {what}")
        self.regular = stat.S_ISREG(st.st_mode)
        self.kind = "a regular file" if self.regular else _describe(st.st_mode)
        self.size = st.st_size if self.regular else None
        fifo = stat.S_ISFIFO(st.st_mode)
        try:
            # a FIFO is opened without blocking, then waited on with a time limit (below)
            self.fd = os.open(self.path, os.O_RDONLY | (os.O_NONBLOCK if fifo else 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StagesplitError(f"{show(self.path)}: cannot read: {exc.strerror or exc}") from None
        self.fifo = fifo
        self._started = False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> InputFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read_chunk(self) -> bytes:
        if not self.fifo:
            try:
                return os.read(self.fd, _CHUNK)
            except OSError as exc:
                raise StagesplitError(f"{show(self.path)}: cannot read: {exc.strerror or exc}") from None
        deadline = None if self._started else time.monotonic() + FIFO_WAIT_S
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                raise StagesplitError(f"{show(self.path)}: is a FIFO and nothing was written to it within "
                                      f"{FIFO_WAIT_S:g} s")
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise StagesplitError(f"{show(self.path)}: cannot read: {exc.strerror or exc}") from None
            if chunk:
                self._started = True
                return chunk
            if self._started:
                return b""                  # the writer closed: end of data
            # no writer has opened the FIFO yet: select reports it readable at EOF, so wait a bit
            assert deadline is not None             # not started on entry (a started read returned above)
            if time.monotonic() >= deadline:
                raise StagesplitError(f"{show(self.path)}: is a FIFO and nothing was written to it within "
                                      f"{FIFO_WAIT_S:g} s")
            time.sleep(0.02)

    def head(self, n: int) -> bytes:
        """The first ``n`` bytes (fewer at end of file), kept for ``read_all``."""
        while len(self._buffer) < n and not self._eof:
            chunk = self._read_chunk()
            if not chunk:
                self._eof = True
            self._buffer += chunk
        return self._buffer[:n]

    def read_all(self, limit: int | None) -> bytes:
        """Everything, refusing more than ``limit`` bytes (None: no limit for a regular file,
        MAX_STREAM_BYTES for anything else)."""
        if limit is None and not self.regular:
            limit = MAX_STREAM_BYTES
        if self.regular and limit is not None and self.size is not None and self.size > limit:
            raise StagesplitError(f"{show(self.path)}: {self.size:,} bytes is larger than the {limit:,} bytes "
                                  f"accepted for a {self.what}")
        parts = [self._buffer]
        total = len(self._buffer)
        while not self._eof:
            chunk = self._read_chunk()
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
            if limit is not None and total > limit:
                raise StagesplitError(f"{show(self.path)}: more than {limit:,} bytes read from {self.kind}; a "
                                      f"{self.what} is at most {limit:,} bytes")
        self._eof = True
        self._buffer = b"".join(parts)
        return self._buffer


def read_input(path: str | Path, what: str = "file", limit: int | None = MAX_CONFIG_BYTES) -> bytes:
    """All bytes of ``path``, opened once, refusing more than ``limit`` bytes."""
    with InputFile(path, what) as f:
        return f.read_all(limit)


def decode_text(data: bytes, path: str | Path, what: str = "UTF-8 text") -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProfileError(path, f"byte {exc.start}", f"{what} (the file is not valid UTF-8)") from None


# -- JSON ----------------------------------------------------------------------------------------------

class _Refused:
    """Stands in the parsed document for a value strict JSON refuses (NaN, an overflowing
    number, a duplicate key), so that the refusal can name the field path where it stands."""

    __slots__ = ("expected", "got")

    def __init__(self, expected: str, got: str | None = None):
        self.expected = expected
        self.got = got


def _strict_hooks() -> tuple[dict, list]:
    """json.loads hooks that put a _Refused marker where a value is refused, and the list of
    markers made (empty for a valid document: then nothing needs walking)."""
    refused: list[_Refused] = []

    def mark(expected: str, got: str | None) -> _Refused:
        marker = _Refused(expected, got)
        refused.append(marker)
        return marker

    def constant(name: str) -> Any:
        return mark("a finite JSON number (NaN, Infinity and -Infinity are not JSON)", name)

    def finite_float(text: str) -> Any:
        value = float(text)
        if not math.isfinite(value):
            return mark("a finite number (this one overflows a 64-bit float)", text[:40])
        return value

    def big_int(text: str) -> Any:
        if len(text.lstrip("-")) > 40:      # int() of a huge digit string is slow; no field needs one
            return mark("a number of at most 40 digits", text[:20] + "...")
        return int(text)

    def pairs(items: list[tuple[str, Any]]) -> dict:
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    out[key] = mark("each key at most once in an object", f"duplicate key {short_repr(key)}")
                    break
                seen.add(key)
        return out

    hooks = dict(parse_constant=constant, parse_float=finite_float, parse_int=big_int, object_pairs_hook=pairs)
    return hooks, refused


def field_path(parts: list[str | int]) -> str:
    """``["variables", 0, "bytes"]`` -> ``variables[0].bytes``: how messages name a field."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _find_refused(doc: Any) -> tuple[str, _Refused] | None:
    """The path of the first _Refused marker in document order (walked without recursion)."""
    stack: list[tuple[Any, list[str | int]]] = [(doc, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, _Refused):
            return field_path(path) or "document", value
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            continue
        for key, child in reversed(items):          # reversed: the first child is popped first
            if isinstance(child, (dict, list, _Refused)):
                stack.append((child, path + [key]))
    return None


def check_depth(doc: Any, source: str | Path | None, limit: int = MAX_DEPTH) -> None:
    """Refuse a document nested deeper than ``limit`` (walked without recursion)."""
    stack = [(doc, 1)]
    seen: set[int] = set()
    while stack:
        value, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            raise ProfileError(source, "document", f"lists and objects nested at most {limit} deep")
        if id(value) in seen:               # YAML aliases share objects: visit each once
            continue
        seen.add(id(value))
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


def load_json(text: str, source: str | Path | None) -> Any:
    """Parse JSON strictly: no NaN/Infinity, no numbers that overflow, no duplicate keys, no
    nesting deeper than MAX_DEPTH. A syntax error names the line and column; a refused value
    names its field path (``variables[0].bytes``)."""
    hooks, refused = _strict_hooks()
    try:
        doc = json.loads(text, **hooks)
    except json.JSONDecodeError as exc:
        raise ProfileError(source, f"line {exc.lineno} column {exc.colno}", "valid JSON", exc.msg) from None
    except RecursionError:
        raise ProfileError(source, "document", f"lists and objects nested at most {MAX_DEPTH} deep") from None
    check_depth(doc, source)
    if refused:
        found = _find_refused(doc)
        where, marker = found if found is not None else ("document", refused[0])
        raise ProfileError(source, where, marker.expected, marker.got)
    return doc


# -- YAML ----------------------------------------------------------------------------------------------

def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that refuses deep nesting, too many aliases, duplicate keys and
        documents whose aliases expand past MAX_YAML_NODES nodes."""

        depth = 0
        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise _YAMLRefused(f"at most {MAX_YAML_ALIASES} aliases (*name) in a document",
                                       self.peek_event().start_mark)
                return super().compose_node(parent, index)
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _YAMLRefused(f"lists and mappings nested at most {MAX_DEPTH} deep", self.peek_event().start_mark)
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if isinstance(key_node, yaml.ScalarNode):
                        key = (key_node.tag, key_node.value)
                        if key in seen:
                            raise _YAMLRefused(f"each key at most once in a mapping (duplicate "
                                               f"{short_repr(key_node.value)})", key_node.start_mark)
                        seen.add(key)
            return super().construct_mapping(node, deep)

    return Loader


class _YAMLRefused(Exception):
    def __init__(self, expected: str, mark: Any = None):
        super().__init__(expected)
        self.expected = expected
        self.mark = mark


def _expanded_nodes(root: Any) -> int:
    """Nodes of the composed YAML graph with every alias expanded, counted without expanding
    (each shared node's size is computed once)."""
    import yaml
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [x for pair in node.value for x in pair]
        else:
            sizes[id(node)] = 1
            continue
        if done:
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), MAX_YAML_NODES + 1)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def load_yaml(text: str, source: str | Path | None) -> Any:
    """``yaml.safe_load`` with the limits above; errors name the file and line."""
    import yaml
    loader = None
    try:
        loader = _yaml_loader()(text)       # the reader checks characters here already
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_nodes(node) > MAX_YAML_NODES:
            raise _YAMLRefused(f"at most {MAX_YAML_NODES:,} values once aliases are expanded")
        return loader.construct_document(node)
    except _YAMLRefused as exc:
        where = f"line {exc.mark.line + 1}" if exc.mark is not None else "document"
        raise ProfileError(source, where, exc.expected) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "document"
        raise ProfileError(source, where, "valid YAML", getattr(exc, "problem", None) or str(exc)) from None
    except RecursionError:
        raise ProfileError(source, "document", f"lists and mappings nested at most {MAX_DEPTH} deep") from None
    except (ValueError, OverflowError) as exc:   # e.g. an integer of more digits than Python converts
        raise ProfileError(source, "document", "valid YAML", one_line(str(exc))[:80]) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml_file(path: str | Path, what: str = "YAML file") -> Any:
    """Read (once, capped at MAX_CONFIG_BYTES) and parse a YAML (or JSON) file."""
    data = read_input(path, what)
    return load_yaml(decode_text(data, path), str(path))


def read_document(path: str | Path, what: str = "file") -> Any:
    """A small JSON or YAML document (by suffix: .yaml/.yml are YAML), read once and capped at
    MAX_CONFIG_BYTES, parsed with the limits above."""
    data = read_input(path, what)
    text = decode_text(data, path)
    if Path(path).suffix.lower() in (".yaml", ".yml"):
        return load_yaml(text, str(path))
    return load_json(text, str(path))


# -- paths a file names ---------------------------------------------------------------------------------

def confined_path(location: Any, folder: str | Path, source: str | Path, field: str, what: str,
                  *, within: str, absolute: bool = False, also: tuple[tuple[str | Path, str], ...] = ()) -> str:
    """A path that the file ``source`` names in ``field`` (an ONNX model's external data, a variants
    file's profiles, a plan's recorded profile), checked before anything opens it: joined to
    ``folder`` (the folder of the file that names it), it must stay inside ``folder`` (described
    as ``within``, e.g. "the model's folder") or one of ``also`` ((folder, description) pairs)
    once ``..`` and symbolic links are resolved, as ONNX's own checker requires of external data.
    Without ``absolute`` the path must be relative and hold no ``..`` at all; with it, an
    absolute path inside the folders is accepted too. Anything else raises a one-line
    ``ProfileError`` naming ``source``, ``field`` and what was expected. Returns the path joined
    to ``folder`` (links kept, as the user wrote it)."""
    folder = Path(folder) if str(folder) else Path(".")
    roots: list[tuple[Path, str]] = []
    for root, words in [(folder, within), *((Path(f) if str(f) else Path("."), words) for f, words in also)]:
        if all(os.path.realpath(root) != os.path.realpath(r) for r, _ in roots):     # one folder named once
            roots.append((root, words))
    inside = " or ".join(f"{words} ('{one_line(str(root))}')" for root, words in roots)
    expected = f"a {'' if absolute else 'relative '}path to {what} inside {inside}"
    if not isinstance(location, str):
        raise ProfileError(source, field, expected, location)
    parts = location.replace("\\", "/").split("/")
    rooted = os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":")
    if not location or "\0" in location or (not absolute and (rooted or ".." in parts)):
        raise ProfileError(source, field, expected, location)
    joined = str(folder / location)
    target = os.path.realpath(joined)
    for root, _ in roots:
        base = os.path.realpath(root)
        if os.path.commonpath([base, target]) == base:
            return joined
    raise ProfileError(source, field, f"{expected}, got '{one_line(location)}', which leads outside "
                       f"{'it' if len(roots) == 1 else 'them'}")
