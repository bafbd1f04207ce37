"""What a plan's message says of its search: why no split fits (a layer too big, more exact
devices than layers, micro-batches that follow the devices, a rule the user gave), that the time
limit stopped the search, or how many devices an exact devices objective would have needed."""

from __future__ import annotations

import time as _time
from dataclasses import replace
from typing import Any

import numpy as np

from ..model.costmodel import RangeTable, StageCostModel
from ..solver.cpsat import SolverResult
from ..solver.dp import exact_optimum
from ..solver.problem import SolveOptions, SplitProblem, build_problem, stage_capacities, with_devices
from ..solver.request import Objective
from .search import fewest_stages_that_fit, price
from .text import joined

__all__ = ["EXPLAIN_SECONDS", "exact_devices_note", "explain_infeasible", "result_message"]


def explain_infeasible(model: StageCostModel, problem: SplitProblem, table: RangeTable) -> str:
    """Say plainly why nothing fits: a layer too big for any device, or how many devices would do."""
    names = model.layers.names
    cap = int(problem.capacity.max())
    single = table.single(1)
    too_big = np.flatnonzero(single > cap)
    n = problem.devices
    if len(too_big):
        l = int(too_big[np.argmax(single[too_big])])
        tile = table.tile_of(1, l, l)
        return (f"layer '{names[l]}' alone needs {int(single[l]):,} bytes on tile {tile}, more than a device holds "
                f"({cap:,} bytes per tile after headroom), so no number of devices fits; split that layer "
                f"(a finer `layer_regex`) or free memory on that tile")
    o = problem.options
    L = len(names)
    if o.exact and n > L:
        works = _fewest_with_own_micro_batches(model, o) if o.micro_batches_auto else \
            fewest_stages_that_fit(table, problem.capacity, o)
        return (f"{L} layers cannot fill exactly {n:,} devices: `exact` puts at least one layer on each; use `devices="
                f"{L}` or fewer, or drop `exact`" + _holds_text(o, works))
    enough = fewest_stages_that_fit(table, problem.capacity, o)
    rules = _given_rules(o)
    if enough is None and o.micro_batches_auto and o.schedule.value in ("gpipe", "1f1b"):
        # the micro-batches follow the devices: fewer devices would have fewer in flight
        held = "on every stage" if o.schedule.value == "gpipe" else "on the first stages"
        return (f"no split of the {L} layers fits on {n:,} device(s) with {o.micro_batches:,} micro-batches in flight "
                f"{held} under {o.schedule.value} (`micro_batches` not given: one per device), nor on fewer devices "
                f"with that many" + _holds_text(o, _fewest_with_own_micro_batches(model, o)))
    if enough is None:
        return f"no split of the {L} layers fits on {n} device(s), nor on any number of such devices"
    if enough > n:
        kinds = list(dict.fromkeys(kind for kind, _, _, _ in rules))
        caveat = f" (ignoring {joined(kinds, 'and')})" if kinds else ""
        return (f"no split of the {len(names)} layers fits on {n} device(s); the smallest number that fits is "
                f"{enough}{caveat}")
    if not rules:                                      # not expected: every rule that can bind is listed
        return f"no split fits on {n} device(s), although {enough} device(s) would hold the layers"
    # the layers fit on `enough` <= n devices, so a rule the request gives binds: find which
    binding = [name for _, _, name, relax in rules if _fits_without(model, problem, table, relax)]
    head = f"no split fits on {'exactly ' if o.exact else ''}{n} device(s)"
    if len(rules) == 1 and binding and o.exact:
        text = f"{head}; on at most {n}, {enough} would do"
        if o.schedule == "1f1b" and o.micro_batches > 1:
            text += (f" (with 1F1B, the first of P stages holds min({o.micro_batches}, P) micro-batches in flight, "
                     "so more stages need more memory on the first ones)")
        return text
    given = [phrase for _, phrase, _, _ in rules if phrase]
    head += f" with {joined(given, 'and')}" if given else ""
    if len(rules) == 1 and binding:
        return f"{head}; without it {enough} device(s) would do"
    blame = f"it would fit without {joined(binding, 'or')}" if binding else \
        "dropping any one of these rules alone is not enough"
    return f"{head}; {blame}, and without all of them {enough} device(s) would do"


#: seconds the exact DP may take to check one relaxed problem when explaining infeasibility
EXPLAIN_SECONDS = 2.0


