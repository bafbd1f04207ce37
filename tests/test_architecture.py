"""The package's shape: modules import only from their own or earlier stages of the data flow
(common -> io -> layers -> capturing -> model -> solver -> plan -> exporters -> reporting -> api
-> cli), there are no import circles (deferred and type-checking imports count: they hide a
circle, they do not remove it), and every public module says what it exports (``__all__``).
The graph is read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stagesplit"

#: stage of each top-level part of the package, in the order data flows through them
STAGES = {"errors": 0, "common": 0, "io": 1, "layers": 2, "capturing": 3, "model": 4, "solver": 5, "plan": 6,
          "exporters": 7, "reporting": 8, "api": 9, "cli": 10}
FRONT_DOOR = {"stagesplit", "stagesplit.__main__"}          # may import anything


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            while target and target not in modules:          # a name imported from a module: that module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                break
    return found


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.get(parts[1]) if len(parts) > 1 else None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_has_a_stage(graph):
    assert sorted(m for m in graph if m not in FRONT_DOOR and _stage(m) is None) == []


def test_no_module_imports_a_later_stage(graph):
    backwards = []
    for module, imported in graph.items():
        if module in FRONT_DOOR:
            continue
        for other in imported:
            if other in FRONT_DOOR or _stage(other) > _stage(module):
                backwards.append(f"{module} -> {other}")
    assert sorted(backwards) == []


def test_no_import_circles(graph):
    # Tarjan's strongly connected components: any component of two or more modules is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_checker_sees_deferred_and_type_checking_imports(tmp_path):
    """The check itself: an import inside a function or under TYPE_CHECKING is an edge."""
    a = tmp_path / "a.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\n"
                 "def f():\n    from .c import y\n")
    modules = {"p.a": a, "p.b": a, "p.c": a}
    assert _imports("p.a", a, modules) == {"p.b", "p.c"}


def test_every_public_module_declares_all():
    missing = []
    for name, path in _modules().items():
        if any(part.startswith("_") for part in name.split(".")[1:]) or name in FRONT_DOOR:
            continue
        tree = ast.parse(path.read_text())
        if path.name == "__init__.py" and all(isinstance(node, ast.Expr) for node in tree.body):
            continue                                          # a package that only describes itself
        if not any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
                   for node in tree.body):
            missing.append(name)
    assert sorted(missing) == []


# -- the front door (issue #31) -------------------------------------------------------------------------

def test_the_command_line_imports_only_the_api_errors_reporting_and_itself(graph):
    """The CLI parses, calls the API and hands what comes back to reporting/: it reaches nothing
    else of the package (what it needs is behind the API)."""
    allowed = ("stagesplit.api", "stagesplit.errors")
    reaching = [f"{module} -> {other}" for module, imported in graph.items() if module.startswith("stagesplit.cli")
                for other in imported
                if other not in allowed and not other.startswith(("stagesplit.reporting", "stagesplit.cli"))]
    assert sorted(reaching) == []


def _command_line_flags() -> set[str]:
    """Every flag of stagesplit's command line, from the parser itself."""
    from stagesplit.cli.parser import build_parser
    flags: set[str] = set()
    parsers = [build_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            flags.update(o for o in action.option_strings if o.startswith("--"))
            if isinstance(action.choices, dict):                 # the subcommands
                parsers += [p for p in action.choices.values() if hasattr(p, "_actions")]
    return flags - {"--help", "--version", "--debug"}


def _subcommands() -> set[str]:
    from stagesplit.cli.parser import build_parser
    return {name for a in build_parser()._actions if isinstance(a.choices, dict) for name in a.choices}


def _literals(tree: ast.AST):
    """Every string literal of a module as the text it holds: an f-string is read whole, its
    values as ``{}`` (so ``f"stagesplit solve {path} --devices N"`` is one text); the option
    strings of an ``add_argument`` call are left out (see ``_flag_texts``)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inside.update(id(v) for v in node.values)
            yield "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                          for v in node.values)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            inside.update(id(a) for a in node.args)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
            yield node.value


def _flag_checker():
    """(whether a module's literal names one of stagesplit's flags, the literals of a module)."""
    import re
    flags = sorted(_command_line_flags(), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(f) for f in flags) + r")(?![\w-]|\.\w)")
    shown = re.compile(r"stagesplit (?:" + "|".join(sorted(_subcommands())) + r")\b[^;()<>]*")

    def names_a_flag(module: str, text: str) -> bool:
        if module.startswith("stagesplit.exporters") and text.startswith("# "):
            return False
        return bool(pattern.search(shown.sub("", text)))
    return names_a_flag


def _flag_texts() -> dict[str, list[str]]:
    """Per module outside cli/, the string literals that name one of stagesplit's own flags.

    The library names its parameters (``OptionError(parameter)``; `time_limit` in backquotes in
    other text a user reads) and cli/naming.py turns them into flags. What is not stagesplit's
    flag, by these rules and no others:

    - another program's flags: a flag followed by ``.name`` is a dotted option path (torchtitan's
      ``--training.local_batch_size`` is not stagesplit's ``--training``); the option strings of an
      ``add_argument`` call are a command line of its own (io/pva_export.py runs alone in the
      Poplar SDK); in exporters/, a literal that starts ``# `` is a comment line written into the
      exported file, in the framework's words (torchtitan's ``--module ... --config ...``);
    - a stagesplit command line shown whole, from ``stagesplit COMMAND`` to the end of its clause
      (``;``, a bracket or a tag): the line a user types (``make a plan from it with stagesplit
      solve PROFILE --devices N --out plan.json``) or an export's provenance (``stagesplit export
      --to megatron``), in the command line's words on purpose.
    """
    names_a_flag = _flag_checker()
    found: dict[str, list[str]] = {}
    for name, path in _modules().items():
        if name.startswith("stagesplit.cli"):
            continue
        texts = [t for t in _literals(ast.parse(path.read_text())) if names_a_flag(name, t)]
        if texts:
            found[name] = texts
    return found


def test_no_flag_text_outside_the_command_line():
    """The library raises ``OptionError(parameter)`` and writes `parameter` in backquotes where a
    message tells the user what to change; only cli/ knows the flags (issue #31)."""
    assert _flag_texts() == {}


def test_the_flag_rules_catch_a_library_flag_and_nothing_else():
    """The checker itself: a flag the library names is caught in a docstring, a plain string and
    an f-string; another program's flags and a shown command line are not."""
    names_a_flag = _flag_checker()
    source = ('"""Use --devices."""\nx = f"allow more with --time-limit ({n} s)"\ny = "give --exact"\n'
              'z = "--training.local_batch_size"\nw = f"stagesplit solve {p} --devices N --out plan.json"\n'
              'p.add_argument("--output")\nc = "# after --module ... --config ..."\n')
    texts = list(_literals(ast.parse(source)))
    assert sorted(t for t in texts if names_a_flag("stagesplit.plan.engine", t)) == [
        "# after --module ... --config ...", "Use --devices.", "allow more with --time-limit ({} s)", "give --exact"]
    assert sorted(t for t in texts if names_a_flag("stagesplit.exporters.torchtitan", t)) == [
        "Use --devices.", "allow more with --time-limit ({} s)", "give --exact"]


def test_the_option_declarations_name_no_flag():
    """solver/options.py writes a flag as {flag:NAME}; the command line turns it into --NAME."""
    assert "stagesplit.solver.options" not in _flag_texts()


def test_each_solve_option_is_declared_once():
    """Each solve option's default, help and names are declared in solver/options.py only: the
    request's fields, the parser's solver options, the settings-file keys and the shipped
    configs/solver.yaml all follow the declarations."""
    import dataclasses
    from enum import Enum

    import yaml

    from stagesplit.cli.parser import FLAGS, build_parser, flag_text
    from stagesplit.solver.options import SCHEDULE_NAMES, SETTINGS_KEYS, SOLVE_OPTIONS, option_named
    from stagesplit.solver.request import SETTINGS_FIELDS, Schedule, SolveRequest

    declared = {o.name for o in SOLVE_OPTIONS}
    assert len(declared) == len(SOLVE_OPTIONS)
    fields = {f.name: f for f in dataclasses.fields(SolveRequest)}
    assert set(fields) - {"origins", "layering"} == declared
    for name, f in fields.items():
        if name in declared:
            o = option_named(name)
            assert f.metadata["option"] is o
            default = f.default.value if isinstance(f.default, Enum) else f.default
            assert name == "devices" or default == o.default, name
    assert sorted(s.value for s in Schedule) == sorted(SCHEDULE_NAMES)
    # the parser: every declared flag, with its declared help; none written by hand in parser.py
    solve = next(a for a in build_parser()._actions if isinstance(a.choices, dict)).choices["solve"]
    helps = {s: a.help for a in solve._actions for s in a.option_strings}
    for o in SOLVE_OPTIONS:
        if o.flag:
            assert helps["--" + o.flag] == flag_text(o.help_text), o.name
            assert FLAGS[o.name] == "--" + o.flag
    source = ast.parse((PACKAGE / "cli" / "parser.py").read_text())
    by_hand = [node.args[0].value for node in ast.walk(source)
               if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args
               and isinstance(node.args[0], ast.Constant)
               and node.args[0].value in {"--" + o.flag for o in SOLVE_OPTIONS if o.flag}]
    # sweep's --devices takes a range of counts; breakdown, synth, import and capture have a --target
    # of their own (one target, their own default and help)
    assert sorted(set(by_hand)) == ["--devices", "--target"]
    assert by_hand.count("--devices") == 1
    # the settings file: its keys are the declared ones, and the shipped file's values the defaults
    assert set(SETTINGS_FIELDS) == set(SETTINGS_KEYS) | {"exact"}
    shipped = yaml.safe_load((PACKAGE.parent / "configs" / "solver.yaml").read_text())
    settings = {o.settings: o for o in SOLVE_OPTIONS if o.settings}
    for key, value in shipped.items():
        o = settings[key]
        assert (value == "exact") == o.default if key == "stages" else value == o.default, key


def test_the_default_chunks_per_device_is_decided_once():
    """Only ``SolveRequest.resolved_chunks`` turns a request's schedule into its default chunks per
    device (solver/schedule_generation.py's ``build_schedule`` keeps its own default for callers that give no
    request: it is being split by other work, and every solve passes the resolved count)."""
    deciding = [name for name, path in _modules().items() if "fixed_chunks_per_rank or" in path.read_text()
                and name not in ("stagesplit.solver.request", "stagesplit.solver.schedule_generation")]
    assert deciding == []


def _requests_built(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "SolveRequest"]


def test_options_are_resolved_forwards_only():
    """A request becomes resolved options (plan/engine.py's ``resolve``); nothing in the package
    turns options back into a request. A ``SolveRequest`` is built only from what a user gave: the
    API's keyword arguments (api.py) and a layout search's combination (plan/layouts.py); tools and
    tests that start from options in layer indices use tests/indexed_inputs.py."""
    building = {name for name, path in _modules().items() if _requests_built(ast.parse(path.read_text()))}
    assert building == {"stagesplit.api", "stagesplit.plan.layouts"}
    # and neither reads a SolveOptions to build one (the rule above would miss a backward
    # conversion added to either)
    for name in building:
        for call in _requests_built(ast.parse(_modules()[name].read_text())):
            read = {n.value.id for n in ast.walk(call) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
            assert not read & {"options", "opts", "solve_options"}, (name, call.lineno, read)


def test_building_the_parser_loads_nothing_heavy():
    """``stagesplit --help`` (and every command's start) builds the parser: it must not load numpy
    (through the layer options or the exporters) nor read the installed packages' metadata."""
    import os
    import subprocess
    import sys
    code = ("import sys; from stagesplit.cli.parser import build_parser; build_parser(); "
            "print(sorted(m for m in ('numpy', 'importlib.metadata', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert out.stdout.strip() == "[]"


def test_a_json_profiles_solve_loads_only_what_it_uses(tmp_path):
    """Issue #31's per-layer solve: the baselines are loaded only for ``compare``, and the shipped
    targets file is parsed once though the device and its runtime figures both read it."""
    import os
    import subprocess
    import sys
    # every parse counted: the strict reader's, and the shipped files' (read_shipped_yaml, C-parsed)
    code = ("import sys, stagesplit.common.safeinput as s; n = []; f = s.load_yaml\n"
            "def count(text, name=''):\n    n.append(name); return f(text, name)\n"
            "s.load_yaml = count\n"
            "import stagesplit.common.shippedyaml as y; g = y.read_shipped_yaml\n"
            "def shipped(path, what='YAML file'):\n    n.append(str(path)); return g(path, what)\n"
            "y.read_shipped_yaml = shipped\n"
            "from stagesplit import api\n"
            "api.solve('profiles/llama-7b-layers.json', 4, schedule='1f1b', micro_batches=8)\n"
            "print(sorted(m for m in ('stagesplit.plan.comparison',) "
            "if m in sys.modules), sum(name.endswith('targets.yaml') for name in n))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert out.stdout.split() == ["[]", "1"]
