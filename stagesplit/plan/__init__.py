"""Plans: typed records of a split and what it was solved from (``records``), built from a
solved split (``build``), solved, compared and swept (``advise``), written and read (``files``)."""

from .files import read_plan, write_plan
from .records import PhaseRecord, Plan, PlanInputs, PlanProfile, PlanRun, StagePlan

__all__ = ["PhaseRecord", "Plan", "PlanInputs", "PlanProfile", "PlanRun", "StagePlan", "read_plan", "write_plan"]
