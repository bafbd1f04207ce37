"""Plots for people: each stage's memory by category against its capacity, the time (or
compute) of each stage, on an IPU each stage's per-tile memory, the device-count sweep, and
the memory over the steps of the fullest stage. Headless (no pyplot state), PNG or SVG chosen
by the file suffix, written atomically.

Units and words follow the device (reporting/units.py): GiB and "device" on a one-tile GPU
profile, KiB/MiB per tile on an IPU. Long titles wrap instead of running off the figure; stage
labels are turned when they would overlap.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..common.fileio import atomic_write_bytes
from ..common.text import escape_surrogates
from ..errors import StagesplitError
from ..plan.records import Plan
from .why import stage_times

__all__ = ["CATEGORY_COLORS", "CATEGORY_LABELS", "FORMATS", "byte_scale", "figure_of", "liveness_figure", "plan_figure",
           "plot_liveness", "plot_plan", "plot_sweep", "save_figure", "sweep_figure"]

CATEGORY_LABELS = {"always_live": "always-live variables", "not_always_live": "not-always-live variables (peak)",
                   "stashed_copies": "stashed activations of extra micro-batches", "vertex_code": "vertex code",
                   "vertex_state": "vertex state", "exchange_code": "exchange code", "control_code": "control code"}
#: on a GPU the same categories in a PyTorch user's words
GPU_CATEGORY_LABELS = {"always_live": "weights, gradients, optimizer state",
                       "not_always_live": "activations and temporaries (peak)",
                       "stashed_copies": "stashed activations of extra micro-batches"}
CATEGORY_COLORS = {"always_live": "#1f77b4", "not_always_live": "#aec7e8", "stashed_copies": "#9467bd",
                   "vertex_code": "#ff7f0e", "vertex_state": "#ffbb78", "exchange_code": "#2ca02c",
                   "control_code": "#98df8a"}
FORMATS = (".png", ".svg")
#: past this many stages each stage is not labelled and annotated one by one: the memory and
#: time are drawn as steps over the stage numbers, on a figure of bounded width (a plan of
#: 1,024 stages would otherwise be a 68,000-pixel-wide picture that takes a minute to draw)
MANY_STAGES = 48
#: the capacity line is drawn only when it is at most this many times the fullest stage: beyond,
#: it would squash every bar flat, and the axis title states the capacity instead
CAPACITY_SCALE = 4.0


def byte_scale(largest: float, gpu: bool) -> tuple[float, str]:
    """(divisor, unit) for an axis whose largest value is ``largest`` bytes: GiB on a GPU;
    KiB or MiB per tile on an IPU (binary units, as everywhere)."""
    if gpu:
        return 2.0**30, "GiB"
    if largest >= 2**20:
        return 2.0**20, "MiB"
    return 2.0**10, "KiB"


def _figure(width: float, height: float):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _check_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise StagesplitError(f"{path}: plots are written as PNG or SVG; use a .png or .svg file name")
    return path


def save_figure(fig, path: str | Path) -> None:
    """Write ``fig`` as PNG or SVG (by suffix), atomically."""
    path = _check_path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lower()[1:])
    atomic_write_bytes(path, buffer.getvalue())


def _clean_text(fig) -> None:
    from matplotlib.text import Text
    for text in fig.findobj(Text):          # lone surrogates (JSON escapes in names) cannot be drawn
        label = text.get_text()
        if isinstance(label, str) and not label.isascii():
            text.set_text(escape_surrogates(label))


def _wrap(text: str, width_inches: float, fontsize: float) -> str:
    """``text`` wrapped to the figure's width (about 0.6 of the font size per character)."""
    chars = max(20, int(width_inches * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars, break_long_words=True, break_on_hyphens=False)) or text


def _stage_labels(plan: Plan) -> list[str]:
    labels = []
    for s in plan.stages:
        span = s.layers[0] if len(s.layers) == 1 else f"{s.layers[0]}..{s.layers[-1]}"
        labels.append(escape_surrogates(f"{s.stage}: {span}"))
    return labels


