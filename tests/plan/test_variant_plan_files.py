"""Plan files of plans solved on profile variants: each stage's ``memory_proportion`` and
``variant`` and the plan's ``variants`` list survive a round trip (JSON and YAML), and a
hand-edited value is refused in one line naming the file and the field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from helpers import error_line, plan_inputs
from stagesplit.errors import StagesplitError
from stagesplit.model.stagememory import MemoryBreakdown
from stagesplit.plan import Plan, PlanProfile, StagePlan, read_plan, write_plan
from stagesplit.plan.records import PlanVariant


def variant_plan() -> Plan:
    stages = [StagePlan(stage=k, device=k, first_layer=a, last_layer=b, layers=[f"l{i}" for i in range(a, b + 1)],
                        in_flight=1, capacity_bytes=1000, worst_tile=0, worst_tile_bytes=900,
                        memory_at_worst_tile=MemoryBreakdown(), memory_total=MemoryBreakdown(), compute=3.0,
                        time_s=None, bytes_received=0, bytes_sent=0, memory_proportion=p, variant=name)
              for k, (a, b, p, name) in enumerate([(0, 1, 0.2, "amp0.2"), (2, 2, 0.6, "amp0.6")])]
    return Plan(profile=PlanProfile(name="toy", target="ipu-mk2", tiles=1472), inputs=plan_inputs(2),
                layer_names=["l0", "l1", "l2"], devices=2, method="cp-sat", status="optimal", feasible=True,
                message="", stages=stages,
                variants=(PlanVariant("amp0.2", 0.2, "a.json", "ab" * 32), PlanVariant("amp0.6", 0.6, "b.json", None)))


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_round_trip(tmp_path, suffix):
    plan = variant_plan()
    write_plan(plan, tmp_path / f"plan{suffix}")
    back = read_plan(tmp_path / f"plan{suffix}")
    assert back.variants == plan.variants
    assert [(s.memory_proportion, s.variant) for s in back.stages] == [(0.2, "amp0.2"), (0.6, "amp0.6")]


def test_a_plan_without_variants_writes_an_empty_list_and_null_fields(tmp_path):
    plan = variant_plan()
    plain = dataclasses.replace(plan, variants=(), stages=[dataclasses.replace(s, memory_proportion=None, variant=None)
                                                           for s in plan.stages])
    write_plan(plain, tmp_path / "plan.json")
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["variants"] == [] and doc["stages"][0]["memory_proportion"] is None and doc["stages"][0]["variant"] is None
    del doc["variants"]                                         # plans written before variants existed
    for s in doc["stages"]:
        del s["memory_proportion"], s["variant"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = read_plan(tmp_path / "old.json")
    assert old.variants == () and old.stages[0].memory_proportion is None


@pytest.mark.parametrize("edit, field, expected", [
    (lambda d: d["stages"][0].update(memory_proportion=1.5), "stages[0].memory_proportion",
     "a memory proportion in (0, 1] or null"),
    (lambda d: d["stages"][1].update(memory_proportion="high"), "stages[1].memory_proportion", "a number"),
    (lambda d: d["stages"][1].update(variant="amp0.9"), "stages[1].variant", "one of the plan's variants"),
    (lambda d: d["stages"][1].update(memory_proportion=0.4), "stages[1].memory_proportion",
     "variant amp0.6's proportion (0.6)"),
    (lambda d: d["variants"][0].update(proportion=0), "variants[0].proportion", "a memory proportion in (0, 1]"),
    (lambda d: d["variants"][0].update(shade="blue"), "variants[0].shade", "a known field"),
    (lambda d: d["variants"][1].update(name="amp0.2"), "variants", "distinct variant names"),
    (lambda d: d.update(variants=[]), "stages[0].variant", "null (the plan lists no profile variants)"),
    (lambda d: d["variants"][0].update(sha256="xyz"), "variants[0].sha256", "64 lowercase hexadecimal digits"),
])
def test_bad_fields_are_refused_naming_the_field(tmp_path, edit, field, expected):
    write_plan(variant_plan(), tmp_path / "plan.json")
    doc = json.loads((tmp_path / "plan.json").read_text())
    edit(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(StagesplitError) as excinfo:
        read_plan(tmp_path / "bad.json")
    error_line(excinfo, file=tmp_path / "bad.json", field=field, expected=expected)
