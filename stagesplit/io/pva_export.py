"""Export a PopVision profile (profile.pop + debug.cbor) to a stagesplit compact file, in the
Poplar SDK's own Python.

libpva (the Python module ``pva``) exists only inside Graphcore's Poplar SDK, whose Python is
older than the 3.11 stagesplit needs. This one file runs there: Python 3.6 or newer, the
standard library and ``pva`` (numpy makes it faster where the SDK has it; it is never needed).
Copy it to the machine with the SDK and run, with the SDK enabled::

    python3 pva_export.py profile.pop debug.cbor -o model.stagesplit

then use ``model.stagesplit`` with stagesplit anywhere. The file holds the same Profile that
``stagesplit convert profile.pop debug.cbor -o model.stagesplit`` writes where stagesplit and
libpva share one Python (the tests check this on every report the libpva test double serves).

The file is also the one source of truth for what it shares with stagesplit itself, so that
copying it alone carries everything and nothing exists twice to drift:

* **the compact format** (``.stagesplit``): the header's fields, every array's name, kind,
  dimensions and order, the version, the ``.npy`` member layout and the streaming writer.
  ``stagesplit.io.compactformat`` re-exports these names; ``stagesplit.io.compact`` reads and
  writes through them (and ``stagesplit synth`` streams its large profiles through the writer);
* **debug.cbor**: a small CBOR decoder for what Poplar writes there and the rules that turn a
  debug context into a record (``stagesplit.io.debugcbor`` reads through them);
* **the libpva rules** stagesplit's own PopVision reader (``stagesplit.io.popvision``) applies
  too: operation naming, liveness-interval cleaning, memory categories, compute estimates.

It reads the report in bounded memory: per-variable and per-tile columns go to temporary files
as they are read (no Python object per variable is kept), and only what the operations need to
look variables up (their ids) stays in memory. Progress goes to stderr.
"""

import array
import collections
import json
import math
import os
import struct
import sys
import tempfile
import time
import zipfile

try:                                   # optional: faster per-tile work where the SDK has it
    import numpy
except ImportError:                    # pragma: no cover - exercised by forcing NUMPY = None
    numpy = None                       # type: ignore[assignment]  # the standard-library path

NUMPY = numpy                          # tests set this to None to run the standard-library path

__all__ = ["FORMAT", "VERSION", "Column", "COLUMNS", "HEADER_KEYS", "TARGET_KEYS", "INFO_KEYS", "INFO_OPTIONAL_KEYS", "column_for",
           "header_bytes", "int_descr", "npy_header", "CompactWriter", "Spill", "export", "main"]


# ==============================================================================================
# The compact format
# ==============================================================================================

FORMAT = "stagesplit-compact"
VERSION = 1

#: kinds of array. INT: integers, stored in the narrowest of int8/16/32/64 that holds them all
#: (readers widen them); INT64, FLOAT64: stored as such; BOOL: one byte per value; BYTES: uint8
#: (the JSON header and the UTF-8 string blobs)
INT, INT64, FLOAT64, BOOL, BYTES = "int", "int64", "float64", "bool", "bytes"
#: whether an array must be present: always; only when the header's ground_truth_categories is
#: not null; or optional (absent reads as the documented default)
REQUIRED, GROUND_TRUTH, OPTIONAL = "required", "ground truth", "optional"

#: numpy's name for each stored type (the .npy header's 'descr'): little-endian, as numpy writes
DESCR = {"int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8", "float64": "<f8", "bool": "|b1",
         "uint8": "|u1"}
#: numpy's dtype kind letter of each kind of array (what a reader checks)
KIND_LETTER = {INT: "i", INT64: "i", FLOAT64: "f", BOOL: "b", BYTES: "u"}
_INT_RANGES = (("int8", -2 ** 7, 2 ** 7 - 1), ("int16", -2 ** 15, 2 ** 15 - 1), ("int32", -2 ** 31, 2 ** 31 - 1))


class Column(object):
    """One array of a compact file: ``name`` (the zip member is ``name + ".npy"``; a ``{k}`` in
    it stands for 0, 1, 2, ...), its kind, its number of dimensions, when it is present, and
    what it holds."""

    __slots__ = ("name", "kind", "ndim", "presence", "doc")

    def __init__(self, name, kind, ndim, presence, doc):
        self.name, self.kind, self.ndim, self.presence, self.doc = name, kind, ndim, presence, doc

    def __repr__(self):
        return "Column(%r, %r, %d, %r)" % (self.name, self.kind, self.ndim, self.presence)


def _strings(key, doc, presence=REQUIRED):
    """A list of strings: one UTF-8 blob and the offsets of each string in it."""
    return (Column(key + "_blob", BYTES, 1, presence, doc + ": UTF-8 text, one string after another"),
            Column(key + "_offsets", INT64, 1, presence, doc + ": where each string starts in the blob, and its end"))


#: Every array, in the order a file stores them (writers write them in this order). A new
#: optional field is one more OPTIONAL entry here (and a default in the reader).
COLUMNS = (
    (Column("header", BYTES, 1, REQUIRED, "the JSON header (HEADER_KEYS)"),)
    + _strings("steps", "program step names, in execution order")
    + _strings("names", "variable names")
    + (Column("var_bytes", INT, 1, REQUIRED, "bytes of each lowered variable"),
       Column("var_tile", INT, 1, REQUIRED, "its tile"),
       Column("var_always_live", BOOL, 1, REQUIRED, "whether it is always live"),
       Column("var_live_class", INT, 1, REQUIRED, "its liveness class (-1: always or never live)"),
       Column("var_name", INT, 1, REQUIRED, "its name in names (-1: none)"),
       Column("live_offsets", INT64, 1, REQUIRED, "each liveness class's first interval, and the end"),
       Column("live_intervals", INT, 2, REQUIRED, "(K, 2) half-open [start, end) step intervals"))
    + _strings("program_name", "program names")
    + _strings("program_kind", "program types (OnTileExecute, DoExchange, ...)")
    + _strings("vertex_types", "vertex type names")
    + (Column("program_cycles", FLOAT64, 1, REQUIRED, "each program's cycle estimate (NaN: unknown)"),
       Column("program_vertices", INT, 1, REQUIRED, "vertex instances each program runs"),
       Column("vertex_code_program", INT, 1, REQUIRED, "vertex code: program"),
       Column("vertex_code_tile", INT, 1, REQUIRED, "vertex code: tile"),
       Column("vertex_code_type", INT, 1, REQUIRED, "vertex code: vertex type"),
       Column("vertex_code_bytes", INT, 1, REQUIRED, "vertex code: bytes"))
    + tuple(Column("%s_%s" % (cat, part), INT, 1, REQUIRED, "%s: %s" % (cat.replace("_", " "), part))
            for cat in ("vertex_state", "exchange_code", "control_code") for part in ("program", "tile", "bytes"))
    + _strings("op_name", "operation names")
    + _strings("op_layer", "explicit layer names of operations ('' where op_has_layer is false)")
    + (Column("op_has_layer", BOOL, 1, REQUIRED, "whether an operation states its layer"),)
    + _strings("op_inputs", "input tensor names of every operation, one operation after another")
    + (Column("op_inputs_count", INT, 1, REQUIRED, "how many inputs each operation has"),
       Column("op_debug_id", INT64, 1, REQUIRED, "debug-context id of each operation"),
       Column("op_first_step", INT, 1, REQUIRED, "first step, inclusive (-1: unknown)"),
       Column("op_last_step", INT, 1, REQUIRED, "last step, inclusive (-1: unknown)"),
       Column("op_compute", FLOAT64, 1, REQUIRED, "compute in compute_unit (NaN: from its programs)"),
       Column("op_vars_offsets", INT64, 1, REQUIRED, "each operation's first entry in op_vars, and the end"),
       Column("op_vars", INT, 1, REQUIRED, "the variables operations use"),
       Column("op_programs_offsets", INT64, 1, REQUIRED, "each operation's first entry in op_programs, and the end"),
       Column("op_programs", INT, 1, REQUIRED, "the programs operations run"),
       Column("op_bytes_accessed", FLOAT64, 1, OPTIONAL, "bytes each operation reads and writes (absent or NaN: "
                                                          "unknown)"),
       Column("op_phase", INT, 1, OPTIONAL, "each operation's phase: 0 unknown, 1 forward, 2 backward for inputs, "
                                            "3 backward for weights, 4 optimizer, 5 recompute (absent: all 0)"),
       Column("var_role", INT, 1, OPTIONAL, "each variable's role: 0 unknown, 1 parameter, 2 gradient, "
                                            "3 optimizer state, 4 buffer, 5 other (absent: roles not recorded)"),
       Column("gt_always_live", INT64, 1, GROUND_TRUTH, "ground truth: always-live variable bytes per tile"),
       Column("gt_not_always_live", INT64, 1, GROUND_TRUTH, "ground truth: peak not-always-live bytes per tile"),
       Column("gt_step_tiles", INT64, 1, GROUND_TRUTH, "ground truth: the traced tiles"),
       Column("gt_step_bytes", INT, 2, GROUND_TRUTH, "ground truth: not-always-live bytes per traced tile and step"),
       Column("gt_category_{k}", INT64, 1, GROUND_TRUTH, "ground truth: bytes per tile of category k of the "
                                                          "header's ground_truth_categories"))
)

