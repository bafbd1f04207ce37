"""The layer grouping's default patterns (``layers.LayerOptions``), kept apart from the grouping
itself so that the command line can show them in its help without loading numpy."""

from __future__ import annotations

__all__ = ["DEFAULT_CALL_REGEX", "DEFAULT_FIRST_LAYER_REGEX", "DEFAULT_LAST_LAYER_REGEX", "DEFAULT_LAYER_REGEX"]

DEFAULT_LAYER_REGEX = r"(?i)(?:^|[/._:\-\s])(?:layers?|blocks?|encoder|decoder|h)[/._:\-]?(\d+)"
DEFAULT_FIRST_LAYER_REGEX = r"(?i)(embed|\bwte\b|\bwpe\b|\bstem\b)"
DEFAULT_LAST_LAYER_REGEX = r"(?i)(\bhead\b|lm_head|classifier|pooler|\bloss\b|\blogits\b|\bcls\b)"
DEFAULT_CALL_REGEX = r"(?i)^(?:call|function|$)"
