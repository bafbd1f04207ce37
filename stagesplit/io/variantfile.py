"""One file holding one profile per tensor-parallel degree (``ParallelVariants``), in both forms.

A capture given a list of tensor-parallel degrees records one rank of each; the layout search and ``breakdown``
take the file whole. Each variant is stored exactly as a file of its own would be, so that one
cut out of the file is a profile every command reads, and nothing about a profile's form is
described twice (docs/profile-format.md, "Variants by tensor-parallel degree"):

* JSON: ``{"format": "stagesplit-profile", "version": 1, "kind": "variants", "variants": [...]}``,
  each item a whole profile document (``"kind": "full"``, with its own format and version);
* compact: a zip whose member ``variants.json`` lists its other members in order
  (``{"format": "stagesplit-variants", "version": 1, "variants": ["tp1.stagesplit", ...]}``),
  each a whole compact profile, stored as it is (already compressed).

A variant's degree is its own ``parallel_layout.tensor_parallel`` (none: 1); two of one degree
are refused, naming the file.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from ..common.fields import FieldReader
from ..common.fileio import atomic_output, atomic_write_text
from ..common.limits import EXPANSION_RATIO, MIN_EXPANDED_BYTES
from ..common.safeinput import load_json
from ..common.text import show
from ..errors import ProfileError
from .jsonprofile import FORMAT, VERSION, dumps_profile, profile_from_document
from .profile import Profile
from .variants import ParallelVariants, parallel_degree, parallel_variants

__all__ = ["COMPACT_MANIFEST", "COMPACT_VARIANTS_FORMAT", "MAX_VARIANTS", "read_json_variants", "read_compact_variants",
           "write_variants"]

#: the compact container's list of its members, and the format it names
COMPACT_MANIFEST = "variants.json"
COMPACT_VARIANTS_FORMAT = "stagesplit-variants"
#: variants one file may hold (degrees are powers of two in practice: 1..4096 is 13)
MAX_VARIANTS = 64


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a broken zip raises (zipfile imported here: a JSON profile needs none of it)."""
    import zipfile
    import zlib
    return ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError


def read_json_variants(path: str | Path, data: bytes) -> tuple[Profile, ...]:
    """The profiles of a JSON variants file (each checked as a file of its own, its errors named
    ``variants[i]``); of a JSON document of one profile, that one (the text parsed once)."""
    path = Path(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ProfileError(path, "", "a UTF-8 JSON document") from None
    doc = load_json(text, str(path))
    if not isinstance(doc, dict) or doc.get("kind") != "variants":
        return (profile_from_document(doc, str(path)),)
    r = FieldReader(str(path))
    if doc.get("format") != FORMAT:
        r.fail("format", f'"{FORMAT}"', doc.get("format"))
    if isinstance(doc.get("version"), bool) or doc.get("version") != VERSION:
        r.fail("version", f"{VERSION} (this stagesplit reads profile format version {VERSION})", doc.get("version"))
    r.known_keys(doc, "", {"format", "version", "kind", "variants"})
    items = r.list(r.get(doc, "variants", ""), "variants", nonempty=True)
    if len(items) > MAX_VARIANTS:
        r.fail("variants", f"at most {MAX_VARIANTS} variants", len(items))
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("kind") == "variants":
            r.fail(f"variants[{i}].kind", '"full" (a variant is one profile)', "variants")
        out.append(profile_from_document(item, f"{path}: variants[{i}]"))
        items[i] = None                                  # each document let go of once read
    return tuple(out)


def read_compact_variants(path: str | Path, raw: bytes) -> tuple[Profile, ...] | None:
    """The profiles of a compact variants file (each member read by ``read_compact``, with every
    check of a compact file), or None where ``raw`` is a compact file of one profile."""
    import zipfile

    from .compact import read_compact  # (compact files only: JSON ones need none of it)
    source = str(path)
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            names = zf.namelist()
            if COMPACT_MANIFEST not in names:
                return None
            budget = max(MIN_EXPANDED_BYTES, EXPANSION_RATIO * len(raw))
            total = sum(m.file_size for m in zf.infolist())
            if total > budget:
                raise ProfileError(source, "", f"a compact variants file expanding to at most {budget:,} bytes; its "
                                   f"members declare {total:,} bytes")
            manifest = zf.read(COMPACT_MANIFEST)
            r = FieldReader(f"{source}: {COMPACT_MANIFEST}")
            try:
                doc = load_json(manifest.decode("utf-8"), r.source)
            except UnicodeDecodeError:
                raise ProfileError(r.source, "", "a UTF-8 JSON document") from None
            r.mapping(doc, "document")
            r.known_keys(doc, "", {"format", "version", "variants"})
            if r.get(doc, "format", "") != COMPACT_VARIANTS_FORMAT:
                r.fail("format", f'"{COMPACT_VARIANTS_FORMAT}"', doc.get("format"))
            version = r.get(doc, "version", "")
            if isinstance(version, bool) or version != 1:
                r.fail("version", "1", version)
            members = r.list(r.get(doc, "variants", ""), "variants", nonempty=True)
            if len(members) > MAX_VARIANTS:
                r.fail("variants", f"at most {MAX_VARIANTS} variants", len(members))
            out = []
            for i, member in enumerate(members):
                name = r.string(member, f"variants[{i}]")
                if name not in names or name == COMPACT_MANIFEST:
                    r.fail(f"variants[{i}]", "the name of a member of the file holding a compact profile", name)
                try:
                    data = zf.read(name)
                except _read_errors() as exc:
                    raise ProfileError(source, name, "a readable zip member", str(exc)) from None
                out.append(read_compact(f"{source}: {name}", data))
                del data
            return tuple(out)
    except ProfileError:
        raise
    except _read_errors() as exc:
        raise ProfileError(source, "", "a stagesplit compact profile (a zip of numpy arrays)", str(exc)) from None


def write_variants(variants: ParallelVariants | Sequence[Profile], path: str | Path, compact: bool) -> None:
    """Write the variants as one file, atomically: the compact container or the JSON one."""
    import zipfile

    from .compact import write_compact
    profiles = variants.profiles if isinstance(variants, ParallelVariants) else \
        parallel_variants(list(variants), show(str(path))).profiles
    if not compact:
        parts = [dumps_profile(p).rstrip("\n") for p in profiles]
        atomic_write_text(path, f'{{"format": "{FORMAT}", "version": {VERSION}, "kind": "variants", "variants": [\n'
                          + ",\n".join(parts) + "\n]}\n")
        return
    import json
    names = [f"tp{parallel_degree(p)}.stagesplit" for p in profiles]
    with atomic_output(Path(path)) as handle:
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.writestr(COMPACT_MANIFEST, json.dumps({"format": COMPACT_VARIANTS_FORMAT, "version": 1,
                                                      "variants": names}))
            for name, p in zip(names, profiles):
                with _TemporaryCompact() as member:
                    write_compact(p, member.path)
                    zf.write(member.path, name)


class _TemporaryCompact:
    """A temporary file to write one variant's compact profile to before it joins the zip (the
    compact writer wants a path it can replace atomically)."""

    def __enter__(self) -> _TemporaryCompact:
        import tempfile
        self._dir = tempfile.TemporaryDirectory(prefix="stagesplit-variant-")
        self.path = Path(self._dir.name) / "variant.stagesplit"
        return self

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()
