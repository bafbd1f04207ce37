"""Issue 34: an option is named where its value came from. A flag's value is named by the flag
(``--chunks-per-rank: ...``), a settings file's (``--config``) by the file and its key
(``s.yaml: chunks_per_rank: ...``), a plan's recorded request (``solve --from-plan``) by the plan
and the field (``plan.json: request.chunks_per_rank: ...``), wherever the value is found wrong:
when the request is made, when the schedule is checked, when the profile is read and grouped.
And a settings file is checked once the command line is combined with it, so that its
``chunks_per_rank`` goes with the flags' ``--schedule`` (the reproducers in
tests/data/reproducers/settings-*.yaml were refused).

Every refusal is one line on stderr, exit 2, nothing on stdout and no file written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import PROFILES, ROOT, refused_line, run_cli
from stagesplit.cli import main
from stagesplit.errors import FileOptionError, OptionError, ProfileError
from stagesplit.solver.request import Schedule, SolveRequest

REPRODUCERS = ROOT / "tests" / "data" / "reproducers"
GPT = PROFILES / "gpt-captured.stagesplit"       # captured: records each operation's phase, 8 layers
BERT = PROFILES / "bert-base.stagesplit"          # an IPU profile: per-tile memory, no phases

ZBV_CHUNKS = "zbv runs exactly 2 chunks per rank (the V shape) (torch's ScheduleZBVZeroBubble): expected 2, got 3"
DUALPIPEV = ("dualpipev needs at least as many micro-batches as chunks, 2 x 2 ranks (torch's ScheduleDualPipeV): "
             "expected >= 4, got 2")
NO_PHASES = ("interleaved-1f1b needs a profile of one device that records each operation's phase (forward, "
             "backward, optimizer), as stagesplit capture writes; this profile ")
RECOMPUTE = ("full needs a profile of one device that records each operation's phase (as stagesplit capture "
             "writes) and a pipeline schedule (--schedule 1f1b, zbv, ...); on IPUs, solve profile variants "
             "compiled at several memory proportions")


run, refused = run_cli, refused_line


def settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


# -- settings files: checked with the command line --------------------------------------------------------

@pytest.mark.parametrize("file, flags", [
    ("settings-interleaved-chunks.yaml", []),
    ("settings-chunks-only.yaml", ["--schedule", "interleaved-1f1b"]),
])
def test_reproducers_solve_as_the_same_flags_do(capsys, tmp_path, file, flags):
    """The oracle: the plan from the settings file (and flags) is the plan of the same options as
    flags alone: interleaved 1F1B, 2 chunks on each of 2 devices, the same split and step."""
    config = REPRODUCERS / file
    assert config.is_file()
    code, _, err = run(capsys, "solve", GPT, "--devices", 2, "--config", config, *flags, "--out", tmp_path / "a.json")
    assert code == 0, err
    code, _, err = run(capsys, "solve", GPT, "--devices", 2, "--schedule", "interleaved-1f1b", "--chunks-per-rank", 2,
                       "--out", tmp_path / "b.json")
    assert code == 0, err
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert (a["request"]["schedule"], a["request"]["chunks_per_rank"]) == ("interleaved-1f1b", 2)
    assert (a["schedule"]["kind"], a["schedule"]["chunks_per_rank"], len(a["stages"])) == ("interleaved-1f1b", 2, 4)
    assert a["split"] == b["split"] and a["schedule"]["step_time"] == b["schedule"]["step_time"]
    assert a["status"] == b["status"] == "optimal"


def test_file_values_are_checked_with_the_flags(tmp_path):
    path = settings(tmp_path, "chunks_per_rank: 2\n")
    request = SolveRequest.from_settings(path, 2, schedule="interleaved-1f1b")
    assert (request.schedule, request.chunks_per_rank, request.devices) == (Schedule.INTERLEAVED_1F1B, 2, 2)
    assert request.origins == (("chunks_per_rank", str(path), "chunks_per_rank"),)
    # the file's schedule overridden by a flag is not blamed for the flags' chunks
    path = settings(tmp_path, "schedule: gpipe\n")
    request = SolveRequest.from_settings(path, 2, schedule="zbv", chunks_per_rank=2)
    assert (request.schedule, request.chunks_per_rank, request.origins) == (Schedule.ZBV, 2, ())
    # the origins are no option: equal requests, whatever gave them
    assert request == SolveRequest(devices=2, schedule="zbv", chunks_per_rank=2)
    assert "origins" not in request.to_record()


@pytest.mark.parametrize("text, flags, field, message", [
    ("schedule: zbv\nchunks_per_rank: 3\n", {}, "chunks_per_rank", ZBV_CHUNKS),
    ("chunks_per_rank: 3\n", {"schedule": "zbv"}, "chunks_per_rank", ZBV_CHUNKS),
    ("chunks_per_rank: 2\n", {}, "chunks_per_rank", "schedule none runs one stage per device: expected 1, got 2 "
                                                    "(a looped or V-shaped schedule runs several)"),
    ("chunks_per_rank: 2\n", {"schedule": "gpipe"}, "chunks_per_rank",
     "gpipe runs one stage per rank (torch's ScheduleGPipe): expected 1, got 2"),
    ("headroom: 2\n", {"headroom": 0.1}, "headroom", "expected a number in [0, 1), got 2"),   # overridden, still bad
    ("stages: exact\nschedule: 1f1b\nworkers: 0\n", {}, "workers", "expected an integer >= 1 and <= 256, got 0"),
])
def test_a_bad_file_value_names_the_file_and_key(tmp_path, text, flags, field, message):
    path = settings(tmp_path, text)
    with pytest.raises(FileOptionError) as excinfo:
        SolveRequest.from_settings(path, 2, **flags)
    error = excinfo.value
    assert str(error) == f"{path}: {field}: {message}"
    assert isinstance(error, ProfileError) and isinstance(error, OptionError)
    assert (error.file, error.field, error.parameter) == (str(path), field, field)


def test_a_flag_value_is_still_named_by_its_flag(capsys, tmp_path):
    path = settings(tmp_path, "schedule: zbv\n")
    with pytest.raises(OptionError) as excinfo:
        SolveRequest.from_settings(path, 2, chunks_per_rank=3)
    assert type(excinfo.value) is OptionError and str(excinfo.value) == f"chunks_per_rank: {ZBV_CHUNKS}"
    assert refused(capsys, "solve", GPT, "--devices", 2, "--config", path, "--chunks-per-rank", 3) == \
        f"--chunks-per-rank: {ZBV_CHUNKS}"


@pytest.mark.parametrize("profile, text, flags, field, message", [
    (GPT, "schedule: zbv\nchunks_per_rank: 3\n", [], "chunks_per_rank", ZBV_CHUNKS),
    (GPT, "schedule: dualpipev\nmicro_batches: 2\n", [], "micro_batches", DUALPIPEV),
    (GPT, "micro_batches: 2\n", ["--schedule", "dualpipev"], "micro_batches", DUALPIPEV),
    (BERT, "schedule: interleaved-1f1b\n", [], "schedule",
     NO_PHASES + "has per-tile memory (an IPU's): use gpipe or 1f1b"),
    (BERT, "schedule: 1f1b\nrecompute: full\n", [], "recompute", RECOMPUTE),
])
def test_settings_file_errors_found_at_solve_time_name_the_file(capsys, tmp_path, profile, text, flags, field,
                                                                 message):
    """Found when the schedule is checked against the devices, or the request against the
    profile: still named by the file's key; the same value as a flag is named by the flag."""
    path = settings(tmp_path, text)
    out = tmp_path / "plan.json"
    assert refused(capsys, "solve", profile, "--devices", 2, "--config", path, *flags, "--out", out) == \
        f"{path}: {field}: {message}"
    as_flags = [word for line in text.splitlines() for word in ("--" + line.split(":")[0].replace("_", "-"),
                                                                  line.split(":")[1].strip())]
    flag = "--" + field.replace("_", "-")
    assert refused(capsys, "solve", profile, "--devices", 2, *as_flags, *flags, "--out", out) == f"{flag}: {message}"
    assert not out.exists()