#: the header (a JSON object in the array ``header``): its keys in the order written
HEADER_KEYS = ("format", "version", "target", "compute_unit", "info", "ground_truth_categories")
TARGET_KEYS = ("name", "kind", "tiles", "bytes_per_tile", "clock_hz", "link_bytes_per_s", "flops_per_s",
               "memory_bytes_per_s", "description")
INFO_KEYS = ("name", "source", "description", "synthetic", "compute_source", "warnings")
#: info keys a header may add after INFO_KEYS (absent: not recorded)
INFO_OPTIONAL_KEYS = ("layer_grouping", "parallel_layout", "precision", "batch_size")

_BY_NAME = dict((c.name, (i, c)) for i, c in enumerate(COLUMNS))


def _position(name):
    """(place in COLUMNS, Column) of an array name, or (None, None) for a name not in the format."""
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    base, _, number = name.rpartition("_")
    if number.isdigit() and (number == "0" or not number.startswith("0")):
        found = _BY_NAME.get(base + "_{k}")
        if found is not None:
            return found
    return None, None


def column_for(name):
    """The Column of an array name (``gt_category_3`` -> ``gt_category_{k}``), or None."""
    return _position(name)[1]


def header_bytes(target, compute_unit, info, ground_truth_categories):
    """The ``header`` array's bytes: JSON with HEADER_KEYS, ``target`` and ``info`` holding
    exactly TARGET_KEYS and INFO_KEYS (in that order, whatever order the mappings have)."""
    for keys, optional, given, what in ((TARGET_KEYS, (), target, "target"),
                                        (INFO_KEYS, INFO_OPTIONAL_KEYS, info, "info")):
        if not set(keys) <= set(given) <= set(keys) | set(optional):
            raise ValueError("%s: expected the keys %s, got %s" % (what, ", ".join(keys), ", ".join(sorted(given))))
    info_keys = INFO_KEYS + tuple(k for k in INFO_OPTIONAL_KEYS if k in info)
    values = (FORMAT, VERSION, _ordered(target, TARGET_KEYS), compute_unit, _ordered(info, info_keys),
              None if ground_truth_categories is None else list(ground_truth_categories))
    return json.dumps(_ordered(dict(zip(HEADER_KEYS, values)), HEADER_KEYS)).encode("ascii")


def _ordered(mapping, keys):
    """``mapping``'s items in the order of ``keys`` (json.dumps keeps an OrderedDict's order)."""
    return collections.OrderedDict((k, mapping[k]) for k in keys)


def int_descr(low, high):
    """The stored type of INT values from ``low`` to ``high`` (empty: int32, as numpy keeps it)."""
    if low is None:
        return DESCR["int32"]
    for name, least, most in _INT_RANGES:
        if least <= low and high <= most:
            return DESCR[name]
    return DESCR["int64"]


def npy_header(descr, shape):
    """The ``.npy`` header numpy (2.x) writes for a C-ordered array of type ``descr`` and
    ``shape``: format 1.0, its dict padded with spaces (numpy's room for the first dimension
    to grow to 21 digits, then to a multiple of 64 bytes) and a newline."""
    shape = tuple(int(n) for n in shape)
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    if shape:
        text += " " * (21 - len(repr(shape[0])))
    length = len(text) + 1
    pad = 64 - ((6 + 2 + 2 + length) % 64)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", length + pad) + text.encode("latin1") + b" " * pad + b"\n"


# ----------------------------------------------------------------------------------------------
# Typed values without numpy: array.array typecodes per stored type

_TYPECODE = {"|i1": "b", "<i2": "h", "<i4": "i", "<i8": "q", "<f8": "d", "|u1": "B", "|b1": "B"}
_ITEMSIZE = {"|i1": 1, "<i2": 2, "<i4": 4, "<i8": 8, "<f8": 8, "|u1": 1, "|b1": 1}
_BIG_ENDIAN = sys.byteorder == "big"


def _typed(values, descr):
    """``values`` as one contiguous block of ``descr`` items, little-endian: a numpy array or an
    array.array (what goes into a .npy member)."""
    np = NUMPY
    if np is not None:
        return np.ascontiguousarray(np.asarray(values).astype(descr, copy=False))
    code = _TYPECODE[descr]
    if isinstance(values, array.array) and values.typecode == code:
        out = values
    else:
        out = array.array(code, values if descr != "|b1" else (1 if v else 0 for v in values))
    if _BIG_ENDIAN and _ITEMSIZE[descr] > 1:
        out = array.array(code, out)
        out.byteswap()
    return out


def _raw(block):
    """The bytes of a numpy array or an array.array, without a copy."""
    return memoryview(block).cast("B")


class Spill(object):
    """A column of numbers written to a temporary file as it is produced and read back once,
    when the compact file is written: readers of a report produce all columns of a row at once,
    while a compact file stores one column after another. Keeps the count and, for integers,
    the smallest and largest value. Integers are kept in the narrowest type that holds them so
    far (the file is rewritten in a wider type when a value needs it), so the file is as small
    as the stored array and needs no conversion when it is written."""

    #: values gathered in memory before they are written out together
    PENDING_ITEMS = 1 << 20

    def __init__(self, kind, directory=None):
        if kind not in (INT, INT64, FLOAT64, BOOL):
            raise ValueError("a Spill holds integers, floats or booleans, not %r" % (kind,))
        self.kind = kind
        #: the type values are kept in: int8 first for INT, widened as values need it
        self.descr = {INT: "|i1", INT64: "<i8", FLOAT64: "<f8", BOOL: "|b1"}[kind]
        self.count = 0
        self.low = self.high = None
        self._pending = []
        self._pending_items = 0
        self._directory = directory
        self._file = tempfile.TemporaryFile(prefix="stagesplit-", dir=directory)

    def extend(self, values):
        """Append a numpy array, an array.array or a list of numbers."""
        block = _typed(values, "<i8" if self.kind == INT else self.descr)
        n = len(block)
        if not n:
            return
        self._pending.append(block)
        self._pending_items += n
        self.count += n
        if self._pending_items >= self.PENDING_ITEMS:
            self._flush()

    def _flush(self):
        pending, self._pending, self._pending_items = self._pending, [], 0
        if not pending:
            return
        if self.kind in (INT, INT64):
            if NUMPY is not None:
                joined = NUMPY.concatenate(pending) if len(pending) > 1 else pending[0]
                lows, highs = [int(joined.min())], [int(joined.max())]
                pending = [joined]
            else:
                lows, highs = [min(b) for b in pending], [max(b) for b in pending]
            low, high = min(lows), max(highs)
            self.low = low if self.low is None else min(self.low, low)
            self.high = high if self.high is None else max(self.high, high)
            if self.kind == INT:
                wanted = int_descr(self.low, self.high)
                if _ITEMSIZE[wanted] > _ITEMSIZE[self.descr]:
                    self._widen(wanted)
        for block in pending:
            self._file.write(_raw(_typed(block, self.descr)))

    def _widen(self, descr):
        """Rewrite what the file holds in the wider type ``descr``."""
        old, old_descr = self._file, self.descr
        old.flush()
        old.seek(0)
        self._file = tempfile.TemporaryFile(prefix="stagesplit-", dir=self._directory)
        self.descr = descr
        size = _ITEMSIZE[old_descr]
        while True:
            data = old.read(size << 20)
            if not data:
                break
            self._file.write(_raw(_typed(_from_bytes(data, old_descr), descr)))
        old.close()

    def blocks(self, items=1 << 20):
        """The values in blocks of at most ``items`` (numpy arrays or array.arrays), in
        ``descr``."""
        self._flush()
        self._file.flush()
        self._file.seek(0)
        size = _ITEMSIZE[self.descr]
        left = self.count
        while left:
            n = min(items, left)
            data = self._file.read(n * size)
            if len(data) != n * size:
                raise IOError("a temporary file was cut short")
            left -= n
            yield _from_bytes(data, self.descr)

    def range(self):
        """(smallest, largest) value so far, or (None, None) when empty (integers only)."""
        self._flush()
        return self.low, self.high

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _from_bytes(data, descr):
    """Little-endian ``descr`` items in ``data`` as a numpy array or an array.array."""
    if NUMPY is not None:
        return NUMPY.frombuffer(data, descr)
    block = array.array(_TYPECODE[descr])
    block.frombytes(data)
    if _BIG_ENDIAN and _ITEMSIZE[descr] > 1:
        block.byteswap()
    return block