def _fewest_with_own_micro_batches(model: StageCostModel, o: SolveOptions) -> tuple[int, int] | None:
    """Where the micro-batch count follows the devices (not given): the fewest ``devices=m``
    whose ``m`` micro-batches fit, as (m, the stages that hold the model then), pins and layer-count
    limits ignored; None where none up to the layer count does, or the ranges of each count could
    not be priced within ``EXPLAIN_SECONDS``."""
    stop = _time.monotonic() + EXPLAIN_SECONDS
    for m in range(1, min(o.devices, model.num_layers) + 1):
        if _time.monotonic() > stop:
            return None
        trial = with_devices(replace(o, exact=False), m)
        capacity, _ = stage_capacities(model.profile.target, trial)
        stages = fewest_stages_that_fit(price(model, trial, max_devices=m), capacity, trial, limit=m)
        if stages is not None:
            return m, stages
    return None


def _holds_text(o: SolveOptions, works: int | tuple[int, int] | None) -> str:
    """What would hold the model: ``works`` is the fewest stages (micro-batches as given), or
    (``devices=m``, stages) where the micro-batches follow the devices; "" where nothing is known."""
    if works is None:
        return ""
    caveat = " (ignoring the pins and layer-count limits)" if len(_given_rules(o)) > o.exact else ""
    if isinstance(works, tuple):
        m, stages = works
        return (f"; the fewest `devices` that hold the model is {m} (so {m * o.chunks_per_rank} micro-batches), "
                f"on {stages} device{'s' if stages != 1 else ''}{caveat}")
    micro = f" with {o.micro_batches:,} micro-batches" if o.schedule.value != "none" else ""
    return f"; {works} device{'s are' if works != 1 else ' is'} the fewest that hold the model{micro}{caveat}"


def _given_rules(o: SolveOptions) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The rules of the request beyond memory that can leave no split: (kind, the rule as the
    request gives it ("" for the exact device count, which the message's head says), its name,
    the option values that drop it)."""
    def layers(n: int) -> str:
        return f"{n} layer{'s' if n != 1 else ''} per stage"
    rules: list[tuple[str, str, str, dict[str, Any]]] = []
    if o.exact:
        rules.append(("the exact device count", "", "the exact device count", {"exact": False}))
    if o.pinned_splits:
        rules.append(("the pinned splits", "the pinned splits", "the pinned splits", {"pinned_splits": ()}))
    if o.pinned_layers:
        rules.append(("the pinned layers", "the layers pinned to devices", "the layers pinned to devices",
                      {"pinned_layers": ()}))
    if o.min_layers > 1:
        rules.append(("the layer-count limits", f"at least {layers(o.min_layers)}",
                      f"the minimum of {layers(o.min_layers)}", {"min_layers": 1}))
    if o.max_layers is not None:
        rules.append(("the layer-count limits", f"at most {layers(o.max_layers)}",
                      f"the maximum of {layers(o.max_layers)}", {"max_layers": None}))
    return rules


def _fits_without(model: StageCostModel, problem: SplitProblem, table: RangeTable, relax: dict[str, Any]) -> bool:
    """Whether some split fits once the rule ``relax`` drops is dropped (False when the DP
    cannot say within ``EXPLAIN_SECONDS``)."""
    relaxed = replace(problem.options, objective=Objective.DEVICES, communication=False, **relax)
    answer = exact_optimum(build_problem(model, relaxed, table=table), deadline=_time.monotonic() + EXPLAIN_SECONDS)
    return answer.complete and answer.feasible



def exact_devices_note(o: SolveOptions, fewest: int | None) -> str:
    """``objective='devices'`` with ``exact``: the count is given, not searched; how many devices the
    fewest that hold the model are (``fewest_stages_that_fit``, proven by its prefix search)."""
    if fewest is None or fewest >= o.devices:
        return f"no fewer than the {o.devices} devices `exact` uses hold the model"
    caveat = " (ignoring the pins and layer-count limits)" if len(_given_rules(o)) > 1 else ""
    return (f"{fewest} device{'s are' if fewest != 1 else ' is'} the fewest that hold the model{caveat}; `exact` uses "
            f"all {o.devices} (without it, `objective='devices'` uses {fewest})")


def result_message(model: StageCostModel, problem: SplitProblem, table: RangeTable, result: SolverResult) -> str:
    """What the plan's message says of the search: why nothing fits, that nothing was found in
    the time limit, or that the split is not proven optimal ("" when it is)."""
    options = problem.options
    if result.split is None:
        if result.status == "infeasible":
            return explain_infeasible(model, problem, table)
        return (f"no split was found within the time limit ({options.time_limit:g} s); "
                "allow more time with `time_limit`")
    if result.status == "feasible":
        gaps = [p.gap for p in result.phases if p.status != "OPTIMAL"]
        known = [g for g in gaps if g is not None]
        gap = "gap unknown" if len(known) < len(gaps) else f"gap {100 * max(known, default=0):.1f}%"
        return f"stopped by the time limit ({options.time_limit:g} s): best split found, not proven optimal ({gap})"
    return ""
