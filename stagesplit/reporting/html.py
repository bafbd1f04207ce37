"""A plan as one self-contained HTML page to share: the split and why, each stage's memory by
category against its capacity, the schedule as a timeline per rank and each rank's memory over
it, one row per layer, the comparison with the frameworks' defaults, and the export snippets.

Self-contained: the figures are PNG images inside the page (data: URLs), the style is inline,
there is no script, and a Content-Security-Policy forbids loading anything else, so the page
opens offline and requests nothing. Every text from the profile or plan (layer names, module
paths, the profile's name) is HTML-escaped: a layer named ``<script>`` shows as that text.
"""

from __future__ import annotations

import base64
import html
import io

from ..common.fileio import atomic_write_text
from ..common.text import escape_surrogates
from ..common.versions import VERSION
from ..errors import StagesplitError
from ..plan.records import Plan
from .plot import MANY_STAGES, plan_figure
from .summary import comparison_table, kept_back_line, layout_lines, stages_table
from .table import Table, formatted, gpu_view
from .timeline import (
    ChunkFigures,
    gantt_figure,
    rank_memory_figure,
    schedule_view,
    step_summary,
    step_text,
    summary_figure,
    too_large_to_draw,
)
from .units import device_words
from .why import compare_line, comparisons, why_line

__all__ = ["EXPORT_FORMATS", "report_html", "schedule_section", "schedule_text", "write_report"]

#: the export snippets a report shows: what a GPU user or an IPU user would run
EXPORT_FORMATS = {True: ("torch-pipelining", "deepspeed", "megatron", "torchtitan"),
                  False: ("poptorch", "popart", "tf-ipu", "optimum-ipu")}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 70rem;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem;
     border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