def _set_stage_ticks(ax, x: np.ndarray, labels: list[str], width_inches: float, many: bool = False) -> None:
    """Stage labels under the bars, turned 35 degrees when side by side they would overlap;
    with ``many`` stages, the stage numbers on matplotlib's own ticks."""
    if many:
        ax.set_xlim(x[0] - 0.5, x[-1] + 0.5)
        ax.set_xlabel("stage")
        return
    longest = max((len(label) for label in labels), default=1)
    room = width_inches * 72 / max(len(labels), 1)            # points per stage
    fontsize = 8 if len(labels) <= 16 else 6
    if longest * 0.6 * fontsize <= room * 0.9:
        ax.set_xticks(x, labels, fontsize=fontsize)
    else:
        ax.set_xticks(x, labels, fontsize=fontsize, rotation=35, ha="right", rotation_mode="anchor")
    ax.set_xlabel("stage: layers")


def figure_of(plan: Plan):
    """``plan_figure`` drawn from the plan alone: on an IPU the tiles' bytes come from the cost
    model the plan keeps (none for a plan read from a file); nothing is solved again."""
    tiles = None
    if plan.analysis is not None and not plan.profile.one_tile:
        tiles = []
        for s in plan.stages:
            stage_model = plan.stage_model(s)
            assert stage_model is not None              # the plan keeps its cost model (checked above)
            tiles.append(stage_model.stage_memory(s.first_layer, s.last_layer).total(s.in_flight))
    return plan_figure(plan, tiles)


