"""Limits every loaded profile must meet, whichever reader made it: byte counts whose sums
cannot wrap int64 (a wrapped sum reads as a negative stage that "fits"), compute figures whose
sums stay finite, and a bounded step count. Checked once in ``load_profile``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..common.limits import MAX_BYTES, MAX_COMPUTE, MAX_STEPS
from ..errors import ProfileError
from .profile import Profile

__all__ = ["check_profile_limits"]


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask.reshape(-1))[0])


def _entry(field: str | Callable[[int], str], values: np.ndarray, k: int) -> str:
    """The field path of flat entry ``k``: ``variables[{}].bytes`` filled in, a function's path
    for entry k, or for a 2-d array both indices (``ground_truth.step_trace.bytes[1][4]``)."""
    if callable(field):
        return field(k)
    if "{}" in field:
        return field.format(k)
    if values.ndim == 2:
        return f"{field}[{k // values.shape[1]}][{k % values.shape[1]}]"
    return f"{field}[{k}]"


def _bytes(source: str | None, field: str | Callable[[int], str], values: np.ndarray) -> float:
    """Check one array of byte counts (``field`` names entry {} of it); return its sum (as a
    float: it cannot overflow)."""
    values = np.asarray(values)
    if values.size == 0:
        return 0.0
    if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        k = _first(~np.isfinite(values))
        raise ProfileError(source, _entry(field, values, k), "a finite byte count", values.reshape(-1)[k].item())
    if values.min() < 0:
        k = _first(values < 0)
        raise ProfileError(source, _entry(field, values, k), "a byte count >= 0", values.reshape(-1)[k].item())
    if values.max() > MAX_BYTES:
        k = _first(values > MAX_BYTES)
        raise ProfileError(source, _entry(field, values, k), f"a byte count <= {MAX_BYTES:,} (1 PiB)",
                           values.reshape(-1)[k].item())
    return float(values.sum(dtype=np.float64))


def _compute(source: str | None, field: str, values: np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    known = ~np.isnan(values)                # NaN: not known (the reader's marker for a missing figure)
    if not known.any():
        return 0.0
    if np.isinf(values).any():
        k = _first(np.isinf(values))
        raise ProfileError(source, _entry(field, values, k), "a finite compute figure", values[k].item())
    if (values < 0).any():
        k = _first(values < 0)
        raise ProfileError(source, _entry(field, values, k), "a compute figure >= 0", values[k].item())
    if (values > MAX_COMPUTE).any():
        k = _first(values > MAX_COMPUTE)
        raise ProfileError(source, _entry(field, values, k), f"a compute figure <= {MAX_COMPUTE:g}", values[k].item())
    with np.errstate(over="ignore"):
        total = float(values[known].sum())
    if not total <= MAX_COMPUTE:
        raise ProfileError(source, field.replace("[{}]", ""), f"compute figures summing to at most {MAX_COMPUTE:g} "
                           f"(these sum to {total:.3g})")
    return total


def _cost_path(programs: np.ndarray, category: str, column: int) -> Callable[[int], str]:
    """Entry k of a category's flat cost arrays as the JSON form names it: the program it belongs
    to, its place among that program's entries, and the bytes column
    (``programs[3].vertex_code[1][2]``). Worked out only for the entry an error names."""
    def path(k: int) -> str:
        program = int(programs[k])
        place = int(np.count_nonzero(programs[:k] == program))
        return f"programs[{program}].{category}[{place}][{column}]"
    return path


def check_profile_limits(profile: Profile, source: str | None) -> Profile:
    """Refuse a profile whose sizes or sums downstream arithmetic cannot hold exactly."""
    p = profile
    if p.num_steps > MAX_STEPS:
        raise ProfileError(source, "steps", f"at most {MAX_STEPS:,} steps", p.num_steps)
    total = _bytes(source, "variables[{}].bytes", p.variables.bytes)
    pr = p.programs
    total += _bytes(source, _cost_path(pr.vertex_code.program, "vertex_code", 2), pr.vertex_code.bytes)
    for cat, costs in pr.categories().items():
        total += _bytes(source, _cost_path(costs.program, cat, 1), costs.bytes)
    if total > MAX_BYTES:
        raise ProfileError(source, "variables and programs", f"byte counts summing to at most {MAX_BYTES:,} "
                           f"(1 PiB; these sum to {total:,.0f})")
    gt = p.ground_truth
    if gt is not None:
        arrays = {"ground_truth.always_live": gt.always_live, "ground_truth.not_always_live": gt.not_always_live,
                  "ground_truth.step_trace.bytes": gt.step_bytes}
        arrays.update({f"ground_truth.categories.{k}": v for k, v in gt.categories.items()})
        for field, values in arrays.items():
            if _bytes(source, field, values) > MAX_BYTES:
                raise ProfileError(source, field, f"byte counts summing to at most {MAX_BYTES:,} (1 PiB)")
    compute = _compute(source, "operations[{}].compute", p.operations.compute)
    compute += _compute(source, "programs[{}].cycles", pr.cycles)
    if not compute <= MAX_COMPUTE:
        raise ProfileError(source, "operations.compute and programs.cycles",
                           f"compute figures summing to at most {MAX_COMPUTE:g} (these sum to {compute:.3g})")
    return profile