.sub { color: #555; margin-top: 0; } .why { background: #eef5ff; border-left: 4px solid #1f77b4;
       padding: 0.6rem 0.9rem; } .bad { color: #b00020; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.6rem 0; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: right; white-space: nowrap; }
th { background: #f4f4f6; } td.text, th.text { text-align: left; }
pre { background: #f6f8fa; padding: 0.8rem; overflow-x: auto; font-size: 0.8rem; border-radius: 4px; }
img { max-width: 100%; height: auto; display: block; margin: 0.6rem 0; }
.wide { overflow-x: auto; }
details summary { cursor: pointer; font-weight: 600; margin: 0.6rem 0; } .note { color: #555; font-size: 0.85rem; }
"""

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _e(text: object) -> str:
    """Escaped for HTML text and attributes; lone surrogates (JSON escapes) made printable."""
    return html.escape(escape_surrogates(str(text)), quote=True)


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(fig, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{_png(fig)}">'


def _table(table: Table) -> str:
    """A Table as an HTML table: the text renderer's cells, one <td> each, escaped."""
    headers, cells = formatted(table)
    kinds = ["text" if c.kind == "text" else "num" for c in table.columns]
    out = ['<div class="wide"><table>', "<tr>" + "".join(f'<th class="{k}">{_e(h)}</th>' for h, k in zip(headers, kinds)) + "</tr>"]
    for i in range(len(table.rows)):
        out.append("<tr>" + "".join(f'<td class="{k}">{_e(col[i])}</td>' for col, k in zip(cells, kinds)) + "</tr>")
    out.append("</table></div>")
    if table.note:
        out.append("".join(f'<p class="note">{_e(n)}</p>' for n in table.note.splitlines()))
    return "\n".join(out)


def _layers_table(plan: Plan, model) -> str:
    gpu = plan.profile.one_tile
    stage_of = {}
    for s in plan.stages:
        for layer in range(s.first_layer, s.last_layer + 1):
            stage_of[layer] = s
    paths = plan.module_paths if len(plan.module_paths) == len(plan.layer_names) else [None] * len(plan.layer_names)
    heads = ["#", "layer", "module", "stage", "device"]
    if model is not None:
        heads += ["memory alone (GiB)" if gpu else "worst tile alone (bytes)", f"compute ({plan.compute_unit})"]
    rows = ['<div class="wide"><table><tr>' + "".join(f'<th class="{"text" if h in ("layer", "module") else "num"}">{_e(h)}</th>'
                                    for h in heads) + "</tr>"]
    for i, name in enumerate(plan.layer_names):
        held = stage_of.get(i)
        cells = [str(i), name, paths[i] or "-", "-" if held is None else str(held.stage),
                 "-" if held is None else str(held.device)]
        if model is not None:
            alone = model.stage_memory(i, i).worst_bytes()
            cells += [f"{alone / 2**30:,.3f}" if gpu else f"{alone:,}", f"{model.layer_compute[i]:.4g}"]
        rows.append("<tr>" + "".join(f'<td class="{"text" if k in (1, 2) else "num"}">{_e(c)}</td>'
                                     for k, c in enumerate(cells)) + "</tr>")
    rows.append("</table></div>")
    return "\n".join(rows)


def _snippets(plan: Plan) -> str:
    from ..exporters import export_plan
    out = []
    for fmt in EXPORT_FORMATS[plan.profile.one_tile]:
        try:
            text = export_plan(plan, fmt)
            body = f"<pre><code>{_e(text)}</code></pre>"
        except StagesplitError as exc:
            body = f'<p class="bad">{_e(exc)}</p>'
        out.append(f"<details><summary>stagesplit export --to {_e(fmt)}</summary>{body}</details>")
    return "\n".join(out)


def schedule_text(plan: Plan, figures: ChunkFigures | None = None) -> str:
    """What the schedule section says beside its figures (see ``_schedule_drawing``)."""
    return _schedule_drawing(plan, figures)[0]


def _schedule_drawing(plan: Plan, figures: ChunkFigures | None = None):
    """(text, ScheduleView or None, StepSummary or None). The text says the step and bubble (the plan's own,
    to the digit the plan's summary prints), what the drawing is made of, and, where the step is
    too large to draw action by action, that only a summary is drawn and why. Raises
    StagesplitError where nothing can be drawn (no stages, a step that overflows)."""
    M = plan.inputs.micro_batches if plan.schedule is None else plan.schedule.micro_batches
    kind = plan.schedule.kind if plan.schedule is not None else plan.inputs.schedule.value
    too_large = too_large_to_draw(plan)
    if too_large:
        summary = step_summary(plan)
        step = step_text(summary.step_time, summary.unit)
        model = ("the schedule simulated" if summary.simulated else
                 "the stage model: M + P - 1 times the slowest stage")
        return (f"Step: {step} for {M:,} micro-batches with {kind} (bubble {summary.bubble:.1%}, {model}). "
                f"Not drawn action by action: {too_large}; the figure shows each rank's busy share of the step "
                "and its peak memory, as the plan records them.", None, summary)
    view = schedule_view(plan, figures)
    drawn = step_text(view.step_time, view.unit)
    if plan.schedule is not None and view.solved:
        s = plan.schedule
        step = step_text(s.step_time, view.unit)
        text = (f"Step: {step} for {M:,} micro-batches with {kind} (bubble {s.bubble:.1%}, the schedule simulated). "
                "The drawing is the solver's simulation of the schedule's own actions with the durations the plan "
                "records (each chunk's forward, backward and weight gradient, each transfer, each rank's optimizer "
                "step)")
        if drawn != step or f"{view.bubble:.1%}" != f"{s.bubble:.1%}":
            text += (f"; it gives a step of {drawn} (bubble {view.bubble:.1%}): this plan file does not record "
                     "every duration the step was solved with")
        return text + ". Each rank's memory over the step is drawn from the plan's stages.", view, None
    if plan.schedule is not None:
        s = plan.schedule
        return (f"Step: {step_text(s.step_time, view.unit)} for {M:,} micro-batches with {kind} (bubble "
                f"{s.bubble:.1%}, the schedule simulated). The drawing simulates the schedule with the per-chunk "
                f"figures given, which give a step of {drawn} (bubble {view.bubble:.1%}).", view, None)
    summary = step_summary(plan)
    return (f"This plan was solved with the stage model: its step is M + P - 1 = {M + len(plan.stages) - 1:,} times "
            f"its slowest stage, {step_text(summary.step_time, summary.unit)} for {M:,} micro-batches "
            f"(bubble {summary.bubble:.1%}). The drawing runs {view.schedule.kind.value} with each stage's time "
            f"split 1:2 between its forward and its backward (the plan records no schedule), which gives a step of "
            f"{drawn} (bubble {view.bubble:.1%}); each rank's memory is drawn from the plan's stages.", view, None)


def schedule_section(plan: Plan, figures: ChunkFigures | None = None) -> str:
    """The schedule's text and figures (``schedule_text``), or one line saying why none is drawn."""
    try:
        text, view, summary = _schedule_drawing(plan, figures)
        if view is None:
            images = [_img(summary_figure(summary), "each rank's busy share of the step and peak memory")]
        else:
            images = [_img(gantt_figure(view), "the schedule as a timeline per rank"),
                      _img(rank_memory_figure(view), "memory of each rank over the schedule's steps")]
    except StagesplitError as exc:
        return f'<p class="bad">not drawn: {_e(exc)}</p>'
    return f'<p class="note">{_e(text)}</p>\n' + "\n".join(images)


def report_html(plan: Plan, model=None, figures: ChunkFigures | None = None) -> str:
    """The page for ``plan``; ``model`` (the cost model it was solved on, ``plan.analysis`` by
    default) adds the "why" and per-layer figures; ``figures`` feeds the schedule drawings."""
    model = model if model is not None else plan.analysis
    gpu = plan.profile.one_tile
    words = device_words(plan.profile.tiles)
    name = plan.profile.name or "a profile"
    o = plan.inputs
    targets = ", ".join(sorted(set(o.target_names))) or plan.profile.target
    parts = [f"<h1>Pipeline plan for {_e(name)}{' (synthetic)' if plan.profile.synthetic else ''}</h1>",
             f'<p class="sub">{len(plan.layer_names)} layers on {plan.devices} x {_e(targets)}; objective '
             f"{_e(o.objective.value)}; schedule {_e(o.schedule.value)} with {o.micro_batches} micro-batches; "
             f"made by stagesplit {_e(plan.run.stagesplit or VERSION)}</p>",
             *(f'<p class="sub">{_e(line)}</p>' for line in [*layout_lines(plan), kept_back_line(plan)] if line)]
    summary = plan.summary(o.micro_batches, gpu=gpu).splitlines()
    parts.append(f"<h2>The split</h2><p><b>{_e(summary[0])}</b></p>")
    why = why_line(plan, model, words) if plan.stages else ""
    if why:
        parts.append(f'<p class="why">{_e(why)}</p>')
    parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in summary[1:]) + "</ul>")
    if plan.stages:
        table = stages_table(plan)
        parts.append(_table(gpu_view(table) if gpu else table))
        parts.append("<h2>Memory of each stage</h2>")
        tiles = None
        if model is not None and not gpu and len(plan.stages) <= MANY_STAGES:     # beyond: not drawn per tile
            tiles = []
            for s in plan.stages:
                stage_model = plan.stage_model(s) if plan.variant_models else model
                assert stage_model is not None          # a variant's plan keeps each variant's model
                tiles.append(stage_model.stage_memory(s.first_layer, s.last_layer).total(s.in_flight))
        parts.append(_img(plan_figure(plan, tiles), "memory of each stage by category, and each stage's time"))
        parts.append("<h2>The schedule</h2>")
        parts.append(schedule_section(plan, figures))
    parts.append("<h2>Layers</h2>")
    parts.append(_layers_table(plan, model))
    if plan.baselines and plan.stages:
        parts.append("<h2>Compared with what you would do otherwise</h2><ul>")
        parts += [f"<li>{_e(compare_line(c))}</li>" for c in comparisons(plan, plan.baselines, words)]
        parts.append("</ul>")
        parts.append(_table(comparison_table([plan] + plan.baselines, gpu=gpu)))
    if plan.stages:
        parts.append("<h2>Export</h2>")
        parts.append(_snippets(plan))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>stagesplit plan: {_e(name)}</title><style>{STYLE}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def write_report(plan: Plan, path, model=None, figures: ChunkFigures | None = None) -> None:
    """``report_html`` written to ``path`` atomically."""
    atomic_write_text(path, report_html(plan, model, figures))

