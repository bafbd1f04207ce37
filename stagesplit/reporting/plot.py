"""Plots for people: per-stage memory by category, per-tile memory of each stage, compute per
stage, the device-count sweep, and a tile's liveness over program steps. Headless (no pyplot
state), PNG or SVG chosen by the file suffix, written atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import StagesplitError
from ..common.fileio import atomic_write_bytes
from ..common.text import escape_surrogates
from ..plan.records import Plan

__all__ = ["CATEGORY_COLORS", "CATEGORY_LABELS", "FORMATS", "MB", "plot_liveness", "plot_plan", "plot_sweep"]

MB = 1e6
CATEGORY_LABELS = {"always_live": "always-live variables", "not_always_live": "not-always-live variables (peak)",
                   "stashed_copies": "stashed activations of extra micro-batches", "vertex_code": "vertex code",
                   "vertex_state": "vertex state", "exchange_code": "exchange code", "control_code": "control code"}
CATEGORY_COLORS = {"always_live": "#1f77b4", "not_always_live": "#aec7e8", "stashed_copies": "#9467bd",
                   "vertex_code": "#ff7f0e", "vertex_state": "#ffbb78", "exchange_code": "#2ca02c",
                   "control_code": "#98df8a"}
FORMATS = (".png", ".svg")


def _figure(width: float, height: float):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig, path: str | Path) -> None:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise StagesplitError(f"{path}: plots are written as PNG or SVG; use a .png or .svg file name")
    from matplotlib.text import Text
    for text in fig.findobj(Text):          # lone surrogates (JSON escapes in names) cannot be drawn
        label = text.get_text()
        if isinstance(label, str) and not label.isascii():
            text.set_text(escape_surrogates(label))
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lower()[1:])
    atomic_write_bytes(path, buffer.getvalue())


def _stage_labels(plan: Plan) -> list[str]:
    labels = []
    for s in plan.stages:
        span = s.layers[0] if len(s.layers) == 1 else f"{s.layers[0]}..{s.layers[-1]}"
        labels.append(escape_surrogates(f"{s.stage}\n({span})"))    # lone surrogates cannot be drawn
    return labels


def plot_plan(plan: Plan, tile_totals: Sequence[np.ndarray], path: str | Path, title: str | None = None) -> None:
    """Stacked memory of each stage's worst tile by category with the capacity line; each
    stage's per-tile memory (tiles sorted) with the capacity line; compute per stage."""
    if not plan.stages:
        raise StagesplitError("the plan has no stages to plot (no split fits)")
    n = len(plan.stages)
    fig = _figure(max(8.0, 0.55 * n + 4), 11.5)
    ax_bar, ax_tiles, ax_compute = fig.subplots(3, 1)
    x = np.arange(n)
    labels = _stage_labels(plan)
    bottom = np.zeros(n)
    for key, label in CATEGORY_LABELS.items():
        values = np.array([getattr(s.memory_at_worst_tile, key) for s in plan.stages], float) / MB
        if not values.any():
            continue
        ax_bar.bar(x, values, bottom=bottom, color=CATEGORY_COLORS[key], label=label, width=0.7)
        bottom += values
    caps = np.array([s.capacity_bytes for s in plan.stages], float) / MB
    ax_bar.step(np.concatenate([x - 0.5, [x[-1] + 0.5]]), np.concatenate([caps, [caps[-1]]]), where="post",
                color="black", linestyle="--", linewidth=1.5, label="capacity per tile")
    ax_bar.set_xticks(x, labels, fontsize=8 if n <= 16 else 6)
    ax_bar.set_xlabel("stage (layers)")
    ax_bar.set_ylabel("worst tile memory (MB)")
    ax_bar.set_title("Memory of each stage's worst tile, by category")
    ax_bar.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    cmap = _colormap(n)
    one_tile = all(len(t) == 1 for t in tile_totals)
    for i, totals in enumerate(tile_totals):
        ordered = np.sort(np.asarray(totals, float))[::-1] / MB
        if one_tile:
            ax_tiles.bar(i, ordered[0], color=cmap(i), width=0.7)
        else:
            ax_tiles.plot(np.arange(len(ordered)), ordered, color=cmap(i), linewidth=1.2, label=f"stage {i}")
    if one_tile:
        ax_tiles.step(np.concatenate([x - 0.5, [x[-1] + 0.5]]), np.concatenate([caps, [caps[-1]]]), where="post",
                      color="black", linestyle="--", linewidth=1.5, label="capacity")
        ax_tiles.set_xticks(x, labels, fontsize=8 if n <= 16 else 6)
        ax_tiles.set_xlabel("stage (layers)")
        ax_tiles.set_title("Device memory of each stage")
    else:
        for cap in sorted(set(caps)):
            ax_tiles.axhline(cap, color="black", linestyle="--", linewidth=1.5, label="capacity per tile" if cap == caps.max() else None)
        ax_tiles.set_xlabel("tiles, sorted by memory (most loaded first)")
        ax_tiles.set_title("Per-tile memory of each stage")
        ax_tiles.legend(fontsize=7, ncol=1 if n <= 16 else 2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_tiles.set_ylabel("memory (MB)")

    compute = np.array([s.compute for s in plan.stages], float)
    seconds = [s.time_s for s in plan.stages]
    if all(t is not None for t in seconds):
        values, ylabel = np.array(seconds, float) * 1e3, "stage time (ms)"
    else:
        values, ylabel = compute, f"compute ({plan.compute_unit})"
    bottleneck = int(np.argmax(values)) if len(values) else 0
    colors = ["#d62728" if i == bottleneck else "#7f7f7f" for i in range(n)]
    ax_compute.bar(x, values, color=colors, width=0.7)
    ax_compute.set_xticks(x, labels, fontsize=8 if n <= 16 else 6)
    ax_compute.set_xlabel("stage (layers)")
    ax_compute.set_ylabel(ylabel)
    ax_compute.set_title("Compute per stage (bottleneck in red)")
    fig.suptitle(title or f"{plan.profile.name or 'profile'}: {plan.short_split_text(140)}", fontsize=10)
    _save(fig, path)


def _colormap(n: int):
    from matplotlib import colormaps
    return colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"].resampled(max(n, 1))


def plot_sweep(rows: Sequence, path: str | Path, title: str | None = None) -> None:
    """Bottleneck compute and worst memory against the number of devices; ✗ where nothing fits."""
    fig = _figure(8.0, 5.0)
    ax = fig.subplots()
    devices = [r.devices for r in rows]
    fits = [r.fits for r in rows]
    compute = [r.plan.bottleneck.compute if r.fits else np.nan for r in rows]
    memory = [100 * r.plan.worst_memory.worst_tile_bytes / r.plan.worst_memory.capacity_bytes if r.fits else np.nan
              for r in rows]
    unit = rows[0].plan.compute_unit if rows else ""
    ax.plot(devices, compute, "o-", color="#1f77b4", label="bottleneck stage compute")
    ax.set_xlabel("devices")
    ax.set_ylabel(f"bottleneck compute ({unit})", color="#1f77b4")
    ax2 = ax.twinx()
    ax2.plot(devices, memory, "s--", color="#ff7f0e", label="worst memory (% of capacity)")
    ax2.set_ylabel("worst tile memory (% of capacity)", color="#ff7f0e")
    ax2.axhline(100, color="black", linestyle="--", linewidth=1)
    for n, (d, ok) in enumerate(zip(devices, fits)):
        if not ok:
            ax.axvspan(d - 0.4, d + 0.4, color="#d62728", alpha=0.15, label="no split fits" if n == 0 or fits[n - 1] else None)
    ax.set_ylim(bottom=0)
    ax2.set_ylim(0, max(110.0, np.nanmax(memory) * 1.05 if any(fits) else 110.0))
    ax.set_xticks(devices)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="lower left")
    ax.set_title(title or "Devices sweep")
    _save(fig, path)


