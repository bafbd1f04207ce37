"""Plan files speak the device's words (format version 3): a GPU plan names each stage's memory
``peak_bytes`` and ``memory`` (weights, gradients and optimizer state; activations and
temporaries; stashed activations) and the device's ``device_bytes``, with no tile, vertex or
exchange word; an IPU plan keeps its per-tile words. Old plans (version 1, and a version-2 GPU plan
with the tile words) are read, reproduce with ``--from-plan``, and are written back as version 3."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from helpers import ROOT
from stagesplit import api
from stagesplit.cli import main
from stagesplit.errors import ProfileError
from stagesplit.plan import read_plan, write_plan
from stagesplit.plan.files import GPU_MEMORY_WORDS, VERSION, plan_document

OLD_PLANS = ROOT / "tests" / "data" / "plans"
#: what only an IPU has, as words in a key of a plan file
IPU_WORDS = re.compile(r"tile|vertex|exchange|control_code")


def keys_of(value, path=""):
    """Every key of a JSON document, with the path it is at."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}.{key}", key
            yield from keys_of(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from keys_of(item, f"{path}[{i}]")


def plan_words(doc: dict) -> list[str]:
    """The paths of the keys with an IPU word, but for the targets, which keep the form of a
    target file (``--target FILE.yaml``, configs/targets.yaml: a GPU is ``tiles: 1``)."""
    target = re.compile(r"^\.(request|resolved)\.targets\[")
    return [path for path, key in keys_of(doc) if IPU_WORDS.search(key) and not target.match(path)]


def solved(tmp_path, capsys, profile: str, *options: str) -> tuple[dict, object]:
    """``solve PROFILE --out plan.json``'s file, as JSON and as read back."""
    path = tmp_path / "plan.json"
    assert main(["solve", str(ROOT / "profiles" / profile), *options, "--out", str(path)]) == 0
    capsys.readouterr()
    return json.loads(path.read_text()), read_plan(path)


@pytest.mark.parametrize("profile, options", [
    ("gpt-captured.stagesplit", ("--devices", "2")),
    ("gpt-captured.stagesplit", ("--devices", "3", "--schedule", "1f1b", "--micro-batches", "6")),
    ("llama-7b-layers.json", ("--devices", "4", "--schedule", "1f1b", "--micro-batches", "8")),
])
def test_gpu_plan_has_no_ipu_words(tmp_path, capsys, profile, options):
    doc, plan = solved(tmp_path, capsys, profile, *options)
    assert doc["version"] == VERSION == 3
    assert plan_words(doc) == []
    assert doc["profile"]["device_bytes"] == plan.profile.bytes_per_tile == 85899345920 and plan.profile.one_tile
    for record, stage in zip(doc["stages"], plan.stages, strict=True):
        memory = record["memory"]
        assert list(memory) == ["weights_gradients_optimizer_state", "activations_and_temporaries",
                                "stashed_activations"]
        # the categories add up to the stage's peak, which is what the records call its worst tile's bytes
        assert sum(memory.values()) == record["peak_bytes"] == stage.worst_tile_bytes > 0
        assert record["capacity_bytes"] - record["peak_bytes"] == record["headroom_bytes"]
        assert {key: memory[word] for key, word in GPU_MEMORY_WORDS.items()} == \
            {key: getattr(stage.memory_at_worst_tile, key) for key in GPU_MEMORY_WORDS}
        assert stage.memory_total == stage.memory_at_worst_tile and stage.worst_tile == 0
    if "--micro-batches" in options:          # more than one micro-batch in flight on the first stage
        assert doc["stages"][0]["memory"]["stashed_activations"] > 0
    # the plain JSON export names it the same way
    out = tmp_path / "export.json"
    assert main(["export", str(tmp_path / "plan.json"), "--to", "json", "--out", str(out)]) == 0
    capsys.readouterr()
    exported = json.loads(out.read_text())["stages"]
    assert [s["peak_bytes"] for s in exported] == [r["peak_bytes"] for r in doc["stages"]]
    assert [path for path, key in keys_of(exported) if IPU_WORDS.search(key)] == []


def test_ipu_plan_keeps_its_words(tmp_path, capsys):
    doc, plan = solved(tmp_path, capsys, "bert-base.stagesplit", "--devices", "4")
    assert doc["version"] == 3 and doc["profile"]["tiles"] == 1472 and "device_bytes" not in doc["profile"]
    for record, stage in zip(doc["stages"], plan.stages, strict=True):
        assert "peak_bytes" not in record and "memory" not in record
        assert record["worst_tile"] == stage.worst_tile and record["worst_tile_bytes"] == stage.worst_tile_bytes
        at_tile = record["memory_at_worst_tile"]
        assert list(at_tile) == ["always_live", "not_always_live", "stashed_copies", "vertex_code", "vertex_state",
                                 "exchange_code", "control_code"]
        assert sum(at_tile.values()) == record["worst_tile_bytes"]
        assert at_tile["vertex_code"] > 0 and at_tile["exchange_code"] > 0     # what a GPU does not have
        assert sum(record["memory_total"].values()) > record["worst_tile_bytes"]   # summed over 1,472 tiles
    out = tmp_path / "export.json"
    assert main(["export", str(tmp_path / "plan.json"), "--to", "json", "--out", str(out)]) == 0
    capsys.readouterr()
    assert [s["worst_tile_bytes"] for s in json.loads(out.read_text())["stages"]] == \
        [r["worst_tile_bytes"] for r in doc["stages"]]


def old_stage_figures(doc: dict) -> list[tuple]:
    """Each stage's memory as an old plan file writes it (the tile words)."""
    return [(s["worst_tile"], s["worst_tile_bytes"], s["memory_at_worst_tile"], s["memory_total"])
            for s in doc["stages"]]


def stage_figures(plan) -> list[tuple]:
    return [(s.worst_tile, s.worst_tile_bytes, s.memory_at_worst_tile.as_dict(), s.memory_total.as_dict())
            for s in plan.stages]


@pytest.mark.parametrize("name, version, profile", [
    ("llama-v1.json", 1, "llama-7b-layers.json"),
    ("bert-base-v1.json", 1, "bert-base.stagesplit"),
    ("gpt-mixed-v1.yaml", 1, "gpt.stagesplit"),
    ("gpt-captured-v2.json", 2, "gpt-captured.stagesplit"),
])
def test_old_plan_round_trips(tmp_path, name, version, profile):
    """An old file with the old names is read with its figures, reproduces, and is written as
    version 3 (GPU words for a GPU) with the same figures."""
    from stagesplit.common.safeinput import read_document
    old_path = OLD_PLANS / name
    old_doc = read_document(old_path, "plan")
    assert old_doc["version"] == version
    old = read_plan(old_path)
    assert stage_figures(old) == old_stage_figures(old_doc)
    again = api.reproduce(old_path, ROOT / "profiles" / profile)
    assert again.identical and again.profile_matches and again.differences == []
    # written again: version 3, the same figures, and the GPU ones in GPU words
    new_path = tmp_path / ("new" + old_path.suffix)
    write_plan(old, new_path)
    new_doc = read_document(new_path, "plan")
    assert new_doc["version"] == 3
    new = read_plan(new_path)
    assert stage_figures(new) == stage_figures(old)
    assert (new.split_text, new.layer_names, [p.value for p in new.phases]) == \
        (old.split_text, old.layer_names, [p.value for p in old.phases])
    assert new.profile == old.profile and new.inputs.request == old.inputs.request
    gpu = old.profile.one_tile
    assert gpu == (profile in ("llama-7b-layers.json", "gpt-captured.stagesplit"))
    if gpu:
        assert plan_words(new_doc) == []
        assert [s["peak_bytes"] for s in new_doc["stages"]] == [s[1] for s in old_stage_figures(old_doc)]
    else:
        assert plan_words(new_doc) != []
        assert old_stage_figures(new_doc) == old_stage_figures(old_doc)
    # and the version-3 file reproduces too
    assert api.reproduce(new_path, ROOT / "profiles" / profile).identical


def test_from_plan_reproduces_an_old_gpu_plan(tmp_path, capsys):
    """``stagesplit solve --from-plan`` on the version-2 GPU plan (tile words), from the
    recorded profile path (relative to the checkout), writing the plan again as version 3."""
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    plan = tmp_path / "old.json"
    shutil.copy(OLD_PLANS / "gpt-captured-v2.json", plan)
    out = tmp_path / "again.json"
    import os
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(["solve", "--from-plan", str(plan), "--out", str(out)])
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out
    assert code == 0
    assert "reproduced: the split is identical to " in printed and "[ 0 1 2 | 3 4 5 | 6 7 ]" in printed
    doc = json.loads(out.read_text())
    assert doc["version"] == 3 and "peak_bytes" in doc["stages"][0] and "worst_tile" not in doc["stages"][0]


def hand_edited(tmp_path, doc: dict, edit) -> str:
    edit(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError) as info:
        read_plan(path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_mixed_words_refused(tmp_path):
    """A version-3 file that mixes the two sets of words fails naming the field."""
    gpu = plan_document(api.solve(ROOT / "profiles" / "gpt-captured.stagesplit", devices=2))
    ipu = plan_document(api.solve(ROOT / "profiles" / "bert-base.stagesplit", devices=4))

    def tile_words(doc):
        doc["stages"][1]["worst_tile_bytes"] = doc["stages"][1].pop("peak_bytes")
    assert "stages[1].worst_tile_bytes: expected no such field in a GPU plan (version 3 names the stage's memory " \
        "peak_bytes and memory)" in hand_edited(tmp_path, json.loads(json.dumps(gpu)), tile_words)

    def ipu_category(doc):
        doc["stages"][0]["memory"]["always_live"] = 5
    assert "stages[0].memory.always_live: expected a known field" in \
        hand_edited(tmp_path, json.loads(json.dumps(gpu)), ipu_category)

    def negative(doc):
        doc["stages"][0]["memory"]["activations_and_temporaries"] = -1
    assert "stages[0].memory.activations_and_temporaries" in hand_edited(tmp_path, json.loads(json.dumps(gpu)),
                                                                         negative)

    def both(doc):
        doc["profile"]["tiles"] = 1
    assert "profile.device_bytes: expected either device_bytes (a GPU) or tiles and bytes_per_tile (an IPU), " \
        "not both" in hand_edited(tmp_path, json.loads(json.dumps(gpu)), both)

    def gpu_words(doc):
        doc["stages"][0]["peak_bytes"] = doc["stages"][0]["worst_tile_bytes"]
    assert "stages[0].peak_bytes: expected no such field in this plan" in \
        hand_edited(tmp_path, json.loads(json.dumps(ipu)), gpu_words)

    def old_version(doc):                   # version 2 had no device_bytes
        doc["version"] = 2
    assert "profile.device_bytes: expected a known field" in hand_edited(tmp_path, json.loads(json.dumps(gpu)),
                                                                          old_version)


def test_one_tile_profile_with_ipu_code_round_trips(tmp_path):
    """A one-tile profile that records IPU code (vertex code, state, exchange and control code:
    no GPU has them) is written in GPU words plus those categories where they are not zero, and
    reads back with every byte: layer 0's stage holds 60 + 20 bytes of vertex code (MatMul and
    Add), 8 + 4 of vertex state, 12 of exchange code and 4 of control code on its one tile."""
    from stagesplit.io.builder import ProfileBuilder
    from stagesplit.io.profile import Target
    b = ProfileBuilder(Target("one-tile", tiles=1, bytes_per_tile=10**6, clock_hz=1e9), 4)
    w0, w1 = b.variable(100, 0, "always", name="layer0.w"), b.variable(50, 0, "always", name="layer1.w")
    act = b.variable(30, 0, [(0, 3)], name="layer0/a")
    p0 = b.program("layer0/matmul/compute", cycles=100, vertex_code=[(0, "MatMul", 60)], vertex_state=[(0, 8)],
                   control_code=[(0, 4)])
    p1 = b.program("layer0/add/exchange", "DoExchange", cycles=10, vertex_code=[(0, "Add", 20)],
                   vertex_state=[(0, 4)], exchange_code=[(0, 12)])
    p2 = b.program("layer1/matmul/compute", cycles=200, vertex_code=[(0, "MatMul", 60)])
    b.operation("layer0/matmul", 0, 0, vars=[w0, act], programs=[p0])
    b.operation("layer0/add", 1, 1, vars=[act], programs=[p1])
    b.operation("layer1/matmul", 2, 3, vars=[w1, act], programs=[p2])
    plan = api.solve(b.build(), devices=2)
    assert plan.split_text == "[ 0 | 1 ]"
    at = plan.stages[0].memory_at_worst_tile
    assert (at.vertex_code, at.vertex_state, at.exchange_code, at.control_code) == (80, 12, 12, 4)
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    memory = json.loads(path.read_text())["stages"][0]["memory"]
    assert memory == {"weights_gradients_optimizer_state": at.always_live, "activations_and_temporaries":
                      at.not_always_live, "stashed_activations": 0, "vertex_code": 80, "vertex_state": 12,
                      "exchange_code": 12, "control_code": 4}
    assert stage_figures(read_plan(path)) == stage_figures(plan)
