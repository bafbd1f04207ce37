"""The sweep over device counts: one solve per count on the priced ranges, each count's inputs
(its micro-batches, targets and what a GPU keeps back), and the rows as a table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, overload

from ..common.deadline import TimeLimitReached
from ..errors import OptionError, StagesplitError
from ..model.costmodel import RangeTable, StageCostModel
from ..model.traffic import layer_traffic
from ..solver.problem import SolveOptions
from .advise import Advice, advise, inputs_for
from .build import refused_plan
from .records import Plan, PlanInputs
from .scheduled import advise_schedule
from .search import price
from .text import fewest_text

if TYPE_CHECKING:
    import pandas as pd

    from ..model.phases import PhaseTable

__all__ = ["SweepResult", "SweepRow", "sweep", "sweep_options"]


@dataclass
class SweepRow:
    devices: int
    plan: Plan
    micro_batches: int

    @property
    def fits(self) -> bool:
        return self.plan.feasible

    @property
    def unknown(self) -> bool:
        """No split that fits was found, but the time limit came before the search settled it:
        one may fit."""
        return not self.fits and self.plan.status == "unknown"


@dataclass(repr=False)
class SweepResult:
    """The rows of a devices sweep, one per device count, in the order asked for. Behaves as a
    sequence of ``SweepRow`` (iterate, ``len``, index); ``frame()`` gives a pandas DataFrame and
    notebooks show it as a table."""

    rows: list[SweepRow] = field(default_factory=list)
    #: what the command line prints as warnings (the profile's, the grouping's)
    warnings: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[SweepRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> SweepRow: ...
    @overload
    def __getitem__(self, index: slice) -> SweepResult: ...
    def __getitem__(self, index: int | slice) -> SweepRow | SweepResult:
        """A row by position; a slice gives a ``SweepResult`` of those rows."""
        if isinstance(index, slice):
            return SweepResult(self.rows[index])
        return self.rows[index]

    def __repr__(self) -> str:
        fewest = self.fewest_devices
        return (f"SweepResult(devices {[r.devices for r in self.rows]}, "
                f"{f'fewest that fit: {fewest}' if fewest is not None else 'none fits'})")

    @property
    def fewest_devices(self) -> int | None:
        """The fewest device counts of the sweep whose plan fits (None if none does); fewer may fit
        where the time limit left their search unknown (``summary``)."""
        return min((r.devices for r in self.rows if r.fits), default=None)

    def summary(self) -> str:
        """The fewest devices found to fit, naming any fewer whose search the time limit left unknown
        (one may fit); else that no count fits, or that none was found to (``fewest_text``)."""
        return fewest_text("devices", "sweep", [r.devices for r in self.rows if r.fits],
                           [r.devices for r in self.rows if r.unknown])

    def frame(self) -> pd.DataFrame:
        """A pandas DataFrame with one row per device count (index ``devices``): ``fits``,
        ``stages`` (devices used), ``micro_batches``, ``status``, ``bottleneck_stage``,
        ``bottleneck_compute`` (in ``attrs["compute_unit"]``), ``bottleneck_time`` (compute
        unit, transfers included), ``bottleneck_time_s`` (NaN without seconds),
        ``efficiency`` (pipeline efficiency), ``bubble``, ``worst_memory`` (fullest stage's
        fraction of its capacity), ``worst_memory_bytes``, ``split`` and ``message``. A row whose
        plan has no split has ``stages`` 0, NaN figures and <NA> in the nullable Int64 columns."""
        from ..common.frames import frame
        from ..solver.problem import bubble_fraction
        rows = self.rows

        # f(row, bottleneck stage, fullest stage), both there where the row has a split; None: no split
        def each(f: Callable[[SweepRow, Any, Any], Any]) -> list[Any]:
            return [f(r, r.plan.bottleneck, r.plan.worst_memory) if r.plan.stages else None for r in rows]

        cols: dict[str, tuple[Iterable[Any], Any]] = {
            "fits": ([r.fits for r in rows], "bool"),
            "stages": ([len(r.plan.stages) for r in rows], "int64"),
            "micro_batches": ([r.micro_batches for r in rows], "int64"),
            "status": ([r.plan.status for r in rows], object),
            "bottleneck_stage": (each(lambda r, b, w: b.stage), "Int64"),
            "bottleneck_compute": (each(lambda r, b, w: b.compute), "float64"),
            "bottleneck_time": (each(lambda r, b, w: b.stage_time), "float64"),
            "bottleneck_time_s": (each(lambda r, b, w: b.time_s), "float64"),
            "efficiency": (each(lambda r, b, w: r.plan.pipeline_efficiency(r.micro_batches)), "float64"),
            "bubble": (each(lambda r, b, w: bubble_fraction(len(r.plan.stages), r.micro_batches)), "float64"),
            "worst_memory": (each(lambda r, b, w: w.worst_tile_bytes / w.capacity_bytes if w.capacity_bytes else None),
                             "float64"),
            "worst_memory_bytes": (each(lambda r, b, w: w.worst_tile_bytes), "Int64"),
            "split": ([r.plan.short_split_text() if r.plan.stages else None for r in rows], object),
            "message": ([r.plan.message for r in rows], object),
        }
        unit = rows[0].plan.compute_unit if rows else ""
        return frame(cols, index=("devices", [r.devices for r in rows], "int64"), attrs={"compute_unit": unit})

    def _repr_html_(self) -> str:
        """Notebook display: the fewest devices that fit, then the frame; names are escaped."""
        from ..common.frames import html_summary
        name = self.rows[0].plan.profile.name if self.rows else ""
        counts = [r.devices for r in self.rows]
        title = f"stagesplit devices sweep of {name or 'a profile'}" + \
            (f": {min(counts)}..{max(counts)} devices" if counts else "")
        lines = [self.summary()]
        if self.rows and self.rows[0].plan.notes:
            lines.append(f"note: {self.rows[0].plan.notes[0]}")
        return html_summary(title, lines, self.frame().to_html())


def sweep(model: StageCostModel, inputs: PlanInputs, device_counts: list[int], *,
          table: RangeTable | None = None, progress: Callable[[int, int], None] | None = None,
          on_row: Callable[[SweepRow], None] | None = None, phases: PhaseTable | None = None) -> SweepResult:
    """Solve for each device count (pricing every range once, unless ``table`` is given); the
    rows, in the order of ``device_counts``, as a ``SweepResult`` (a sequence of rows). With
    ``phases`` (a ``PhaseTable``) each count is solved under the schedule's own actions
    (``advise_schedule``)."""
    traffic = layer_traffic(model)
    if table is None and phases is None:
        table = price(model, sweep_options(inputs, device_counts), max_devices=max(device_counts), progress=progress)
    rows = []
    for n in device_counts:
        row_inputs = inputs_for(inputs, n)
        if phases is not None:
            try:
                advice = advise_schedule(model, row_inputs, table=phases, traffic=traffic)
            except TimeLimitReached as exc:                     # not known, not refused
                advice = Advice(plan=refused_plan(model, row_inputs, str(exc), status="unknown"), result=None,
                                problem=None)
            except (StagesplitError, OptionError) as exc:       # e.g. more chunks than layers
                advice = Advice(plan=refused_plan(model, row_inputs, str(exc)), result=None, problem=None)
        else:
            advice = advise(model, row_inputs, traffic=traffic, table=table)
        row = SweepRow(n, advice.plan, row_inputs.micro_batches)
        rows.append(row)
        if on_row:
            on_row(row)
    return SweepResult(rows)



def sweep_options(inputs: PlanInputs, device_counts: Sequence[int]) -> SolveOptions:
    """``inputs``' options for pricing the ranges of a sweep over ``device_counts``: what a GPU keeps
    back follows the device count (the pipeline's communicators), so the ranges are priced for the
    least any count keeps back (the largest capacity a row can have)."""
    o = inputs.options
    if inputs.runtime_reserve is None or not o.kept_back:
        return o
    least = min(min(inputs_for(inputs, n).options.kept_back) for n in device_counts)
    return replace(o, kept_back=(least,) * o.devices)
