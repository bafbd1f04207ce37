"""cli/naming.py: the library's backquoted parameters become the command line's flags, and
nothing else changes (issue #31: no flag text outside cli/)."""

from __future__ import annotations

from stagesplit.cli.naming import error_text, flags_in
from stagesplit.errors import OptionError, StagesplitError
from stagesplit.reporting.table import Column, Table, render


def test_each_form_becomes_its_flag():
    assert flags_in("allow more with `time_limit`") == "allow more with --time-limit"
    assert flags_in("use `devices=34` or fewer, or drop `exact`") == "use --devices 34 or fewer, or drop --exact"
    assert flags_in("(`schedule='auto'`)") == "(--schedule auto)"
    assert flags_in("capture with `dtype='bfloat16'`") == "capture with --dtype bfloat16"
    assert flags_in("(`sequence_parallel`)") == "(--sp)"                       # a flag not spelled as its name


def test_other_backquotes_are_left_as_they_are():
    assert flags_in("an entry of `layerz` and ``devices`` and `a b`") == "an entry of `layerz` and ``devices`` and `a b`"
    assert flags_in("no quotes at all") == "no quotes at all"


def test_errors_name_the_flag_of_their_parameter_and_of_any_they_mention():
    assert error_text(OptionError("time_limit", "expected a number > 0, got -1")) == \
        "--time-limit: expected a number > 0, got -1"
    assert error_text(StagesplitError("no split within the limit; allow more with `time_limit`")) == \
        "no split within the limit; allow more with --time-limit"
    assert str(OptionError("time_limit", "expected a number > 0, got -1")) == "time_limit: expected a number > 0, got -1"


def test_a_table_is_named_before_it_is_laid_out():
    """The title's underline, the columns and the left-out line are measured on the flags."""
    t = Table("Schedules tried (`schedule='auto'`)", [Column("a"), Column("b", "text", 3)],
              [["x" * 30, "y" * 30]], "`micro_batches` not given")
    assert render([t], width=40, naming=flags_in).splitlines() == [
        "Schedules tried (--schedule auto)", "=" * len("Schedules tried (--schedule auto)"), "a", "-" * 30, "x" * 30,
        "--micro-batches not given", "(1 column left out to fit 40 characters: b; --wide shows them)"]
    assert render([t], width=40).splitlines()[-1] == "(1 column left out to fit 40 characters: b; `wide` shows them)"
