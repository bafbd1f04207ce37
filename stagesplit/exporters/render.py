"""The one place where text from a plan becomes generated code, and the check that it did not.

Plans, profiles and ONNX files are untrusted: their layer names, module paths and profile
names reach every export. They enter generated text only through this module:

- comment text through ``comment`` (line breaks, line and paragraph separators, other control
  and format characters and lone surrogates escaped as ``\\n``, ``\\u2028``..., as the text
  tables print them), so a comment always ends where its line ends;
- Python string literals through ``py_str``/``py_literal`` (``repr``), which read back with
  ``ast.literal_eval`` to the very same string;
- shell words through ``shell_word`` (``shlex`` quoting);
- module paths through ``python_path``/``module_fqn``, which accept only dotted Python
  identifiers (keywords, dunder names and non-ASCII digits refused) and decimal indices.

After rendering, ``check_python`` parses a Python export (``ast.parse``), checks that every
line that looks like a comment is one and holds no code, and that Python would read the file
as UTF-8 (no ``coding:`` cookie smuggled into the first two lines); the formats then read
their literal data back from the tree and compare it with the plan. ``check_shell`` splits a
shell/argument export with ``shlex``. Any difference raises ``ExportError`` and nothing is
written.
"""

from __future__ import annotations

import ast
import io
import keyword
import re
import shlex
import tokenize
import unicodedata
from typing import Any

from ..common.text import one_line

__all__ = ["comment", "py_str", "py_literal", "shell_word", "path_tokens", "python_path", "module_fqn",
           "dotted_name", "join_lines", "check_python", "check_shell", "literal_assignments", "expression_path",
           "RenderCheckError"]

_INDEX = re.compile(r"0|[1-9][0-9]*")            # a decimal index as Python writes one (no 03, no ٣)
_SHELL_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_SHELL_DOUBLE_QUOTABLE = re.compile(r"[ -~]+")   # printable ASCII ...
_SHELL_SPECIAL_IN_DOUBLE = set('$`\\"!')         # ... without what double quotes still expand


class RenderCheckError(ValueError):
    """The rendered text does not say what the plan says (raised before anything is written)."""


# -- rendering ---------------------------------------------------------------------------------------

def comment(text: Any) -> str:
    """``text`` made safe for the inside of a ``#`` comment: one line, every control, format
    and separator character and lone surrogate escaped (the escaping the text tables use)."""
    return one_line(str(text))


def py_str(text: str) -> str:
    """A Python string literal for ``text`` (``repr``; double quotes where that needs no escape)."""
    if not isinstance(text, str):
        raise TypeError(f"py_str takes a str, got {type(text).__name__}")
    literal = repr(text)
    if literal[0] == "'" and '"' not in text and "'" not in text:
        literal = '"' + literal[1:-1] + '"'
    return literal