class CompactWriter(object):
    """Writes a compact file array by array, each in blocks, into a seekable binary file.

    The members are written as numpy's ``savez_compressed`` writes them (deflated, zip64, no
    timestamp), so a file holds the same bytes whichever writer made it. Arrays must come in
    COLUMNS order; ``close`` checks that every required one was written."""

    BLOCK_ITEMS = 1 << 20

    def __init__(self, fileobj):
        self._zip = zipfile.ZipFile(fileobj, "w", zipfile.ZIP_DEFLATED, allowZip64=True)
        self._last = -1
        self._last_name = None
        self.names = []

    # -- one member ------------------------------------------------------------------------
    def _member(self, name, descr, shape, blocks):
        place, column = _position(name)
        if column is None:
            raise ValueError("%s is not an array of the compact format" % name)
        if place < self._last or (place == self._last and "{k}" not in column.name):
            raise ValueError("%s written after %s: arrays go in COLUMNS order" % (name, self._last_name))
        if descr[1:] not in _allowed_types(column.kind):
            raise ValueError("%s: a %s array cannot be stored as %s" % (name, column.kind, descr))
        if len(shape) != column.ndim:
            raise ValueError("%s: expected %d dimensions, got shape %r" % (name, column.ndim, tuple(shape)))
        self._last, self._last_name = place, name
        expected = _ITEMSIZE[descr]
        for n in shape:
            expected *= int(n)
        info = zipfile.ZipInfo(name + ".npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        written = 0
        with self._zip.open(info, "w", force_zip64=True) as out:
            out.write(npy_header(descr, shape))
            for block in blocks:
                raw = _raw(block)
                out.write(raw)
                written += len(raw)
        if written != expected:
            raise ValueError("%s: %d bytes of data for shape %r, expected %d" % (name, written, tuple(shape),
                                                                                 expected))
        self.names.append(name)

    # -- arrays by kind ---------------------------------------------------------------------
    def raw_bytes(self, name, data):
        """A BYTES array holding ``data``."""
        self._member(name, DESCR["uint8"], (len(data),), [data])

    def strings(self, key, items):
        """A list of strings as ``key_blob`` and ``key_offsets`` (lone surrogates kept)."""
        offsets = array.array("q", [0])
        parts = []
        total = 0
        for s in items:
            encoded = s.encode("utf-8", "surrogatepass")
            parts.append(encoded)
            total += len(encoded)
            offsets.append(total)
        self.raw_bytes(key + "_blob", b"".join(parts))
        self.values(key + "_offsets", offsets)

    def values(self, name, values, shape=None):
        """A numeric array from a numpy array, an array.array, a list or a Spill; INT arrays are
        stored in the narrowest integer type that holds them. ``shape`` defaults to (count,);
        a 2-d numpy array gives its own."""
        column = column_for(name)
        if column is None:
            raise ValueError("%s is not an array of the compact format" % name)
        if isinstance(values, Spill):
            low, high = values.range()
            count = values.count
            source = values.blocks(self.BLOCK_ITEMS)
        else:
            if shape is None and hasattr(values, "shape"):
                shape = tuple(values.shape)
            flat = values.reshape(-1) if hasattr(values, "reshape") else values
            count = len(flat)
            low = high = None
            if column.kind == INT and count:
                if hasattr(flat, "min"):
                    low, high = int(flat.min()), int(flat.max())
                else:
                    low, high = min(flat), max(flat)
            source = (flat[i:i + self.BLOCK_ITEMS] for i in range(0, count, self.BLOCK_ITEMS))
        descr = {INT: None, INT64: DESCR["int64"], FLOAT64: DESCR["float64"], BOOL: DESCR["bool"],
                 BYTES: DESCR["uint8"]}[column.kind]
        if descr is None:
            descr = int_descr(low, high)
        if shape is None:
            shape = (count,)
        self._member(name, descr, shape, (_typed(block, descr) for block in source))

    def close(self):
        missing = [c.name for c in COLUMNS if c.presence == REQUIRED and c.name not in self.names]
        self._zip.close()
        if missing:
            raise ValueError("a compact file needs the arrays " + ", ".join(missing))


def _allowed_types(kind):
    if kind == INT:
        return ("i1", "i2", "i4", "i8")
    return {INT64: ("i8",), FLOAT64: ("f8",), BOOL: ("b1",), BYTES: ("u1",)}[kind]


# ==============================================================================================
# debug.cbor: a CBOR decoder for what Poplar writes, and what a debug context holds
# ==============================================================================================

DEBUG_SHAPE = "one CBOR map with stringTable and contexts (a Poplar debug.cbor)"
#: layer -> (field holding the user-level operation name, field holding its type)
USER_OP_FIELDS = {"xla_op": ("op_name", "op_type"), "onnx": ("opName", "opType"), "poptorch": ("op_name", "op_type")}
#: layer -> (field holding input tensor names, field holding output tensor names)
TENSOR_FIELDS = {"onnx": ("input", "output"), "popart": ("inputs", "outputs")}
#: what a debug context record holds, in this order (``context_record``)
CONTEXT_FIELDS = ("id", "index", "name", "parent", "layer", "category", "op_name", "op_type", "inputs", "outputs",
                  "instance_id", "file", "function", "line")


class CborError(ValueError):
    """Not CBOR, or CBOR this decoder does not read."""


class CborEOF(CborError):
    """The data ends inside an item."""


class DebugShapeError(ValueError):
    """A debug.cbor item that is not what Poplar writes: ``field`` (a path such as
    ``contexts[3].name``), what was ``expected`` there, and what was found (``got``)."""

    def __init__(self, field, expected, got=None):
        ValueError.__init__(self, "%s: expected %s%s" % (field, expected, "" if got is None else ", got %r" % (got,)))
        self.field, self.expected, self.got = field, expected, got


_BREAK = object()
_SIMPLE = {20: False, 21: True, 22: None, 23: None}
_FLOATS = {25: ">e", 26: ">f", 27: ">d"}


class CborReader(object):
    """Reads CBOR items (RFC 8949) from a binary stream: integers, byte and text strings,
    arrays and maps (definite or indefinite length), tags (the tagged item is returned),
    false/true/null/undefined and floats: what Poplar's debug.cbor holds. ``head()`` reads
    only an item's head, so a long array can be walked one element at a time."""

    MAX_DEPTH = 200

    def __init__(self, stream):
        self.stream = stream

    def _read(self, n):
        data = self.stream.read(n)
        if len(data) != n:
            raise CborEOF("the data ends inside an item (%d of %d bytes)" % (len(data), n))
        return data

    def at_end(self):
        return self.stream.read(1) == b""

    def head(self):
        """(major type, argument) of the next item. The argument is None for an indefinite
        length (and a break); a float's head is (7, the float)."""
        initial = self._read(1)[0]
        major, info = initial >> 5, initial & 31
        if info < 24:
            return major, info
        if major == 7 and info in _FLOATS:
            return 7, float(struct.unpack(_FLOATS[info], self._read(1 << (info - 24)))[0])
        if info < 28:
            return major, int.from_bytes(self._read(1 << (info - 24)), "big")
        if info == 31 and major in (2, 3, 4, 5, 7):
            return major, None
        raise CborError("invalid initial byte 0x%02x" % initial)

    def item(self, depth=0):
        """The next item, decoded."""
        return self._value(self.head(), depth)

    def _value(self, head, depth):
        if depth > self.MAX_DEPTH:
            raise CborError("items nested more than %d deep" % self.MAX_DEPTH)
        major, arg = head
        if major == 0:
            return arg
        if major == 1:
            return -1 - arg
        if major in (2, 3):
            return self._string(major, arg)
        if major == 4:
            return list(self.elements(arg, depth))
        if major == 5:
            out = {}
            for key in self.elements(arg if arg is None else 2 * arg, depth, pairs=True):
                if isinstance(key, (list, dict)):
                    raise CborError("a map key that is an array or a map")
                out[key] = self._element(depth)
            return out
        if major == 6:
            return self.item(depth + 1)
        if isinstance(arg, float):
            return arg
        if arg is None:
            return _BREAK
        if arg in _SIMPLE:
            return _SIMPLE[arg]
        raise CborError("simple value %d" % arg)

    def _string(self, major, arg):
        if arg is None:
            parts = []
            while True:
                m, a = self.head()
                if m == 7 and a is None:
                    break
                if m != major or a is None or isinstance(a, float):
                    raise CborError("a chunk of an indefinite-length string of another type")
                parts.append(self._read(a))
            data = b"".join(parts)
        else:
            data = self._read(arg)
        if major == 2:
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CborError("text that is not UTF-8 (%s)" % exc)

    def _element(self, depth):
        value = self.item(depth + 1)
        if value is _BREAK:
            raise CborError("a break where an item belongs")
        return value

    def elements(self, count, depth=0, pairs=False):
        """The elements of an array whose head gave ``count`` (None: up to a break); with
        ``pairs``, the keys of a map (the caller reads each value)."""
        if count is not None:
            for _ in range(count // 2 if pairs else count):
                yield self._element(depth)
            return
        while True:
            value = self.item(depth + 1)
            if value is _BREAK:
                return
            yield value


def decode_cbor(data):
    """One CBOR item from ``data`` (bytes), which must hold exactly that item."""
    import io
    reader = CborReader(io.BytesIO(data))
    value = reader.item()
    if value is _BREAK:
        raise CborError("a break outside an indefinite-length item")
    if not reader.at_end():
        raise CborError("more data after the first CBOR object")
    return value


class ContextRules(object):
    """Turns the decoded debug contexts of one debug.cbor into records (tuples of
    CONTEXT_FIELDS): a context's id is its ``id`` field or else its index; strings may be
    inline or string-table indices. Raises DebugShapeError naming the field at fault."""

    def __init__(self, table):
        if not isinstance(table, list):
            raise DebugShapeError("stringTable", "an array of strings", None if table is None else _type_name(table))
        for k, value in enumerate(table):
            if not isinstance(value, str):
                raise DebugShapeError("stringTable[%d]" % k, "a string", value)
        self.table = table

    def text(self, value, field):
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if 0 <= value < len(self.table):
                return self.table[value]
            raise DebugShapeError(field, "a string or an index into stringTable (0..%d)" % (len(self.table) - 1), value)
        raise DebugShapeError(field, "a string or a string-table index", value)

    def names(self, value, field):
        if value is None:
            return ()
        if not isinstance(value, list):
            value = [value]
        out = []
        for k, item in enumerate(value):
            name = self.text(item, "%s[%d]" % (field, k))
            if name:
                out.append(name)
        return tuple(out)

    @staticmethod
    def integer(value, field):
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise DebugShapeError(field, "an integer", value)

    def record(self, ctx, i):
        """The record (CONTEXT_FIELDS) of context ``i``."""
        where = "contexts[%d]" % i
        if not isinstance(ctx, dict):
            raise DebugShapeError(where, "a map (one debug context)", ctx)
        cid = self.integer(ctx.get("id"), where + ".id")
        layer = self.text(ctx.get("layer"), where + ".layer") or ""
        op_field, type_field = USER_OP_FIELDS.get(layer, (None, None))
        in_field, out_field = TENSOR_FIELDS.get(layer, ("inputs", "outputs"))
        location = ctx.get("location")
        if location is not None and not isinstance(location, dict):
            raise DebugShapeError(where + ".location", "a map with fileName, functionName and lineNumber", location)
        location = location or {}
        instance = ctx.get("instanceId")
        parent = self.integer(ctx.get("parentId"), where + ".parentId")
        return (i if cid is None else cid, i, self.text(ctx.get("name"), where + ".name") or "",
                None if parent is None or parent < 0 else parent, layer,
                self.text(ctx.get("category"), where + ".category") or "",
                self.text(ctx.get(op_field), "%s.%s" % (where, op_field)) if op_field else None,
                self.text(ctx.get(type_field), "%s.%s" % (where, type_field)) if type_field else None,
                self.names(ctx.get(in_field), "%s.%s" % (where, in_field)),
                self.names(ctx.get(out_field), "%s.%s" % (where, out_field)),
                None if instance is None else str(instance),
                self.text(location.get("fileName"), where + ".location.fileName"),
                self.text(location.get("functionName"), where + ".location.functionName"),
                self.integer(location.get("lineNumber"), where + ".location.lineNumber"))


def _type_name(value):
    return {dict: "dict", list: "list", str: "str", bytes: "bytes", int: "int", float: "float",
            bool: "bool"}.get(type(value), type(value).__name__)


def debug_records(doc):
    """Every context record of a decoded debug.cbor document (a map)."""
    if not isinstance(doc, dict):
        raise DebugShapeError("", DEBUG_SHAPE, "a CBOR " + _type_name(doc))
    rules = ContextRules(doc.get("stringTable"))
    contexts = doc.get("contexts")
    if not isinstance(contexts, list):
        raise DebugShapeError("contexts", "an array of debug contexts",
                              None if contexts is None else _type_name(contexts))
    for i, ctx in enumerate(contexts):
        yield rules.record(ctx, i)


def read_debug_records(stream):
    """The context records of the debug.cbor in binary ``stream``, decoded a context at a time
    (a debug.cbor runs to hundreds of megabytes: the contexts are never all held as maps)."""
    reader = CborReader(stream)
    major, count = reader.head()
    if major == 7 and count is None:
        raise CborError("a break outside an indefinite-length item")
    if major != 5:
        raise DebugShapeError("", DEBUG_SHAPE, "a CBOR " + {0: "int", 1: "int", 2: "bytes", 3: "str", 4: "list",
                                                             6: "tag", 7: "simple value"}.get(major, "item"))
    table = None
    waiting = None                       # contexts met before the string table (decoded whole)
    found_contexts = False
    records = []
    for key in reader.elements(count if count is None else 2 * count, pairs=True):
        if key == "contexts" and table is not None and not found_contexts:
            found_contexts = True
            major, n = reader.head()
            if major != 4:
                raise DebugShapeError("contexts", "an array of debug contexts",
                                      _type_name(reader._value((major, n), 1)))
            rules = ContextRules(table)
            for i, ctx in enumerate(reader.elements(n, 1)):
                records.append(rules.record(ctx, i))
            continue
        value = reader._element(0)
        if key == "stringTable":
            table = value
        elif key == "contexts":
            waiting = value
            found_contexts = False
    if not reader.at_end():
        raise CborError("more data after the first CBOR object")
    if found_contexts:
        return records
    return list(debug_records({"stringTable": table, "contexts": waiting}))


def lineage(get, context_id):
    """The record of ``context_id`` and then its parents', nearest first: ``get(id)`` gives a
    record (with ``id`` and ``parent``) or None. Stops at a missing id or a cycle."""
    seen = set()
    record = get(context_id)
    while record is not None and record.id not in seen:
        seen.add(record.id)
        yield record
        record = None if record.parent is None else get(record.parent)


def user_op_name(get, context_id):
    """The nearest user-level operation name (the xla_op, onnx or poptorch layer's)."""
    for record in lineage(get, context_id):
        if record.op_name:
            return record.op_name
    return None


def nearest_inputs(get, context_id):
    """The nearest non-empty list of input tensor names."""
    for record in lineage(get, context_id):
        if record.inputs:
            return record.inputs
    return ()


# ==============================================================================================
# The libpva rules (stagesplit.io.popvision applies them too; its docstring explains them)
# ==============================================================================================

CYCLES_PER_VERTEX = 100.0
TRACE_TILES = 8
#: libpva memory category -> ground-truth category name
CATEGORIES = (("vertexCode", "vertex_code"), ("internalExchangeCode", "internal_exchange_code"),
              ("controlCode", "control_code"), ("vertexInstanceState", "vertex_instance_state"),
              ("vectorListDescriptor", "vector_list_descriptor"), ("globalExchangeCode", "global_exchange_code"),
              ("hostExchangeCode", "host_exchange_code"), ("constant", "constant"))


class ReportError(ValueError):
    """A report whose content stagesplit cannot use: ``field`` (a libpva path), what was
    ``expected`` there and what was found."""

    def __init__(self, field, expected, got=None):
        ValueError.__init__(self, "%s: expected %s%s" % (field, expected, "" if got is None else ", got %s" % (got,)))
        self.field, self.expected, self.got = field, expected, got


def one_line(exc):
    return " ".join(str(exc).split()) or type(exc).__name__


def load_json(text):
    """A debug context's JSON as a dict ({} when absent, not JSON or not an object)."""
    if not text or not isinstance(text, (str, bytes)):
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def as_text(value):
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else str(value)


def json_inputs(doc):
    inputs = doc.get("inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list):
        return ()
    return tuple(str(x) for x in inputs if isinstance(x, (str, int)) and not isinstance(x, bool) and str(x))


def operation_name(name, doc, user_op_name=None):
    """A name for operations libpva names ``""`` or ``"Call"``; other names are kept."""
    if name not in ("", "Call"):
        return name
    tensor = as_text(doc.get("tensorId"))
    instance = as_text(doc.get("instanceId"))
    suffix = "(%s)" % instance if instance else ""
    if name == "Call":
        return "Call" + suffix + ("/" + tensor if tensor else "")
    if tensor:
        return "Tensor%s/%s" % (suffix, tensor)
    if user_op_name:
        return user_op_name
    return "Anonymous" + suffix


def clean_intervals(raw, steps):
    """Half-open intervals clipped to [0, steps], empty ones dropped, sorted, touching or
    overlapping ones merged."""
    out = []
    for start, end in sorted((max(0, int(s)), min(steps, int(e))) for s, e in raw):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((s, e) for s, e in out)


def several_ipus_warning(ipus, replicas, tiles):
    return ("the profile spans %d IPU(s) and %d replica(s): only the first IPU's %d tiles (and the variables and "
            "code on them) were read" % (ipus, replicas, tiles))


NO_TILES_WARNING = ("the profile has no per-tile memory (compilation.tiles is empty): vertex code and ground truth "
                    "could not be read")


def compute_source(from_estimates, missing):
    """``info.compute_source``: from compile-time estimates (``missing`` programs without one)
    or from vertex counts."""
    if from_estimates:
        note = "; %d program(s) without an estimate count 0" % missing if missing else ""
        return "compile-time cycle estimates from the profile (per program, the most cycles on one tile)" + note
    return ("estimated from vertex counts: the most vertices on one tile x %s cycles per vertex (the profile has no "
            "compile-time cycle estimates)" % ("%g" % CYCLES_PER_VERTEX))


def operation_warnings(bad_steps, steps, unknown_vars):
    out = []
    if bad_steps:
        out.append("%d operation(s) had a step range outside the profile's %d steps; their steps were taken as "
                   "unknown" % (bad_steps, steps))
    if unknown_vars:
        out.append("%d variable reference(s) of operations were not among the lowered variables and were ignored"
                   % unknown_vars)
    return out


def reconcile(always, peak, categories, total):
    """Fit the ground truth to the report's own per-tile total (``total.excludingGaps``): the
    always-live *variable* bytes (returned, a list), an ``other`` category added to
    ``categories`` (a dict of per-tile lists) for bytes of the total in no figure, and a
    warning (or None). libpva's alwaysLiveBytes includes the code categories; a report follows
    that convention unless more of its tiles with code add up to the total with the categories
    added than without (a tie keeps libpva's)."""
    tiles = len(total)
    parts = [sum(values[t] for values in categories.values()) for t in range(tiles)]
    inside = sum(1 for t in range(tiles) if parts[t] > 0 and always[t] + peak[t] == total[t])
    separate = sum(1 for t in range(tiles) if parts[t] > 0 and always[t] + peak[t] + parts[t] == total[t])
    includes = inside >= separate
    if includes:
        variables = [always[t] - parts[t] for t in range(tiles)]
        other = [total[t] - always[t] - peak[t] for t in range(tiles)]
    else:
        variables = list(always)
        other = [total[t] - always[t] - peak[t] - parts[t] for t in range(tiles)]
    bad = sum(1 for t in range(tiles) if variables[t] < 0 or other[t] < 0)
    warning = None
    if bad:
        warning = ("ground truth: on %d tile(s) the report's figures do not add up to the tile's total "
                   "(total.excludingGaps) with alwaysLiveBytes taken to %s the code categories, as on most tiles"
                   % (bad, "includes" if includes else "excludes"))
    if any(x > 0 for x in other):
        categories["other"] = [max(x, 0) for x in other]
    return [max(x, 0) for x in variables], warning


def trace_tiles(tile_total, count=TRACE_TILES):
    """The ``count`` tiles with the largest total (ties: the lower tile first)."""
    return sorted(range(len(tile_total)), key=lambda t: -tile_total[t])[:count]


# ==============================================================================================
# The exporter
# ==============================================================================================

class _Context(object):
    """What operation naming needs of a debug context."""

    __slots__ = ("id", "parent", "op_name", "inputs")

    def __init__(self, record):
        self.id, self.parent, self.op_name, self.inputs = record[0], record[3], record[6], record[8]


class _Progress(object):
    """``done/total`` of the report's items on stderr: a line every 10% (or on a terminal, one
    line rewritten at most every half second)."""

    def __init__(self, stream, total):
        self.stream, self.total, self.done = stream, max(total, 1), 0
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.shown, self.last = -1, 0.0

    def tick(self, n=1):
        self.done += n
        if self.stream is None:
            return
        percent = min(100, self.done * 100 // self.total)
        now = time.time()
        if self.tty and (now - self.last >= 0.5 or self.done >= self.total):
            self.stream.write("\rpva_export: read %d%% of %d items" % (percent, self.total))
            self.last = now
        elif not self.tty and percent // 10 > self.shown:
            self.shown = percent // 10
            self.stream.write("pva_export: read %d%% of %d items\n" % (self.shown * 10, self.total))
        self.stream.flush()

    def finish(self):
        if self.stream is not None and self.tty:
            self.stream.write("\n")


def _per_tile(values, tiles, field, num_tiles, floats=False):
    """The first IPU's ``tiles`` entries of a per-tile array (None: all zero), as a numpy array
    or a list."""
    np = NUMPY
    if values is None:
        return np.zeros(tiles, np.float64 if floats else np.int64) if np is not None else [0] * tiles
    if np is not None:
        arr = np.asarray(values)
        if arr.ndim != 1 or len(arr) < tiles:
            raise ReportError(field, "%d values (one per tile)" % num_tiles,
                              "%s values" % (len(arr) if arr.ndim == 1 else (arr.shape,)))
        return arr[:tiles].astype(np.float64 if floats else np.int64)
    seq = list(values)
    if len(seq) < tiles:
        raise ReportError(field, "%d values (one per tile)" % num_tiles, "%d values" % len(seq))
    convert = float if floats else int
    return [convert(x) for x in seq[:tiles]]


def _nonzero(values):
    """(tiles, values) of the non-zero entries."""
    if NUMPY is not None and hasattr(values, "dtype"):
        where = NUMPY.flatnonzero(values)
        return where, values[where]
    where = [t for t, x in enumerate(values) if x]
    return where, [values[t] for t in where]


class _Rows(object):
    """Sparse per-tile rows of one cost category, spilled: key columns, tile, bytes."""

    def __init__(self, keys, directory):
        self.keys = [Spill(INT, directory) for _ in keys]
        self.tile = Spill(INT, directory)
        self.bytes = Spill(INT, directory)

    def add(self, values, *keys):
        tiles, nonzero = _nonzero(values)
        n = len(tiles)
        if not n:
            return
        for spill, key in zip(self.keys, keys):
            spill.extend([key] * n)
        self.tile.extend(tiles)
        self.bytes.extend(nonzero)

    def close(self):
        for spill in self.keys + [self.tile, self.bytes]:
            spill.close()


class Exporter(object):
    """Reads one report through libpva into spilled columns, then writes the compact file."""

    def __init__(self, pva, report, profile_path, debug_path=None, progress=None, directory=None):
        self.pva, self.report = pva, report
        self.path, self.debug_path = profile_path, debug_path
        self.progress_stream = progress
        self.directory = directory
        self.warnings, self.op_warnings = [], []
        self.part = "compilation"
        self.contexts = None
        self.spills = []

    def spill(self, kind):
        s = Spill(kind, self.directory)
        self.spills.append(s)
        return s

    def close(self):
        for s in self.spills:
            s.close()
        for rows in getattr(self, "rows", {}).values():
            rows.close()

    # -- the whole report --------------------------------------------------------------------
    def read(self):
        comp = self.report.compilation
        tgt = comp.target
        self.tiles = T = int(tgt.tilesPerIpu)
        self.num_tiles = int(tgt.numTiles)
        ipus = int(getattr(tgt, "numIPUs", 1) or 1)
        replicas = int(getattr(tgt, "numReplicas", 1) or 1)
        if T < 1:
            raise ReportError("compilation.target.tilesPerIpu", "an integer >= 1", T)
        if ipus > 1 or replicas > 1:
            self.warnings.append(several_ipus_warning(ipus, replicas, T))
        clock = float(getattr(tgt, "clockFrequency", 0) or 0)
        bytes_per_tile = int(tgt.bytesPerTile)
        name = os.path.basename(self.path)
        self.target = collections.OrderedDict([
            ("name", "ipu"), ("kind", "ipu"), ("tiles", T), ("bytes_per_tile", bytes_per_tile),
            ("clock_hz", clock if clock > 0 else None), ("link_bytes_per_s", None), ("flops_per_s", None),
            ("memory_bytes_per_s", None),
            ("description", "read from %s: %d IPU(s) of %d tiles x %s bytes" % (name, ipus, T,
                                                                                "{:,}".format(bytes_per_tile)))])
        self.part = "compilation.livenessProgramSteps"
        steps_raw = comp.livenessProgramSteps
        self.steps = [str(s.program.name) for s in steps_raw]
        self.S = len(self.steps)
        brief = comp.loweredVariables.allBriefVars
        programs = comp.programs
        operations = self.pva.OperationAnalysis(self.report).operations
        self.progress = _Progress(self.progress_stream, len(brief) + len(programs) + len(operations))
        if self.debug_path is not None:
            self.part = "debug.cbor"
            self._read_debug()
        self.part = "compilation.tiles"
        self._read_tiles(comp.tiles)
        self.part = "compilation.programs"
        self._read_programs(programs)
        self.part = "compilation.livenessProgramSteps"
        self._ground_truth(steps_raw)
        self.part = "compilation.loweredVariables.allBriefVars"
        self._read_variables(brief)
        self.part = "OperationAnalysis(report).operations"
        self._read_operations(operations)
        for prog in self.extra_programs:                    # programs only operations refer to
            self._add_program(prog, "programs[_id=%r]" % (prog._id,))
        self.progress.finish()

    # -- debug.cbor -------------------------------------------------------------------------------
    def _read_debug(self):
        with open(self.debug_path, "rb") as stream:
            records = read_debug_records(stream)
        self.contexts = {}
        for record in records:
            self.contexts[record[0]] = _Context(record)

    # -- tiles -------------------------------------------------------------------------------------
    def _read_tiles(self, tile_objs):
        T = self.tiles
        self.code_by_type = {}
        self.gt = None
        if len(tile_objs) < T:
            if len(tile_objs):
                raise ReportError("compilation.tiles", "%d tiles" % self.num_tiles, len(tile_objs))
            self.warnings.append(NO_TILES_WARNING)
            return
        first = tile_objs[0].memory.category
        present = [(camel, snake) for camel, snake in CATEGORIES if getattr(first, camel, None) is not None]
        gt = collections.OrderedDict([("always_live", [0] * T), ("not_always_live", [0] * T)])
        for _, snake in present:
            gt[snake] = [0] * T
        total, has_total = [0] * T, True
        for t in range(T):
            mem = tile_objs[t].memory
            gt["always_live"][t] = _integer(mem.alwaysLiveBytes)
            gt["not_always_live"][t] = _integer(mem.notAlwaysLiveBytes)
            whole = getattr(getattr(mem, "total", None), "excludingGaps", None) if has_total else None
            if whole is None:
                has_total = False
            else:
                total[t] = _integer(whole)
            cat = mem.category
            for camel, snake in present:
                gt[snake][t] = _integer(getattr(cat, camel).total)
            for v in mem.vertices:
                sizes = self.code_by_type.get(v.type.name)
                if sizes is None:
                    sizes = self.code_by_type[v.type.name] = [0] * T
                sizes[t] = _integer(v.codeBytes)
        if NUMPY is not None:
            self.code_by_type = dict((k, NUMPY.array(v, NUMPY.int64)) for k, v in self.code_by_type.items())
        self.gt = gt
        self.gt_total = total if has_total else None

    # -- programs ------------------------------------------------------------------------------------
    def _read_programs(self, programs):
        self.p_name, self.p_kind, self.p_estimate, self.p_fallback, self.p_vertices = [], [], [], [], []
        self.vertex_types, self.vertex_type_index = [], {}
        self.rows = collections.OrderedDict([("vertex_code", _Rows(("program", "type"), self.directory))])
        for cat in ("vertex_state", "exchange_code", "control_code"):
            self.rows[cat] = _Rows(("program",), self.directory)
        self.program_index = {}
        for i, prog in enumerate(programs):
            self.program_index[prog._id] = i
            self._add_program(prog, "compilation.programs[%d]" % i)
            self.progress.tick()
        self.n_listed = len(programs)
        self.extra_programs = []

    def _add_program(self, prog, field):
        p = len(self.p_name)
        T, np = self.tiles, NUMPY
        kind = str(prog.type.name)
        self.p_name.append(str(prog.name))
        self.p_kind.append(kind)
        if len(prog.children) == 0:
            self.rows["control_code"].add(self._tile_values(prog.controlCodeByTile, field + ".controlCodeByTile"), p)
        estimate = float("nan")
        count = np.zeros(T, np.int64) if np is not None else [0] * T
        if kind == "DoExchange":
            self.rows["exchange_code"].add(self._tile_values(prog.codeBytesByTile, field + ".codeBytesByTile"), p)
            estimate = self._estimate(getattr(prog, "estimatedCyclesByTile", None), field + ".estimatedCyclesByTile")
        elif kind == "OnTileExecute":
            cs = prog.computeset
            state = np.zeros(T, np.int64) if np is not None else [0] * T
            for k, vx in enumerate(cs.vertices):
                vtype = vx.type
                name = str(vtype.name)
                counts = self._tile_values(vx.countByTile, "%s.computeset.vertices[%d].countByTile" % (field, k))
                size = int(vtype.size)
                sizes = self.code_by_type.get(name)
                if np is not None:
                    count += counts
                    state += counts * size
                    code = np.where(counts > 0, sizes, 0) if sizes is not None else None
                    has_code = code is not None and code.any()
                else:
                    count = [a + b for a, b in zip(count, counts)]
                    state = [a + b * size for a, b in zip(state, counts)]
                    code = [s if c > 0 else 0 for s, c in zip(sizes, counts)] if sizes is not None else None
                    has_code = code is not None and any(code)
                if has_code:
                    t = self.vertex_type_index.get(name)
                    if t is None:
                        t = self.vertex_type_index[name] = len(self.vertex_types)
                        self.vertex_types.append(name)
                    self.rows["vertex_code"].add(code, p, t)
            self.rows["vertex_state"].add(state, p)
            estimate = self._estimate(getattr(cs, "estimatedCyclesByTile", None),
                                      field + ".computeset.estimatedCyclesByTile")
        self.p_estimate.append(estimate)
        self.p_vertices.append(int(sum(count)) if np is None else int(count.sum()))
        most = max([0] + count) if np is None else int(count.max(initial=0))
        self.p_fallback.append(float(most) * CYCLES_PER_VERTEX)
        return p

    def _tile_values(self, values, field):
        return _per_tile(values, self.tiles, field, self.num_tiles)

    def _estimate(self, values, field):
        if values is None or len(values) == 0:
            return float("nan")
        peak = max(float(x) for x in _per_tile(values, self.tiles, field, self.num_tiles, floats=True))
        peak = max(peak, 0.0)
        return peak if peak > 0 else float("nan")

    def _program_index(self, prog):
        key = prog._id
        idx = self.program_index.get(key)
        if idx is None:
            idx = self.program_index[key] = self.n_listed + len(self.extra_programs)
            self.extra_programs.append(prog)
        return idx

    # -- ground truth ----------------------------------------------------------------------------------
    def _ground_truth(self, steps_raw):
        if self.gt is None:
            return
        g = self.gt
        always, peak = g.pop("always_live"), g.pop("not_always_live")
        if self.gt_total is not None:
            always, warning = reconcile(always, peak, g, self.gt_total)
            if warning:
                self.warnings.append(warning)
        self.gt_always, self.gt_peak, self.gt_categories = always, peak, g
        self.gt_step_tiles, self.gt_step_bytes = [], []
        if self.S and hasattr(steps_raw[0], "notAlwaysLiveMemoryForTile"):
            total = [always[t] + peak[t] + sum(v[t] for v in g.values()) for t in range(self.tiles)]
            top = trace_tiles(total)
            rows = [array.array("q", [0] * self.S) for _ in top]
            for i, step in enumerate(steps_raw):
                for k, t in enumerate(top):
                    rows[k][i] = _integer(step.notAlwaysLiveMemoryForTile(t).bytes)
            self.gt_step_tiles, self.gt_step_bytes = top, rows

    # -- variables and liveness -------------------------------------------------------------------------
    def _read_variables(self, brief):
        T, S, num_tiles = self.tiles, self.S, self.num_tiles
        n = len(brief)
        self.var_ids = array.array("q")
        target = array.array("q")                         # index among the kept variables, -1: elsewhere
        v_bytes, v_tile = self.spill(INT), self.spill(INT)
        v_always, v_live = self.spill(BOOL), self.spill(INT)
        classes = {}                                      # class id -> (always, liveness class)
        self.patterns, self.intervals = {}, []
        kept = 0
        block = 1 << 16
        for start in range(0, n, block):
            b_bytes, b_tile, b_always, b_live = [], [], [], []
            for i in range(start, min(n, start + block)):
                var = brief[i]
                vid, nbytes, tile = _integer(var.id), _integer(var.bytes), _integer(var.tileId)
                cls = var.equivalenceClass
                cid = _integer(cls.id)
                if not 0 <= tile < num_tiles:
                    raise ReportError("loweredVariables.allBriefVars[%d].tileId" % i,
                                      "a tile index in 0..%d" % (num_tiles - 1), tile)
                self.var_ids.append(vid)
                if tile >= T:
                    target.append(-1)
                    continue
                target.append(kept)
                kept += 1
                found = classes.get(cid)
                if found is None:
                    found = classes[cid] = self._liveness(cls, S)
                b_bytes.append(nbytes)
                b_tile.append(tile)
                b_always.append(found[0])
                b_live.append(found[1])
            v_bytes.extend(b_bytes)
            v_tile.extend(b_tile)
            v_always.extend(b_always)
            v_live.extend(b_live)
            self.progress.tick(min(n, start + block) - start)
        self.columns_var = (v_bytes, v_tile, v_always, v_live)
        self.n_vars = kept
        self._index_ids(target)

    def _liveness(self, cls, steps):
        pattern = clean_intervals([(s.start, s.end) for s in cls.steps], steps)
        if steps == 0 or pattern == ((0, steps),):
            return True, -1
        if not pattern:
            return False, -1
        idx = self.patterns.get(pattern)
        if idx is None:
            idx = self.patterns[pattern] = len(self.intervals)
            self.intervals.append(pattern)
        return False, idx

    def _index_ids(self, target):
        """Sorted variable ids and the kept index of each, for the operations' look-ups."""
        ids = self.var_ids
        ascending = all(ids[i] < ids[i + 1] for i in range(len(ids) - 1)) if NUMPY is None else \
            bool(len(ids) < 2 or (NUMPY.diff(NUMPY.frombuffer(ids, NUMPY.int64)) > 0).all())
        if ascending:
            self.sorted_ids, self.sorted_target = ids, target
            return
        if NUMPY is not None:
            a = NUMPY.frombuffer(ids, NUMPY.int64)
            order = NUMPY.argsort(a, kind="stable")
            sorted_ids = a[order]
            dup = NUMPY.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
            if len(dup):
                raise ReportError("loweredVariables.allBriefVars.id", "distinct variable ids", int(sorted_ids[dup[0]]))
            self.sorted_ids = sorted_ids
            self.sorted_target = NUMPY.frombuffer(target, NUMPY.int64)[order]
            return
        order = sorted(range(len(ids)), key=ids.__getitem__)
        self.sorted_ids = array.array("q", (ids[i] for i in order))
        self.sorted_target = array.array("q", (target[i] for i in order))
        for i in range(len(order) - 1):
            if self.sorted_ids[i] == self.sorted_ids[i + 1]:
                raise ReportError("loweredVariables.allBriefVars.id", "distinct variable ids", self.sorted_ids[i])

    def _lookup(self, ids):
        """The kept index of each id (None: not a brief variable's id)."""
        import bisect
        if NUMPY is not None and len(self.sorted_ids):
            np = NUMPY
            ids = np.array(ids, np.int64)
            sorted_ids = self.sorted_ids if hasattr(self.sorted_ids, "dtype") else np.frombuffer(self.sorted_ids,
                                                                                                  np.int64)
            target = self.sorted_target if hasattr(self.sorted_target, "dtype") else np.frombuffer(self.sorted_target,
                                                                                                   np.int64)
            pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
            found = sorted_ids[pos] == ids
            return [int(target[p]) if f else None for p, f in zip(pos.tolist(), found.tolist())]
        out = []
        sorted_ids, target = self.sorted_ids, self.sorted_target
        n = len(sorted_ids)
        for vid in ids:
            pos = bisect.bisect_left(sorted_ids, vid)
            out.append(int(target[pos]) if pos < n and sorted_ids[pos] == vid else None)
        return out

    # -- operations ----------------------------------------------------------------------------------
    def _read_operations(self, operations):
        n = len(operations)
        S = self.S
        self.op_names, self.op_inputs, self.op_debug = [], [], array.array("q")
        self.op_first, self.op_last = array.array("q"), array.array("q")
        self.op_vars, self.op_programs = self.spill(INT), self.spill(INT)
        self.op_vars_offsets, self.op_programs_offsets = array.array("q", [0]), array.array("q", [0])
        bad_steps = unknown = 0
        get = self.contexts.get if self.contexts is not None else None
        for i in range(n):
            op = operations[i]
            dc = op.debugContext
            did = _integer(dc.id)
            self.op_debug.append(did)
            doc = load_json(getattr(dc, "json", None))
            raw = str(op.name)
            user = None
            if raw == "" and not doc.get("tensorId"):
                user = as_text(doc.get("op_name")) or as_text(doc.get("opName"))
                if user is None and get is not None:
                    user = user_op_name(get, did)
            self.op_names.append(operation_name(raw, doc, user))
            ins = json_inputs(doc)
            if not ins and get is not None:
                ins = nearest_inputs(get, did)
            self.op_inputs.append(ins)
            progs = [self._program_index(pr) for pr in op.programs()]
            self.op_programs.extend(progs)
            self.op_programs_offsets.append(self.op_programs_offsets[-1] + len(progs))
            found = self._lookup([_integer(v._id) for v in op.vars])
            unknown += sum(1 for x in found if x is None)
            kept = [x for x in found if x is not None and x >= 0]
            self.op_vars.extend(kept)
            self.op_vars_offsets.append(self.op_vars_offsets[-1] + len(kept))
            f, l = _integer(op.firstStepIndex), _integer(op.lastStepIndex)
            if 0 <= f <= l < S:
                self.op_first.append(f)
                self.op_last.append(l)
            else:
                bad_steps += 1
                self.op_first.append(-1)
                self.op_last.append(-1)
            self.progress.tick()
        self.op_warnings = operation_warnings(bad_steps, S, unknown)

    # -- the compact file ------------------------------------------------------------------------------
    def info(self):
        base = os.path.basename(self.path)
        stem = os.path.splitext(base)[0]
        parent = os.path.basename(os.path.dirname(self.path))
        estimates = [x for x in self.p_estimate if not math.isnan(x)]
        description = "PopVision profile " + base
        if self.debug_path is not None:
            description += " with " + os.path.basename(self.debug_path)
        return collections.OrderedDict([
            ("name", parent if stem == "profile" and parent else stem), ("source", "popvision"),
            ("description", description), ("synthetic", False),
            ("compute_source", compute_source(bool(estimates), len(self.p_estimate) - len(estimates))),
            ("warnings", self.warnings + self.op_warnings)])

    def write(self, fileobj):
        w = CompactWriter(fileobj)
        estimates = any(not math.isnan(x) for x in self.p_estimate)
        cycles = array.array("d", self.p_estimate if estimates else self.p_fallback)
        categories = None if self.gt is None else list(self.gt_categories)
        w.raw_bytes("header", header_bytes(self.target, "cycles", self.info(), categories))
        w.strings("steps", self.steps)
        w.strings("names", [])
        v_bytes, v_tile, v_always, v_live = self.columns_var
        self._check_bytes("loweredVariables.allBriefVars", v_bytes)
        w.values("var_bytes", v_bytes)
        w.values("var_tile", v_tile)
        w.values("var_always_live", v_always)
        w.values("var_live_class", v_live)
        w.values("var_name", array.array("q", [-1]) * self.n_vars)
        offsets, flat = array.array("q", [0]), array.array("q")
        for pattern in self.intervals:
            for start, end in pattern:
                flat.extend((start, end))
            offsets.append(len(flat) // 2)
        w.values("live_offsets", offsets)
        w.values("live_intervals", flat, shape=(len(flat) // 2, 2))
        w.strings("program_name", self.p_name)
        w.strings("program_kind", self.p_kind)
        w.strings("vertex_types", self.vertex_types)
        w.values("program_cycles", cycles)
        w.values("program_vertices", array.array("q", self.p_vertices))
        vc = self.rows["vertex_code"]
        for name, spill in (("program", vc.keys[0]), ("tile", vc.tile), ("type", vc.keys[1]), ("bytes", vc.bytes)):
            w.values("vertex_code_" + name, spill)
        self._check_bytes("compilation.programs", vc.bytes)
        for cat in ("vertex_state", "exchange_code", "control_code"):
            rows = self.rows[cat]
            self._check_bytes("compilation.programs", rows.bytes)
            for name, spill in (("program", rows.keys[0]), ("tile", rows.tile), ("bytes", rows.bytes)):
                w.values("%s_%s" % (cat, name), spill)
        w.strings("op_name", self.op_names)
        w.strings("op_layer", [""] * len(self.op_names))
        w.values("op_has_layer", [False] * len(self.op_names))
        w.strings("op_inputs", [x for row in self.op_inputs for x in row])
        w.values("op_inputs_count", array.array("q", [len(row) for row in self.op_inputs]))
        w.values("op_debug_id", self.op_debug)
        w.values("op_first_step", self.op_first)
        w.values("op_last_step", self.op_last)
        w.values("op_compute", array.array("d", [float("nan")]) * len(self.op_names))
        w.values("op_vars_offsets", self.op_vars_offsets)
        w.values("op_vars", self.op_vars)
        w.values("op_programs_offsets", self.op_programs_offsets)
        w.values("op_programs", self.op_programs)
        if self.gt is not None:
            w.values("gt_always_live", array.array("q", self.gt_always))
            w.values("gt_not_always_live", array.array("q", self.gt_peak))
            w.values("gt_step_tiles", array.array("q", self.gt_step_tiles))
            trace = array.array("q")
            for row in self.gt_step_bytes:
                trace.extend(row)
            w.values("gt_step_bytes", trace, shape=(len(self.gt_step_bytes), self.S if self.gt_step_bytes else 0))
            for k, values in enumerate(self.gt_categories.values()):
                w.values("gt_category_%d" % k, array.array("q", values))
        w.close()

    @staticmethod
    def _check_bytes(field, spill):
        low = spill.range()[0]
        if low is not None and low < 0:
            raise ReportError(field, "byte counts >= 0", low)


def _integer(value):
    """An integer field of a libpva object (a bool, a float or text is a damaged report)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if hasattr(value, "__index__") and not isinstance(value, bool):
            return value.__index__()
        raise TypeError("expected an integer, got %s" % type(value).__name__)
    return value


class ExportError(Exception):
    """A one-line error for the user (a missing file, libpva missing, a damaged report)."""


def import_pva():
    try:
        import pva
    except (ImportError, RuntimeError) as exc:
        raise ExportError("cannot import libpva (the Python module pva) in this Python (%s): enable the Poplar SDK "
                          "with `source <sdk>/enable.sh` and run this file with the SDK's python3" % one_line(exc))
    return pva


def export(profile_path, debug_path, output, progress=None, pva=None):
    """Read ``profile_path`` (and ``debug_path``, or None) through libpva and write the compact
    file ``output`` atomically. ``progress``: a text stream for progress lines (None: quiet).
    Returns the Exporter (counts and warnings)."""
    for path, what in ((profile_path, "a PopVision profile.pop"),
                       (debug_path, "the debug.cbor written next to profile.pop")):
        if path is not None and not os.path.isfile(path):
            raise ExportError("%s: %s (expected %s)" % (path, "no such file" if not os.path.exists(path)
                                                        else "not a file", what))
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise ExportError("%s: cannot write: folder %s does not exist" % (output, directory))
    if pva is None:
        pva = import_pva()
    try:
        report = pva.openReport(str(profile_path), None if debug_path is None else str(debug_path))
    except Exception as exc:  # libpva raises its own exception types for unreadable reports
        raise ExportError("%s: libpva could not open the report: %s" % (profile_path, one_line(exc)))
    exporter = Exporter(pva, report, str(profile_path), None if debug_path is None else str(debug_path), progress)
    try:
        try:
            exporter.read()
        except ReportError as exc:
            raise ExportError("%s: %s" % (profile_path, one_line(exc)))
        except DebugShapeError as exc:
            raise ExportError("%s: %sexpected %s%s" % (debug_path, exc.field + ": " if exc.field else "", exc.expected,
                                                       "" if exc.got is None else ", got %r" % (exc.got,)))
        except CborEOF as exc:
            raise ExportError("%s: expected %s, got a truncated file (%s)" % (debug_path, DEBUG_SHAPE, one_line(exc)))
        except CborError as exc:
            raise ExportError("%s: expected %s, got corrupt CBOR (%s)" % (debug_path, DEBUG_SHAPE, one_line(exc)))
        except (AttributeError, TypeError, ValueError, OverflowError, IndexError, KeyError) as exc:
            raise ExportError("%s: %s: expected objects with the attributes and integer values libpva gives, got "
                              "%s: %s" % (profile_path, exporter.part, type(exc).__name__, one_line(exc)))
        _write_atomically(output, exporter.write)
    finally:
        exporter.close()
    return exporter


def _write_atomically(path, write):
    """``write(binary file)`` into a temporary file beside ``path``, renamed over it at the end;
    on any error the temporary file is removed and ``path`` is left as it was."""
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w+b") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(
        prog="pva_export.py", description="Export a PopVision profile (profile.pop + debug.cbor) to a stagesplit "
        "compact file, in the Poplar SDK's Python (3.6+; needs libpva, the module pva).")
    parser.add_argument("profile", metavar="profile.pop")
    parser.add_argument("debug", metavar="debug.cbor", nargs="?", help="the debug.cbor written next to profile.pop "
                        "(gives operations without a name their user-level names)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE.stagesplit", help="the compact file to write")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    try:
        done = export(args.profile, args.debug, args.output, progress=None if args.quiet else sys.stderr)
    except (ExportError, OSError) as exc:
        sys.stderr.write("pva_export: error: %s\n" % one_line(exc))
        return 2
    for warning in done.warnings + done.op_warnings:
        sys.stderr.write("pva_export: warning: %s\n" % warning)
    sys.stderr.write("wrote %s: %s variables, %s operations, %s programs, %s steps\n" % (
        args.output, "{:,}".format(done.n_vars), "{:,}".format(len(done.op_names)), "{:,}".format(len(done.p_name)),
        "{:,}".format(done.S)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
