"""``stagesplit layouts``'s text and JSON (solve with an automatic layout prints them after its
plan): the chosen layout, its step, tokens/s per GPU and MFU, each rank's peak, and one row per
degree combination with why it loses; the sweep of GPU counts' table of the best layout per count. Every
figure printed is the plan's own (tests/plan/test_layouts.py and tests/cli/test_cli_layouts.py read
them back)."""

from __future__ import annotations

from typing import Any

from ..plan.layout_compare import Comparison
from ..plan.layouts import GpuSweep, LayoutPlan, LayoutRequest, LayoutRow, seconds
from .table import Column, Table

__all__ = ["comparison_json", "comparison_text", "gpu_sweep_json", "gpu_sweep_table", "layouts_json", "layouts_text"]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


_CAPTURED_FROM = {"recorded": "as their capture recorded", "given": "as given",
                  "assumed": "assumed: the profiles record no batch"}


def _sizes(req: LayoutRequest) -> str:
    """The micro-batch size as the request has it, fixed or searched, and the size the profiles
    were captured at (the one every other size is scaled from), with where that comes from."""
    source = _CAPTURED_FROM[req.captured_from]
    if req.captured_from == "given" and req.recorded_batch not in (None, req.captured_batch):
        source += f", their capture recorded {req.recorded_batch}"
    captured = f"profiles captured at {req.captured_batch} ({source})"
    if req.micro_batch_size is not None:
        return f"micro-batches of {req.micro_batch_size}; {captured}"
    return f"micro-batch size searched; {captured}"


def layouts_text(lp: LayoutPlan) -> str:
    req = lp.request
    lines = [f"layout search: {req.gpus} GPUs ({req.node.gpus_per_node} per node) of {req.target.name}, global batch "
             f"{req.global_batch} ({_sizes(req)}), schedule {req.schedule}"]
    b = lp.best
    refused = sum(1 for r in lp.rows if r.status == "refused")
    if b is None:
        unknown = sum(1 for r in lp.rows if r.status == "unknown")
        lines.append(f"no layout found: the time limit stopped {unknown} combination(s), the others do not fit or "
                     "were refused" if unknown else "no layout fits every rank" if not refused else
                     f"no layout fits every rank: {refused} of {len(lp.rows)} combination(s) refused (the rows say "
                     "why)")
    else:
        assert b.step_s is not None
        lines.append(f"best: {b.layout.describe()}" + ("" if b.layout.schedule else
                                                         f"; {b.schedule} with {b.chunks_per_rank} chunk(s) per device"))
        lines.append(f"step: {seconds(b.step_s)} (pipeline {seconds(b.pipeline_s or 0.0)}, tensor-parallel "
                     f"communication {seconds(b.tp_comm_s)}, "
                     + (f"context-parallel exchange exposed {seconds(b.cp_comm_s)}, " if b.layout.cp > 1 else "")
                     + (f"expert-parallel all-to-all {seconds(b.ep_comm_s)}, " if b.layout.ep > 1 else "")
                     + f"data-parallel communication exposed {seconds(b.dp_comm_s)})")
        rate = f"{lp.samples_per_s:,.1f} samples/s" if lp.samples_per_s is not None else ""
        if lp.tokens_per_s_per_gpu is not None:
            rate += f", {lp.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
        if lp.mfu is not None:
            rate += f", MFU {lp.mfu:.1%}"
        lines.append(f"throughput: {rate}")
        lines.append("rank peaks: " + ", ".join(f"rank {r}: {_gib(p)}" for r, p in enumerate(b.rank_peaks))
                     + f" of {_gib(b.capacity)}")
    if not lp.tp_collectives_recorded:
        lines.append("note: no profile records tensor-parallel collectives: none priced")
    if lp.proven and b is None:
        lines.append("proven: no combination fits every rank" + (" or runs" if refused else ""))
    elif lp.proven:
        lines.append(("proven" if lp.within_s <= 0 else f"proven within {seconds(lp.within_s)}")
                     + ": every other combination is slower, refuted by a lower bound or does not fit"
                     + (f"; {refused} refused (the rows say why)" if refused else "")
                     + ("" if lp.within_s <= 0 else "; another split could expose less data-parallel "
                        "communication, by at most that"))
    else:
        unknown = sum(1 for r in lp.rows if r.status == "unknown")
        open_ = sum(1 for r in lp.rows if r.status != "unknown" and not r.proven)
        lines.append(f"not proven: the time limit stopped {unknown} combination(s) before a split was found and "
                     f"{open_} before their split was proven optimal")
    lines.append("")
    # cp and ep columns only where some row has context or expert parallelism
    cp, ep = any(r.layout.cp > 1 for r in lp.rows), any(r.layout.ep > 1 for r in lp.rows)
    # the schedule column where the search tried several (each row one schedule and chunk count)
    schedules = any(r.layout.schedule for r in lp.rows)
    lines.append(f"{'tp':>3} " + f"{'cp':>3} " * cp + f"{'ep':>3} " * ep
                 + f"{'pp':>3} {'dp':>4} {'zero':>4} {'M':>5} " + f"{'schedule':<20} " * schedules
                 + f"{'status':<8} {'step':>10} {'S':>4}  why")
    for r in lp.rows:
        lines.append(_row(r, cp, ep, schedules))
    return "\n".join(lines) + "\n"


