"""``stagesplit solve`` on profile variants: the PROFILE=PROPORTION words and the variants file,
the plan's per-stage proportions, the exports, reproducing, and a one-line error for every bad
input (naming the file and the field, or the word).

The profiles are the hand-checked case of tests/solver/test_variants.py as per-layer JSON IPU
profiles (a device of 100,000 bytes seen as one pool): "fast" (proportion 0.6) fits one layer
per IPU only, "slow" (0.2) two; the optimum on 2 IPUs is [layer0 layer1 | layer2] with stage 0
slow (300 cycles) and stage 1 fast (120 cycles)."""

from __future__ import annotations

import json

import pytest

from stagesplit import api
from stagesplit.cli import main
from stagesplit.errors import StagesplitError
from stagesplit.exporters import export_plan
from stagesplit.plan import read_plan, write_plan

WEIGHTS = [40_000, 40_000, 50_000]
WORKSPACE = {"fast": [30_000, 30_000, 40_000], "slow": [10_000, 10_000, 10_000]}
COMPUTE = {"fast": [100, 100, 120], "slow": [150, 150, 320]}
TARGET = {"name": "toy-ipu", "kind": "ipu", "tiles": 1, "bytes_per_tile": 100_000, "clock_hz": 1e9}


def profile_document(kind: str, names=("layer0", "layer1", "layer2")) -> dict:
    return {"format": "stagesplit-profile", "version": 1, "kind": "layers", "name": f"toy-{kind}",
            "target": TARGET, "training": False, "compute_unit": "cycles",
            "layers": [{"name": n, "weights": WEIGHTS[i], "workspace": WORKSPACE[kind][i], "compute": COMPUTE[kind][i]}
                       for i, n in enumerate(names)]}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """fast.json and slow.json in a fresh working folder."""
    monkeypatch.chdir(tmp_path)
    for kind in ("fast", "slow"):
        (tmp_path / f"{kind}.json").write_text(json.dumps(profile_document(kind)))
    return tmp_path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def error_of(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stagesplit: error: "), err
    return lines[0].removeprefix("stagesplit: error: ")


def test_solve_words_plan_and_exports(toy, capsys):
    code, out, err = run(capsys, "solve", "fast.json=0.6", "slow.json=0.2", "--devices", 2, "--out", "plan.json")
    assert code == 0, err
    assert "profile variants (memory proportion): fast.json (0.6), slow.json (0.2)" in out
    assert "split: [ layer0 layer1 | layer2 ]" in out
    assert "bottleneck: stage 0 (layers layer0..layer1): 300 cycles" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert [(r[-2], r[-1]) for r in rows] == [("0.200", "slow.json"), ("0.600", "fast.json")]
    plan = read_plan("plan.json")
    assert [(s.memory_proportion, s.variant, s.worst_tile_bytes, s.compute) for s in plan.stages] == \
        [(0.2, "slow.json", 90_000, 300.0), (0.6, "fast.json", 90_000, 120.0)]
    assert [(v.name, v.proportion, v.path) for v in plan.variants] == [("fast.json", 0.6, "fast.json"),
                                                                      ("slow.json", 0.2, "slow.json")]
    assert all(len(v.sha256) == 64 for v in plan.variants)
    text = export_plan(plan, "optimum-ipu")
    assert "matmul_proportion=[0.2, 0.6],   # per IPU: the profile variant its stage was priced with" in text
    assert "MEMORY_PROPORTION_OF_STAGE = [0.2, 0.6]" in export_plan(plan, "popart")
    # the same request again: the recorded variants are read again and give the same plan
    code, out, err = run(capsys, "solve", "--from-plan", "plan.json")
    assert code == 0, err
    assert "reproduced: the split is identical" in out


def test_variants_file_names_and_relative_paths(toy, capsys):
    (toy / "profiles").mkdir()
    for kind in ("fast", "slow"):
        (toy / f"{kind}.json").rename(toy / "profiles" / f"{kind}.json")
    (toy / "profiles" / "variants.yaml").write_text(
        "variants:\n"
        "  - {profile: fast.json, proportion: 0.6, name: amp0.6}\n"
        "  - profile: slow.json\n"
        "    proportion: 0.2\n")
    code, out, err = run(capsys, "solve", "profiles/variants.yaml", "--devices", 2, "--out", "plan.json")
    assert code == 0, err
    plan = read_plan("plan.json")
    assert [(s.variant, s.memory_proportion) for s in plan.stages] == [("slow.json", 0.2), ("amp0.6", 0.6)]
    assert [v.path for v in plan.variants] == ["profiles/fast.json", "profiles/slow.json"]
    # a variants file's profile is an input: --out cannot overwrite it
    before = (toy / "profiles" / "slow.json").read_text()
    message = error_of(capsys, "solve", "profiles/variants.yaml", "--devices", 2, "--out", "profiles/slow.json")
    assert "is also an input" in message
    assert (toy / "profiles" / "slow.json").read_text() == before


def test_compare_solves_each_variant_alone(toy, capsys):
    plan = api.solve(["fast.json=0.6", "slow.json=0.2"], devices=2, compare=True)
    assert [b.method for b in plan.baselines] == ["fast.json alone (proportion 0.6 on every IPU)",
                                                  "slow.json alone (proportion 0.2 on every IPU)"]
    fast, slow = plan.baselines
    assert not fast.stages and "the smallest number that fits is 3" in fast.message
    assert slow.split_text == plan.split_text and slow.bottleneck.compute == 320.0
    assert plan.bottleneck.compute == 300.0
    code, out, _ = run(capsys, "solve", "fast.json=0.6", "slow.json=0.2", "--devices", 2, "--compare")
    assert "1.07x faster than slow.json alone (proportion 0.2 on every IPU)" in out     # 320 / 300


def test_api_takes_profiles_and_pairs(toy):
    from stagesplit.io import load_profile
    plan = api.solve([(load_profile("fast.json"), 0.6), ("slow.json", 0.2)], devices=2)
    assert [s.variant for s in plan.stages] == ["slow.json", "fast.json"]       # a loaded profile: its file
    assert plan.stage_model(plan.stages[0]) is plan.variant_models["slow.json"]
    fast, slow = load_profile("fast.json"), load_profile("slow.json")
    fast.info.path = slow.info.path = None
    slow.info.name = fast.info.name                # two compiles of one model, built in memory
    plan = api.solve([(fast, 0.6), (slow, 0.2)], devices=2)
    assert [s.variant for s in plan.stages] == ["toy-fast@0.2", "toy-fast@0.6"]
    assert [v.path for v in plan.variants] == [None, None]


def test_infeasible_with_variants_says_how_many_devices_any_variant_needs(toy, capsys):
    code, out, _ = run(capsys, "solve", "fast.json=0.6", "slow.json=0.2", "--devices", 1)
    assert code == 1
    # the slow variant holds the layers on 2 devices; the fast one alone would need 3
    assert ("no split of the 3 layers fits on 1 device(s); the smallest number that fits is 2 (with the stages in "
            "any of the 2 profile variants)") in out


def test_bad_words_and_options(toy, capsys):
    assert error_of(capsys, "solve", "fast.json=0.6", "slow.json", "--devices", 2) == \
        "'slow.json': expected PROFILE=PROPORTION like the other profile words (profile variants each name their " \
        "memory proportion)"
    assert error_of(capsys, "solve", "fast.json=0.6", "slow.json=1.5", "--devices", 2) == \
        "'slow.json=1.5': expected a memory proportion in (0, 1] (e.g. 0.2), got 1.5"
    assert error_of(capsys, "solve", "fast.json=0", "slow.json=0.2", "--devices", 2).startswith(
        "'fast.json=0': expected a memory proportion in (0, 1]")
    assert "the proportion 0.6 is given twice (variants fast.json and slow.json)" in \
        error_of(capsys, "solve", "fast.json=0.6", "slow.json=0.6", "--devices", 2)
    assert "the profile fast.json is given twice" in \
        error_of(capsys, "solve", "fast.json=0.6", "fast.json=0.2", "--devices", 2)
    assert error_of(capsys, "solve", "fast.json=0.6", "slow.json=0.2", "--devices", 2, "--schedule", "zbv") == \
        "--schedule: profile variants are solved with the stage-level model: --schedule none, gpipe or 1f1b, not zbv"
    assert "expected one profile (and, for a profile.pop, its debug.cbor)" in \
        error_of(capsys, "solve", "fast.json", "slow.json", "other.json", "--devices", 2)


def test_variants_of_different_models_are_refused(toy, capsys):
    (toy / "other.json").write_text(json.dumps(profile_document("slow", ("layer0", "blockX", "layer2"))))
    assert error_of(capsys, "solve", "fast.json=0.6", "other.json=0.2", "--devices", 2) == \
        "variant other.json: layer 1 is 'blockX', in the first variant (fast.json) 'layer1': variants must be " \
        "profiles of the same model (the same layer names in the same order)"
    short = profile_document("slow", ("layer0", "layer1"))
    (toy / "short.json").write_text(json.dumps(short))
    assert error_of(capsys, "solve", "fast.json=0.6", "short.json=0.2", "--devices", 2).startswith(
        "variant short.json has 2 layers, the first variant (fast.json) 3: variants must be profiles of the same model")


@pytest.mark.parametrize("text, message", [
    ("- fast.json\n", "variants.yaml: document: expected an object, got 'list'"),
    ("variants: []\n", "variants.yaml: variants: expected a non-empty list"),
    ("variants:\n  - {profile: fast.json}\n",
     "variants.yaml: variants[0].proportion: expected a value (field is required)"),
    ("variants:\n  - {profile: fast.json, proportion: high}\n",
     "variants.yaml: variants[0].proportion: expected a memory proportion in (0, 1] (e.g. 0.2), got 'high'"),
    ("variants:\n  - {profile: fast.json, proportion: 0.6}\n  - {profile: slow.json, proportion: 0, name: x}\n",
     "variants.yaml: variants[1].proportion: expected a memory proportion in (0, 1] (e.g. 0.2), got 0"),
    ("variants:\n  - {profile: fast.json, proportion: 0.6, colour: red}\n",
     "variants.yaml: variants[0].colour: expected a known field (debug, name, profile, proportion), got 'colour'"),
    ("variants:\n  - {profile: fast.json, proportion: 0.6, debug: debug.cbor}\n",
     "variants.yaml: variants[0].debug: expected no debug.cbor: it goes with a PopVision profile.pop only"),
    ("variants:\n  - {profile: 7, proportion: 0.6}\n", "variants.yaml: variants[0].profile: expected a string"),
    ("variants:\n  - {profile: fast.json, proportion: 0.6}\n  - {profile: slow.json, proportion: 0.2, name: fast.json}\n",
     "variants.yaml: the name fast.json is given twice (variants fast.json and fast.json)"),
    ("profiles: [fast.json]\n", "variants.yaml: profiles: expected a known field (variants), got 'profiles'"),
])
def test_variants_file_errors_name_the_file_and_field(toy, capsys, text, message):
    (toy / "variants.yaml").write_text(text)
    assert error_of(capsys, "solve", "variants.yaml", "--devices", 2).startswith(message)


def test_a_variants_plan_needs_its_variants_to_report_on(toy, capsys):
    plan = api.solve(["fast.json=0.6", "slow.json=0.2"], devices=2)
    write_plan(plan, toy / "plan.json")
    with pytest.raises(StagesplitError, match="the plan was solved on 2 profile variants: give them"):
        api.report(toy / "plan.json", toy / "report.html", "fast.json")
    (toy / "variants.yaml").write_text("variants:\n  - {profile: fast.json, proportion: 0.6}\n"
                                       "  - {profile: slow.json, proportion: 0.2}\n")
    api.report(toy / "plan.json", toy / "report.html", "variants.yaml")
    page = (toy / "report.html").read_text()
    assert "memory proportion" in page and "stage 0 binds at 300 ns with proportion 0.2 (slow.json)" in page


def test_sweep_refuses_variants(toy):
    with pytest.raises(StagesplitError, match="profile variants are solved by solve"):
        api.sweep(["fast.json=0.6", "slow.json=0.2"], [1, 2])


def test_popvision_variants_through_the_pva_double(tmp_path, monkeypatch, capsys):
    """``a.pop=0.2 b.pop=0.6``: PopVision reports (the libpva test double's files) of one
    synthetic model at two proportions (examples/make_variants.py), and the same from a variants
    file whose ``debug`` field gives each report's debug.cbor."""
    import sys as _sys

    from fake_pva.support import load_fake_pva
    from helpers import ROOT
    from stagesplit.io.profile import Target
    from stagesplit.io.synth import synthesize
    _sys.path.insert(0, str(ROOT / "examples"))
    try:
        from make_variants import variant
    finally:
        _sys.path.remove(str(ROOT / "examples"))
    pva = load_fake_pva(monkeypatch)
    monkeypatch.chdir(tmp_path)
    small = Target("small", tiles=1472, bytes_per_tile=638976, clock_hz=1.33e9)
    for p in (0.2, 0.6):
        (tmp_path / f"amp{p}").mkdir()
        pva.write_report_file(tmp_path / f"amp{p}" / "profile.pop",
                              variant(synthesize("bert-base", small, layers=2, piece_bytes=16384), p))
        pva.write_debug_cbor(tmp_path / f"amp{p}" / "debug.cbor", [])
    code, out, err = run(capsys, "solve", "amp0.2/profile.pop=0.2", "amp0.6/profile.pop=0.6", "--devices", 6,
                         "--out", "plan.json")
    assert code == 0, out + err
    plan = read_plan("plan.json")
    assert {s.variant for s in plan.stages} <= {"amp0.2/profile.pop", "amp0.6/profile.pop"}
    assert [v.proportion for v in plan.variants] == [0.2, 0.6]
    (tmp_path / "variants.yaml").write_text(
        "variants:\n"
        "  - {profile: amp0.2/profile.pop, proportion: 0.2, debug: amp0.2/debug.cbor}\n"
        "  - {profile: amp0.6/profile.pop, proportion: 0.6, debug: amp0.6/debug.cbor}\n")
    pva.opened.clear()
    code, out, err = run(capsys, "solve", "variants.yaml", "--devices", 6, "--out", "again.json")
    assert code == 0, err
    assert sorted(pva.opened) == [("amp0.2/profile.pop", "amp0.2/debug.cbor"),
                                  ("amp0.6/profile.pop", "amp0.6/debug.cbor")]
    assert read_plan("again.json").split_text == plan.split_text