def plan_figure(plan: Plan, tile_totals: Sequence[np.ndarray] | None = None, title: str | None = None):
    """The plan as a matplotlib Figure: each stage's memory by category against its capacity;
    on an IPU, each stage's per-tile memory (``tile_totals``: the tiles' bytes per stage); and
    each stage's time (or compute), the bottleneck in red."""
    if not plan.stages:
        raise StagesplitError("the plan has no stages to plot (no split fits)")
    gpu = plan.profile.one_tile
    n = len(plan.stages)
    many = n > MANY_STAGES
    tiles = tile_totals is not None and not gpu and any(len(t) > 1 for t in tile_totals) and not many
    width = 16.0 if many else max(8.0, 0.6 * n + 4)
    fig = _figure(width, 10.5 if tiles else 7.5)
    axes = fig.subplots(3 if tiles else 2, 1)
    ax_bar, ax_time = axes[0], axes[-1]
    x = np.arange(n)
    labels = _stage_labels(plan)
    names = dict(CATEGORY_LABELS, **(GPU_CATEGORY_LABELS if gpu else {}))

    used = np.array([s.worst_tile_bytes for s in plan.stages], float)
    caps = np.array([s.capacity_bytes for s in plan.stages], float)
    scale, unit = byte_scale(max(used.max(), caps.max()), gpu)
    bottom = np.zeros(n)
    edges = np.arange(n + 1) - 0.5
    for key in CATEGORY_LABELS:
        values = np.array([getattr(s.memory_at_worst_tile, key) for s in plan.stages], float) / scale
        if values.any():
            if many:
                ax_bar.stairs(bottom + values, edges, baseline=bottom.copy(), fill=True, color=CATEGORY_COLORS[key],
                              label=names[key])
            else:
                ax_bar.bar(x, values, bottom=bottom, color=CATEGORY_COLORS[key], label=names[key], width=0.7)
            bottom += values
    share = used / np.maximum(caps, 1)
    for i, fraction in enumerate([] if many else share):
        ax_bar.annotate(f"{fraction:.1%}" if fraction < 0.1 else f"{fraction:.0%}", (x[i], bottom[i]), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
    where = "device memory" if gpu else "worst tile memory"
    if caps.max() <= CAPACITY_SCALE * max(used.max(), 1):
        ax_bar.step(np.concatenate([x - 0.5, [x[-1] + 0.5]]), np.concatenate([caps, [caps[-1]]]) / scale,
                    where="post", color="black", linestyle="--", linewidth=1.5,
                    label="capacity" if gpu else "capacity per tile")
        ax_bar.set_title(f"{where.capitalize()} of each stage, by category"
                         + ("" if many else " (% of capacity above each bar)"))
    else:
        cap_text = f"{caps.max() / scale:,.2f} {unit}" if gpu else f"{int(caps.max()):,} bytes per tile"
        ax_bar.set_title(f"{where.capitalize()} of each stage, by category\n("
                         + ("" if many else "% of capacity above each bar; ")
                         + f"the capacity, {cap_text}, is off the scale)", fontsize=10)
        ax_bar.set_ylim(0, max(bottom.max(), 1e-9) * 1.2)
    ax_bar.set_ylabel(f"{where} ({unit})")
    _set_stage_ticks(ax_bar, x, labels, width, many)
    ax_bar.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    if tiles:
        ax_tiles = axes[1]
        from matplotlib import colormaps
        cmap = colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"]
        if n > 20:
            cmap = cmap.resampled(n)
        assert tile_totals is not None                  # tiles are drawn only from them
        for i, totals in enumerate(tile_totals):
            ordered = np.sort(np.asarray(totals, float))[::-1] / scale
            ax_tiles.plot(np.arange(len(ordered)), ordered, color=cmap(i), linewidth=1.2, label=f"stage {i}")
        for cap in sorted(set(caps)):
            ax_tiles.axhline(cap / scale, color="black", linestyle="--", linewidth=1.5,
                             label="capacity per tile" if cap == caps.max() else None)
        ax_tiles.set_xlabel("tiles, sorted by memory (most loaded first)")
        ax_tiles.set_ylabel(f"memory per tile ({unit})")
        ax_tiles.set_title("How evenly each stage fills its tiles")
        ax_tiles.legend(fontsize=7, ncol=1 if n <= 16 else 2, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    times, seconds = stage_times(plan)
    values = np.array(times, float) * (1e3 if seconds else 1.0)
    ylabel = "stage time (ms)" if seconds else f"stage compute ({plan.compute_unit})"
    bottleneck = int(np.argmax(values)) if len(values) else 0
    if many:
        ax_time.stairs(values, edges, fill=True, color="#7f7f7f")
        ax_time.plot([bottleneck], [values[bottleneck]], "v", color="#d62728", markersize=8)
    else:
        colors = ["#d62728" if i == bottleneck else "#7f7f7f" for i in range(n)]
        ax_time.bar(x, values, color=colors, width=0.7)
    _set_stage_ticks(ax_time, x, labels, width, many)
    ax_time.set_ylabel(ylabel)
    ax_time.set_title(f"{'Time' if seconds else 'Compute'} of each stage (the bottleneck "
                      f"{'marked ' if many else ''}in red)")
    heading = title or (f"{plan.profile.name or 'profile'}: {len(plan.stages)} stages on {plan.devices} "
                        f"{'GPUs' if gpu else 'IPUs'}" + ("" if many else f", {plan.short_split_text(0)}"))
    fig.suptitle(_wrap(escape_surrogates(heading), width, 10), fontsize=10)
    _clean_text(fig)
    return fig


def plot_plan(plan: Plan, tile_totals: Sequence[np.ndarray] | None, path: str | Path, title: str | None = None) -> None:
    """``plan_figure`` written to ``path`` (.png or .svg)."""
    _check_path(path)                                   # refused before anything is drawn
    save_figure(plan_figure(plan, tile_totals, title), path)


def sweep_figure(rows: Sequence, title: str | None = None):
    """Bottleneck stage time (or compute) and the fullest stage's memory against the number of
    devices; shaded where nothing fits."""
    fig = _figure(8.0, 5.0)
    ax = fig.subplots()
    devices = [r.devices for r in rows]
    fits = [r.fits for r in rows]
    gpu = bool(rows) and rows[0].plan.profile.one_tile
    timed = all(r.plan.bottleneck is not None and r.plan.bottleneck.time_s is not None for r in rows if r.fits)
    if timed and any(fits):
        values = [max(stage_times(r.plan, True)[0]) * 1e3 if r.fits else np.nan for r in rows]
        label = "bottleneck stage time (ms)"
    else:
        values = [r.plan.bottleneck.stage_time if r.fits else np.nan for r in rows]
        label = f"bottleneck stage compute ({rows[0].plan.compute_unit if rows else ''})"
    memory = [100 * r.plan.worst_memory.worst_tile_bytes / r.plan.worst_memory.capacity_bytes if r.fits else np.nan
              for r in rows]
    ax.plot(devices, values, "o-", color="#1f77b4", label=label.split(" (")[0])
    ax.set_xlabel("devices")
    ax.set_ylabel(label, color="#1f77b4")
    ax2 = ax.twinx()
    what = "fullest stage's memory" if gpu else "fullest tile's memory"
    ax2.plot(devices, memory, "s--", color="#ff7f0e", label=f"{what} (% of capacity)")
    ax2.set_ylabel(f"{what} (% of capacity)", color="#ff7f0e")
    ax2.axhline(100, color="black", linestyle="--", linewidth=1)
    for n, (d, ok) in enumerate(zip(devices, fits)):
        if not ok:
            ax.axvspan(d - 0.4, d + 0.4, color="#d62728", alpha=0.15, label="no split fits" if n == 0 or fits[n - 1] else None)
    ax.set_ylim(bottom=0)
    ax2.set_ylim(0, max(110.0, np.nanmax(memory) * 1.05 if any(fits) else 110.0))
    ax.set_xticks(devices)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="lower left")
    ax.set_title(_wrap(escape_surrogates(title or "Devices sweep"), 8.0, 12))
    _clean_text(fig)
    return fig


def plot_sweep(rows: Sequence, path: str | Path, title: str | None = None) -> None:
    _check_path(path)
    save_figure(sweep_figure(rows, title), path)


def liveness_figure(steps_bytes: np.ndarray, in_stage: np.ndarray, always_live: int, code: int, capacity: int,
                    peak_step: int, title: str, gpu: bool = False, stashed: int = 0):
    """Memory over the steps (the device's on a GPU, one tile's on an IPU): code and always-live
    bands, not-always-live bytes on top, the stage's own steps shaded, capacity and peak marked."""
    fig = _figure(10.0, 4.8)
    ax = fig.subplots()
    steps = np.arange(len(steps_bytes))
    peak_total = code + always_live + stashed + (int(np.max(steps_bytes)) if len(steps_bytes) else 0)
    scale, unit = byte_scale(max(capacity, peak_total), gpu)
    base = np.full(len(steps), (code + always_live + stashed) / scale)
    if code:
        ax.fill_between(steps, 0, code / scale, color="#ff7f0e", alpha=0.6, step="post", label="code and vertex state")
    ax.fill_between(steps, code / scale, (code + always_live) / scale, color="#1f77b4", alpha=0.6, step="post",
                    label="weights, gradients, optimizer state" if gpu else "always-live variables")
    if stashed:
        ax.fill_between(steps, (code + always_live) / scale, base, color="#9467bd", alpha=0.6, step="post",
                        label="stashed activations of extra micro-batches")
    ax.fill_between(steps, base, base + steps_bytes / scale, color="#aec7e8", step="post",
                    label="activations and temporaries" if gpu else "not-always-live variables")
    outside = ~np.asarray(in_stage, bool)
    if outside.any():
        ax.fill_between(steps, 0, 1, where=outside, color="grey", alpha=0.12, step="post",
                        transform=ax.get_xaxis_transform(), label="steps of other stages")
    if capacity <= CAPACITY_SCALE * max(peak_total, 1):
        ax.axhline(capacity / scale, color="black", linestyle="--", linewidth=1.5,
                   label="capacity" if gpu else "capacity per tile")
    if peak_step >= 0:
        peak = (code + always_live + stashed + steps_bytes[peak_step]) / scale
        ax.plot([peak_step], [peak], "v", color="black", markersize=8, label=f"peak at step {peak_step}")
    ax.set_xlabel("step (one operation each)" if gpu else "program step")
    ax.set_ylabel(f"{'device' if gpu else 'tile'} memory ({unit})")
    ax.set_title(_wrap(escape_surrogates(title), 10.0, 12))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _clean_text(fig)
    return fig


def plot_liveness(steps_bytes: np.ndarray, in_stage: np.ndarray, always_live: int, code: int, capacity: int,
                  peak_step: int, path: str | Path, title: str, gpu: bool = False, stashed: int = 0) -> None:
    _check_path(path)
    save_figure(liveness_figure(steps_bytes, in_stage, always_live, code, capacity, peak_step, title, gpu, stashed),
                path)