def py_literal(value: Any) -> str:
    """A Python literal for strings, integers, floats, booleans, None and lists, tuples and
    dicts of them: the only values exports write (anything else is a programming error)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return py_str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("py_literal: no literal for a non-finite float")
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(py_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"py_literal: no literal for {type(value).__name__}")


def shell_word(text: str) -> str:
    """``text`` as one shell word: bare when it holds only plain characters, in double quotes
    when nothing in it expands there (the layout ``"Et|t*3|tL"``), else ``shlex.quote``."""
    if _SHELL_PLAIN.fullmatch(text):
        return text
    if _SHELL_DOUBLE_QUOTABLE.fullmatch(text) and not _SHELL_SPECIAL_IN_DOUBLE & set(text):
        return f'"{text}"'
    return shlex.quote(text)


def _is_name(token: str) -> bool:
    return (token.isidentifier() and not keyword.iskeyword(token) and not keyword.issoftkeyword(token)
            and unicodedata.normalize("NFKC", token) == token
            and not (token.startswith("__") and token.endswith("__")))


def path_tokens(path: str) -> list[str | int]:
    """The attribute names and indices of a module path (``transformer.h.3`` -> ``['transformer',
    'h', 3]``; slashed name scopes read as dots). Raises ``ValueError`` saying which token is
    neither a Python identifier (keywords, dunder names and names Python would normalise
    refused) nor a decimal index."""
    if not isinstance(path, str) or not path:
        raise ValueError("expected a dotted module path such as transformer.h.3, got an empty one")
    out: list[str | int] = []
    for token in re.split(r"[./]", path):
        if _INDEX.fullmatch(token):
            out.append(int(token))
        elif _is_name(token):
            out.append(token)
        else:
            raise ValueError(f"'{one_line(token)}' is neither a Python identifier (keywords and __dunder__ names "
                             f"refused) nor a decimal index")
    return out


def python_path(root: str, path: str) -> str:
    """``transformer.h.3`` -> ``model.transformer.h[3]``: a validated module path as a Python
    expression rooted at the (validated) name ``root``."""
    out = dotted_name(root)
    for token in path_tokens(path):
        out += f"[{token}]" if isinstance(token, int) else f".{token}"
    return out


def module_fqn(path: str) -> str:
    """A validated module path as torch's fully qualified name (``bert/encoder/layer3`` ->
    ``bert.encoder.layer3``)."""
    return ".".join(str(t) for t in path_tokens(path))


def dotted_name(name: str) -> str:
    """``name`` if it is a dotted Python name (``model``, ``self.net``); else ``ValueError``."""
    if not isinstance(name, str) or not name or not all(_is_name(t) for t in name.split(".")):
        raise ValueError(f"expected a dotted Python name such as model or self.net (keywords refused), "
                         f"got '{one_line(str(name))}'")
    return name


# -- checking ----------------------------------------------------------------------------------------

_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=]")


def check_python(text: str) -> ast.Module:
    """Parse a rendered Python export and check that it holds no surprise: it encodes as UTF-8,
    Python would read it as UTF-8, it parses, and every line that starts with ``#`` is one
    comment token (no code after a smuggled line break, no comment inside a string)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RenderCheckError(f"the text does not encode as UTF-8 ({exc.reason})") from None
    if "\r" in text or "\0" in text or "\f" in text:
        raise RenderCheckError("the text holds a carriage return, form feed or NUL")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise RenderCheckError(f"Python would read the file as {encoding}")
    if any(_CODING.match(line) for line in text.split("\n")[:2]):
        raise RenderCheckError("a coding declaration in the first two lines")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise RenderCheckError(f"it does not parse: {exc.msg} (line {exc.lineno})") from None
    lines = text.split("\n")
    hash_lines = {i + 1 for i, line in enumerate(lines) if line.lstrip().startswith("#")}
    comment_lines: set[int] = set()
    code_lines: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                if tok.start[1] == len(lines[tok.start[0] - 1]) - len(lines[tok.start[0] - 1].lstrip()):
                    comment_lines.add(tok.start[0])
            elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                  tokenize.ENDMARKER, tokenize.ENCODING):
                code_lines.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise RenderCheckError(f"it does not tokenize: {exc}") from None
    if hash_lines != comment_lines or hash_lines & code_lines:
        line = min((hash_lines ^ comment_lines) | (hash_lines & code_lines))
        raise RenderCheckError(f"line {line} looks like a comment but is not one")
    return tree


def join_lines(lines: list[str]) -> str:
    """The rendered lines as one text; a line holding a line break (which only a bug in the
    escaping could put there) raises ``RenderCheckError``."""
    for line in lines:
        if "\n" in line or "\r" in line or "\0" in line:
            raise RenderCheckError(f"a rendered line holds a line break: {one_line(line)[:80]}")
    return "\n".join(lines) + "\n"


def check_shell(text: str) -> list[str]:
    """The words of a rendered argument file, as ``shlex`` (POSIX, ``#`` comments) splits it."""
    if "\r" in text or "\0" in text:
        raise RenderCheckError("the text holds a carriage return or NUL")
    try:
        return shlex.split(text, comments=True, posix=True)
    except ValueError as exc:
        raise RenderCheckError(f"it does not split into shell words: {exc}") from None


def literal_assignments(tree: ast.Module) -> dict[str, Any]:
    """Module-level ``NAME = <literal>`` assignments, read with ``ast.literal_eval``."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def expression_path(node: ast.expr) -> str:
    """``model.transformer.h[3]`` -> ``model.transformer.h.3``: an attribute/index chain as a
    dotted path; ``RenderCheckError`` for any other expression."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and type(node.slice.value) is int:
            parts.append(str(node.slice.value))
            node = node.value
        elif isinstance(node, ast.Name):
            return ".".join([node.id, *reversed(parts)])
        else:
            raise RenderCheckError(f"unexpected expression {ast.dump(node)[:80]}")