def _row(r: LayoutRow, cp: bool = False, ep: bool = False, schedules: bool = False) -> str:
    lay = r.layout
    step = seconds(r.step_s) if r.step_s is not None else "-"
    degrees = f"{lay.tp:>3}" + f" {lay.cp:>3}" * cp + f" {lay.ep:>3}" * ep
    schedule = f"{lay.schedule_text:<20} " if schedules else ""
    return (f"{degrees} {lay.pp:>3} {lay.dp:>4} {lay.zero:>4} {lay.micro_batches:>5} {schedule}{r.status:<8} "
            f"{step:>10} {lay.micro_batch_size:>4}  {r.reason}")



def _row_json(r: LayoutRow) -> dict[str, Any]:
    lay = r.layout
    return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "zero": lay.zero, "micro_batches": lay.micro_batches,
            "micro_batch_size": lay.micro_batch_size, "status": r.status, "reason": r.reason, "step_s": r.step_s,
            "pipeline_s": r.pipeline_s,
            "tp_comm_s": r.tp_comm_s, "dp_comm_s": r.dp_comm_s, "bubble": r.bubble, "rank_peaks": list(r.rank_peaks),
            "capacity": r.capacity, "proven": r.proven, "schedule": r.schedule or lay.schedule or None,
            "chunks_per_rank": r.chunks_per_rank or lay.chunks_per_rank or None, "cp": lay.cp, "cp_comm_s": r.cp_comm_s,
            "ep": lay.ep, "ep_comm_s": r.ep_comm_s, "dp_gap_s": r.dp_gap_s}


def layouts_json(lp: LayoutPlan) -> dict[str, Any]:
    req = lp.request
    return {"gpus": req.gpus, "gpus_per_node": req.node.gpus_per_node, "target": req.target.name,
            "global_batch": req.global_batch, "micro_batch_size": req.micro_batch_size,
            "captured_batch": req.captured_batch, "captured_from": req.captured_from,
            "recorded_batch": req.recorded_batch,
            "schedule": req.schedule,
            "best": _row_json(lp.best) if lp.best is not None else None,
            # the best row's split: as solve prints it, and each stage's first and last layer (indices)
            "split": lp.plan.split_text if lp.plan is not None else None,
            "stages": [[s.first_layer, s.last_layer] for s in lp.plan.stages] if lp.plan is not None else None,
            "samples_per_s": lp.samples_per_s, "tokens_per_s_per_gpu": lp.tokens_per_s_per_gpu, "mfu": lp.mfu,
            "proven": lp.proven, "within_s": lp.within_s, "tp_collectives_recorded": lp.tp_collectives_recorded,
            "rows": [_row_json(r) for r in lp.rows]}


def gpu_sweep_table(sweep: GpuSweep) -> Table:
    """One row per GPU count: its best layout and schedule (``x V`` where it runs ``V`` chunks per
    device), step, samples/s and tokens/s per GPU, MFU, and whether the search proved it; a count
    with no layout says why."""
    t = Table("GPU-count sweep (layouts)", [
        Column("gpus", "id"), Column("fits"), Column("tp", "id"), Column("pp", "id"), Column("dp", "id"),
        Column("zero", "id"), Column("M", "int"), Column("S", "int", 1), Column("schedule"),
        Column("step (ms)", "compute"),
        Column("samples/s per GPU", "float", 2), Column("tokens/s per GPU", "int"), Column("MFU", "percent"),
        Column("proven", "text", 3), Column("why")])
    for r in sweep.rows:
        lp = r.plan
        proven = "yes" if lp is not None and lp.proven else "no"
        if lp is None or lp.best is None:
            t.add(r.gpus, "unknown" if r.unknown else "no", *([None] * 11), proven,
                  r.refused or (_none_fits(lp) if lp is not None else ""))
            continue
        b, lay = lp.best, lp.best.layout
        assert b.step_s is not None and lp.samples_per_s is not None
        tokens = round(lp.tokens_per_s_per_gpu) if lp.tokens_per_s_per_gpu is not None else None
        schedule = b.schedule + (f" x{b.chunks_per_rank}" if b.chunks_per_rank > 1 else "")
        t.add(r.gpus, "yes", lay.tp, lay.pp, lay.dp, lay.zero, lay.micro_batches, lay.micro_batch_size, schedule,
              b.step_s * 1e3,
              lp.samples_per_s / r.gpus, tokens, lp.mfu, proven, None)
    return t


