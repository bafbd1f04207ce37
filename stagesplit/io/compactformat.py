"""The compact profile format (``.stagesplit``): its one description, and its streaming writer.

The definitions live in ``pva_export.py``, the PopVision exporter that runs alone in the
Poplar SDK's Python (3.6+, standard library only): copied there by itself, it must carry the
format with it, and keeping them in that one file means there is no second description to
drift. This module gives them their own name inside the package; ``compact.py`` (the reader
and writer) and ``synth.py`` (which streams large profiles to disk) use them from here.
"""

from .pva_export import (
                         BOOL,
                         BYTES,
                         COLUMNS,
                         DESCR,
                         FLOAT64,
                         FORMAT,
                         GROUND_TRUTH,
                         HEADER_KEYS,
                         INFO_KEYS,
                         INFO_OPTIONAL_KEYS,
                         INT,
                         INT64,
                         KIND_LETTER,
                         OPTIONAL,
                         REQUIRED,
                         TARGET_KEYS,
                         VERSION,
                         Column,
                         CompactWriter,
                         Spill,
                         column_for,
                         header_bytes,
                         int_descr,
                         npy_header,
)

__all__ = ["BOOL", "BYTES", "COLUMNS", "DESCR", "FLOAT64", "FORMAT", "GROUND_TRUTH", "HEADER_KEYS", "INFO_KEYS",
           "INFO_OPTIONAL_KEYS",
           "INT", "INT64", "KIND_LETTER", "OPTIONAL", "REQUIRED", "TARGET_KEYS", "VERSION", "Column", "CompactWriter",
           "Spill", "column_for", "header_bytes", "int_descr", "npy_header"]
