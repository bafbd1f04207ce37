"""From a solved split to a ``Plan``: every stage's layers, memory (per-tile detail recomputed
from the cost model), compute and transfers, the objective phases in the user's units, and
what the plan was solved from."""

from __future__ import annotations

import datetime as _dt

from ..common.fileio import file_sha256
from ..common.versions import VERSION, versions
from ..model.costmodel import StageCostModel
from ..model.traffic import Traffic
from ..solver.cpsat import PHASE_NAMES, SolverResult
from ..solver.problem import Split, SplitProblem, evaluate, schedule_note, stage_in_flight
from .records import PhaseRecord, Plan, PlanInputs, PlanProfile, PlanRun, StagePlan

__all__ = ["make_plan", "plan_profile"]


def plan_profile(model: StageCostModel) -> PlanProfile:
    """The plan's record of the profile: name, device, and the file and hash it was read from."""
    p = model.profile
    sha = p.info.sha256                                  # hashed from the bytes as they were read
    if sha is None and p.info.path is not None:
        sha = file_sha256(p.info.path)
    return PlanProfile(name=p.info.name, source=p.info.source, synthetic=p.info.synthetic, target=p.target.name,
                       tiles=p.target.tiles, bytes_per_tile=p.target.bytes_per_tile,
                       path=None if p.info.path is None else str(p.info.path), sha256=sha)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def make_plan(model: StageCostModel, problem: SplitProblem, split: Split | None, inputs: PlanInputs, *,
              method: str, traffic: Traffic, result: SolverResult | None = None, message: str = "",
              profile: PlanProfile | None = None) -> Plan:
    """Describe ``split`` stage by stage (per-tile detail recomputed from the cost model)."""
    p = model.profile
    o = problem.options
    evaluation = evaluate(problem, split) if split is not None else None
    stages: list[StagePlan] = []
    if split is not None:
        ks = stage_in_flight(problem, split)
        seconds = problem.seconds_per_unit
        unit_s = p.target.seconds_per_unit(p.compute_unit)
        for index, ((position, first, last), k) in enumerate(zip(split.stages, ks)):
            sm = model.stage_memory(first, last)
            total = sm.total(k)
            tile = int(total.argmax())
            received, sent = traffic.stage_io(first, last)
            compute = model.range_compute(first, last)
            stage_time = float(compute)
            cut_bytes = float(traffic.cut_bytes[first] + traffic.cut_bytes[last + 1])
            if o.communication and o.link_bytes_per_s and unit_s:
                stage_time += cut_bytes / o.link_bytes_per_s / unit_s
            time_s = None
            if seconds is not None:
                time_s = compute * seconds
                if model.layer_time_s is not None:     # roofline seconds (model/roofline.py)
                    time_s = float(sum(model.layer_time_s[first:last + 1]))
                if o.communication and o.link_bytes_per_s:
                    time_s += cut_bytes / o.link_bytes_per_s
            stages.append(StagePlan(
                stage=index, device=position, first_layer=first, last_layer=last,
                layers=model.layers.names[first:last + 1], in_flight=k,
                capacity_bytes=int(problem.capacity[position]), worst_tile=tile, worst_tile_bytes=int(total[tile]),
                memory_at_worst_tile=sm.at_tile(tile, k), memory_total=sm.summed(k), compute=float(compute),
                time_s=time_s, bytes_received=int(received), bytes_sent=int(sent), time=stage_time))
    feasible = bool(evaluation is not None and evaluation.feasible)
    units = {"time": problem.time_unit, "memory": "bytes" if problem.homogeneous else "fraction of capacity",
             "devices": "devices"}
    # the split's own figures (unrounded) as values; the solver's integer bound converted back
    actual = {"time": max((s.stage_time for s in stages), default=None),
              "memory": max((s.worst_tile_bytes if problem.homogeneous else s.worst_tile_bytes / s.capacity_bytes
                             for s in stages), default=None),
              "devices": len(stages) if stages else None}
    phases = []
    for ph in (result.phases if result else []):
        value = actual[ph.quantity] if ph.value is not None and stages else problem.user_value(ph.quantity, ph.value)
        bound = value if ph.bound is not None and ph.bound == ph.value else problem.user_value(ph.quantity, ph.bound)
        if isinstance(bound, float):
            bound = float(f"{bound:.9g}")
        phases.append(PhaseRecord(PHASE_NAMES[ph.quantity], ph.status, value, bound, ph.gap, round(ph.seconds, 3),
                                  unit=units[ph.quantity], scale=problem.objective_scale(ph.quantity),
                                  solver_value=ph.value, solver_bound=ph.bound, proof=ph.proof))
    status = result.status if result is not None else ("feasible" if feasible else "infeasible")
    run = PlanRun(stagesplit=VERSION, created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  solver_seconds=round(result.seconds, 3) if result else 0.0,
                  phase_seconds=tuple(ph.seconds for ph in phases), versions=versions(),
                  dp_seconds=_rounded(result.dp_seconds if result else None),
                  cpsat_seconds=_rounded(result.cpsat_seconds if result else None))
    return Plan(profile=profile or plan_profile(model), inputs=inputs, layer_names=list(model.layers.names),
                devices=o.devices, method=method, status=status, feasible=feasible, message=message, stages=stages,
                phases=phases, compute_unit=p.compute_unit, module_paths=list(model.layers.module_paths),
                notes=[n for n in (schedule_note(o),) if n] + (list(result.notes) if result is not None else []),
                run=run, tied=model.tied)