def _none_fits(lp: LayoutPlan) -> str:
    """Why a search found no layout: its rows counted by status, in the order of their first row."""
    counts: dict[str, int] = {}
    for r in lp.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    return "no layout: " + ", ".join(f"{n} {status}" for status, n in counts.items())


def gpu_sweep_json(sweep: GpuSweep) -> dict[str, Any]:
    """Every count's whole search (``layouts_json``), or why it has none, the fewest GPUs found to fit,
    and the fewer counts whose search the time limit left unknown."""
    return {"fewest_gpus": sweep.fewest, "unsettled_below_fewest": sweep.unsettled(sweep.fewest),
            "rows": [{"gpus": r.gpus, "fits": r.fits, "unknown": r.unknown, "refused": r.refused or None,
                      "layouts": layouts_json(r.plan) if r.plan is not None else None} for r in sweep.rows]}


def _compared_cells(name: str, lp: LayoutPlan | None, refused: str, chosen: LayoutPlan) -> list[str]:
    """One compared layout's cells: its layout, step, tokens/s per GPU, step over the chosen one's,
    and whether it fits (else the first rank that does not, why it was not laid out, or, where the
    time limit stopped some of its combinations before a split was found, that it is unknown: one of
    those may fit)."""
    if lp is None:
        return [name, "-", "-", "-", "-", f"not laid out: {refused}"]
    b = lp.best
    if b is None:
        lay = lp.rows[0].layout.describe() if lp.rows else "-"
        unknown = sum(1 for r in lp.rows if r.status == "unknown")
        if unknown:
            return [name, lay, "-", "-", "-", f"unknown: the time limit stopped {unknown} of its {len(lp.rows)} "
                    "combination(s) before a split was found"]
        worst = next((r for r in lp.rows if r.status == "memory"), None)
        why = worst.reason if worst is not None else _none_fits(lp)
        return [name, lay, "-", "-", "-", f"does not fit: {why}"]
    assert b.step_s is not None
    tokens = f"{lp.tokens_per_s_per_gpu:,.0f}" if lp.tokens_per_s_per_gpu is not None else "-"
    ratio = "-"
    if chosen.best is not None and chosen.best.step_s:
        ratio = f"{b.step_s / chosen.best.step_s:.2f}x"
    # a looped schedule's chunks per device (a published configuration's virtual stages) beside the degrees
    looped = f", {b.schedule} with {b.chunks_per_rank} chunks per device" if b.chunks_per_rank > 1 else ""
    return [name, b.layout.describe() + looped, seconds(b.step_s), tokens, ratio, "fits"]


def comparison_text(cmp: Comparison) -> str:
    """The compared layouts beside the search's choice: a row each (plan/layout_compare.py)."""
    rows = [["layout", "degrees", "step", "tokens/s per GPU", "vs chosen", "fits"],
            _compared_cells("stagesplit's choice", cmp.chosen, "", cmp.chosen)]
    for r in cmp.rows:
        name = r.name + (f" (best of {r.tried})" if r.tried > 1 else "")
        rows.append(_compared_cells(name, r.plan, r.refused, cmp.chosen))
    widths = [max(len(row[k]) for row in rows) for k in range(5)]
    lines = ["compared layouts (the same model, cluster and global batch):"]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5])
    lines.append("sources: " + "; ".join(f"{r.name}: {r.source}" for r in cmp.rows))
    lines += [f"note: {note}" for note in cmp.notes]
    return "\n".join(lines) + "\n"


def comparison_json(cmp: Comparison) -> dict[str, Any]:
    """The search's whole answer and each compared layout's (``layouts_json``), or why it has none."""
    return {"chosen": layouts_json(cmp.chosen),
            "compared": [{"name": r.name, "source": r.source, "tried": r.tried, "refused": r.refused or None,
                          "step_s": r.step_s, "layouts": layouts_json(r.plan) if r.plan is not None else None}
                         for r in cmp.rows], "notes": list(cmp.notes)}

