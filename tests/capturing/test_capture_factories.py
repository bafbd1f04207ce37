"""Issue 34: the factory of ``stagesplit capture`` is user code, and anything it does ends in one
line naming the factory (``factories.py:forward_returns_none: ...``) and what was expected, exit
2, no traceback and no file written: a forward that returns what no loss can be made of (None, a
string), and ``sys.exit()`` at import, in the factory, in the forward or in the loss. Ctrl-C
(KeyboardInterrupt) still interrupts: exit 130, "stagesplit: interrupted"."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")

from stagesplit.cli import main  # noqa: E402

FACTORIES = """
    import sys
    import torch

    class Returns(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.value = value

        def forward(self, x):
            self.lin(x)
            return self.value

    class Exits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            sys.exit(4)

    def forward_returns_none():
        return Returns(None), torch.zeros(1, 2)

    def forward_returns_string():
        return Returns("logits"), torch.zeros(1, 2)

    def forward_returns_dict():
        return Returns({"logits": 1}), torch.zeros(1, 2)

    def factory_exits():
        sys.exit(3)

    def forward_exits():
        return Exits(), torch.zeros(1, 2)

    def loss_exits():
        return Returns(torch.ones(1)), torch.zeros(1, 2), lambda out: sys.exit("no loss today")

    def factory_interrupted():
        raise KeyboardInterrupt
    """

RETURNED = ("; expected a tensor, a loss, a tuple whose first item is one, or an output with .loss or .logits; "
            "or give a loss_fn (the factory's third item) that turns the output into a scalar")


@pytest.fixture
def factories(tmp_path):
    path = tmp_path / "factories.py"
    path.write_text(textwrap.dedent(FACTORIES))
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n\ndef build():\n    pass\n")
    return path


@pytest.mark.parametrize("function, message", [
    ("forward_returns_none", "the model's forward returned None" + RETURNED),
    ("forward_returns_string", "the model's forward returned a str" + RETURNED),
    ("forward_returns_dict", "the model's forward returned a dict" + RETURNED),
    ("factory_exits", "calling the factory raised SystemExit: 3; expected it to return (model, inputs) or "
                      "(model, inputs, loss_fn)"),
    ("forward_exits", "the model's forward raised SystemExit: 4"),
    ("loss_exits", "the loss raised SystemExit: no loss today"),
])
def test_factory_failures_name_the_factory(capsys, factories, function, message):
    spec = f"{factories}:{function}"
    out = factories.parent / "out.stagesplit"
    assert main(["capture", spec, "-o", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and "Traceback" not in captured.err
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"stagesplit: error: {spec}: {message}"), lines[0]
    assert not out.exists()


def test_sys_exit_at_import_is_one_line(capsys, factories):
    spec = f"{factories.parent / 'exits_at_import.py'}:build"
    out = factories.parent / "out.stagesplit"
    assert main(["capture", spec, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"stagesplit: error: {spec}: cannot import {factories.parent / 'exits_at_import.py'}: " \
                  "SystemExit: 3\n"
    assert not out.exists()


def test_ctrl_c_in_the_factory_still_interrupts(capsys, factories):
    out = factories.parent / "out.stagesplit"
    assert main(["capture", f"{factories}:factory_interrupted", "-o", str(out)]) == 130
    assert capsys.readouterr().err == "stagesplit: interrupted\n"
    assert not out.exists()