# -- plans: the recorded request ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zbv_plan(tmp_path_factory) -> dict:
    """A plan of the captured GPT on 2 devices under ZBV (written once for the module)."""
    folder = tmp_path_factory.mktemp("plans")
    path = folder / "plan.json"
    assert main(["solve", str(GPT), "--devices", "2", "--schedule", "zbv", "--out", str(path)]) == 0
    return json.loads(path.read_text())


def _regex_of(doc: dict, pattern: str) -> dict:
    return dict(doc["request"]["layering"], layer_regex=pattern)


@pytest.mark.parametrize("change, field, message", [
    ({"chunks_per_rank": 3}, "chunks_per_rank", ZBV_CHUNKS),
    ({"schedule": "dualpipev", "micro_batches": 2}, "micro_batches", DUALPIPEV),
    ({"schedule": "none", "recompute": "full"}, "recompute", RECOMPUTE),
    ({"pin_splits": ["nope"]}, "pin_splits", "no layer named 'nope' (layers: 0, 1, 2, 3, 4, 5, 6, 7)"),
    ({"layering": "("}, "layering.layer_regex",
     "invalid regular expression '(': missing ), unterminated subpattern at position 0"),
    ({"layering": "(?=x)"}, "layering.layer_regex",
     "invalid regular expression '(?=x)': not supported by the linear-time regex engine RE2"),
])
def test_from_plan_errors_name_the_plan_and_field(capsys, tmp_path, monkeypatch, zbv_plan, change, field, message):
    monkeypatch.chdir(ROOT)                      # the plan's recorded profile is read from here (profiles/)
    doc = json.loads(json.dumps(zbv_plan))
    if "layering" in change:
        change = {"layering": _regex_of(doc, change["layering"])}
    doc["request"].update(change)
    plan = tmp_path / "edited.json"
    plan.write_text(json.dumps(doc))
    out = tmp_path / "again.json"
    line = refused(capsys, "solve", "--from-plan", plan, "--out", out)
    assert line.startswith(f"{plan}: request.{field}: {message}"), line
    assert not out.exists()