def plot_liveness(steps_bytes: np.ndarray, in_stage: np.ndarray, always_live: int, code: int, capacity: int,
                  peak_step: int, path: str | Path, title: str) -> None:
    """One tile's memory over program steps: code and always-live bands, not-always-live bytes
    on top, the stage's own steps shaded, the capacity line and the peak marked."""
    fig = _figure(10.0, 4.8)
    ax = fig.subplots()
    steps = np.arange(len(steps_bytes))
    base = np.full(len(steps), (code + always_live) / MB)
    ax.fill_between(steps, 0, code / MB, color="#ff7f0e", alpha=0.6, step="post", label="code and vertex state")
    ax.fill_between(steps, code / MB, base, color="#1f77b4", alpha=0.6, step="post", label="always-live variables")
    ax.fill_between(steps, base, base + steps_bytes / MB, color="#aec7e8", step="post",
                    label="not-always-live variables")
    outside = ~np.asarray(in_stage, bool)
    if outside.any():
        ax.fill_between(steps, 0, 1, where=outside, color="grey", alpha=0.12, step="post",
                        transform=ax.get_xaxis_transform(), label="steps of other stages")
    ax.axhline(capacity / MB, color="black", linestyle="--", linewidth=1.5, label="capacity per tile")
    if peak_step >= 0:
        peak = (code + always_live + steps_bytes[peak_step]) / MB
        ax.plot([peak_step], [peak], "v", color="black", markersize=8, label=f"peak at step {peak_step}")
    ax.set_xlabel("program step")
    ax.set_ylabel("memory (MB)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)