def test_from_plan_names_a_schedule_the_profile_cannot_run(capsys, tmp_path):
    """A plan of a profile without phases, edited to ask for an interleaved schedule."""
    profile = tmp_path / "base.json"
    profile.write_text(json.dumps({
        "format": "stagesplit-profile", "version": 1, "kind": "full", "name": "base",
        "target": {"name": "hand", "tiles": 1, "bytes_per_tile": 1000, "clock_hz": 1e9, "link_bytes_per_s": 1e9},
        "steps": 4, "variables": [{"name": f"w{i}", "bytes": 100, "live": "always"} for i in range(4)],
        "operations": [{"name": f"layer{i}/op", "layer": str(i), "first_step": i, "last_step": i, "vars": [i],
                        "compute": 10.0 * (i + 1)} for i in range(4)]}))
    plan = tmp_path / "plan.json"
    assert run(capsys, "solve", profile, "--devices", 2, "--out", plan)[0] == 0
    doc = json.loads(plan.read_text())
    doc["request"]["schedule"] = "interleaved-1f1b"
    plan.write_text(json.dumps(doc))
    assert refused(capsys, "solve", "--from-plan", plan) == \
        f"{plan}: request.schedule: {NO_PHASES}does not say: capture the model, or use gpipe or 1f1b"
    assert refused(capsys, "solve", profile, "--devices", 2, "--schedule", "interleaved-1f1b") == \
        f"--schedule: {NO_PHASES}does not say: capture the model, or use gpipe or 1f1b"


def test_the_api_names_the_plan_too(tmp_path, monkeypatch, zbv_plan):
    """``stagesplit.reproduce`` raises the same error the command line prints."""
    import stagesplit
    monkeypatch.chdir(ROOT)
    doc = json.loads(json.dumps(zbv_plan))
    doc["request"]["micro_batches"] = 2
    doc["request"]["schedule"] = "dualpipev"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    with pytest.raises(FileOptionError) as excinfo:
        stagesplit.reproduce(plan)
    assert str(excinfo.value) == f"{plan}: request.micro_batches: {DUALPIPEV}"
    assert (excinfo.value.file, excinfo.value.field) == (str(plan), "request.micro_batches")


def test_a_flag_regex_is_still_named_by_its_flag(capsys):
    assert refused(capsys, "breakdown", BERT, "--call-regex", "(") == \
        "invalid --call-regex '(': missing ), unterminated subpattern at position 0"
