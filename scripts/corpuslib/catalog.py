"""Gettext catalogs: read ``.mo`` / ``.po`` files into entries, write ``.mo`` files, and find one language's
catalogs in the pinned packages (GCC's are reserved for evaluation and never read)."""

import codecs
import re
import struct
from dataclasses import dataclass
from pathlib import Path

MO_MAGIC = 0x950412DE
CONTEXT_SEP = "\x04"
LANGUAGE = re.compile(r"^[a-z]{2}$")  # an ISO 639-1 code: de, fr
# Catalogs of GCC are reserved for an independent evaluation set: never used, whatever ships them.
EXCLUDED_CATALOG = re.compile(r"^(gcc|cpplib)([-_.].*)?$")
EXCLUDED_PACKAGE = re.compile(r"^(gcc|cpp)(-.*)?$")


@dataclass(frozen=True)
class Entry:
    """One catalog entry; ``msgstr`` holds all forms (one for a singular entry)."""

    msgid: str
    msgstr: tuple
    context: str | None = None
    msgid_plural: str | None = None
    fuzzy: bool = False


def header_charset(header):
    """Return the charset named by a catalog header's ``Content-Type`` line, or ``utf-8``.

    A missing charset or the template placeholder ``CHARSET`` falls back to UTF-8.
    """
    match = re.search(r"charset=([A-Za-z0-9_.:-]+)", header or "")
    if not match or match.group(1).upper() == "CHARSET":
        return "utf-8"
    try:
        return codecs.lookup(match.group(1)).name
    except LookupError:
        return "utf-8"


def read_mo_strings(data):
    """Return the raw ``(msgid_bytes, msgstr_bytes)`` pairs of a ``.mo`` file, either byte order."""
    for order in ("<", ">"):
        if struct.unpack(order + "I", data[:4])[0] == MO_MAGIC:
            break
    else:
        raise ValueError("not a GNU .mo file (bad magic number)")
    _, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])

    def string(table, i):
        length, offset = struct.unpack_from(order + "2I", data, table + 8 * i)
        return data[offset:offset + length]

    return [(string(ids_at, i), string(strs_at, i)) for i in range(count)]


def mo_entry(key, value, charset):
    """Decode one ``.mo`` record into an :class:`Entry` (``None`` if it does not decode).

    The key is ``[msgctxt \\x04] msgid [\\x00 msgid_plural]``; plural forms in the value are
    separated by NUL bytes. A compiled catalog carries no flags: ``msgfmt`` leaves fuzzy entries
    out unless told otherwise, so every ``.mo`` entry counts as non-fuzzy.
    """
    try:
        key, value = key.decode(charset), value.decode(charset)
    except UnicodeDecodeError:
        return None
    context = None
    if CONTEXT_SEP in key:
        context, key = key.split(CONTEXT_SEP, 1)
    msgid, has_plural, plural = key.partition("\x00")
    return Entry(msgid, tuple(value.split("\x00")), context, plural if has_plural else None)


def parse_mo(data):
    """Parse ``.mo`` bytes into ``(entries, undecodable_count)``, decoding with the header charset."""
    raw = read_mo_strings(data)
    header = next((v for k, v in raw if k == b""), b"").decode("ascii", "replace")
    charset = header_charset(header)
    entries = [mo_entry(k, v, charset) for k, v in raw]
    return [e for e in entries if e is not None], sum(e is None for e in entries)


_PO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
               '"': '"', "\\": "\\"}


def po_unquote(token):
    """Turn one quoted ``.po`` string literal (with its quotes) into its text, resolving escapes."""
    return re.sub(r"\\(.)", lambda m: _PO_ESCAPES.get(m.group(1), m.group(0)), token[1:-1])


def po_blocks(text):
    """Split ``.po`` text into entry blocks (lists of lines), skipping obsolete ``#~`` lines."""
    blocks, current = [], []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            if current:
                blocks.append(current)
            current = []
        elif not line.startswith("#~"):
            current.append(line)
    if current:
        blocks.append(current)
    return blocks


def po_entry(block):
    """Parse one ``.po`` block into an :class:`Entry` (``None`` for a block without ``msgid``).

    Handles ``#, fuzzy`` flags, ``msgctxt``, ``msgid_plural``, ``msgstr[n]`` and strings continued
    over several quoted lines.
    """
    fields, fuzzy, last = {}, False, None
    for line in block:
        if line.startswith("#,"):
            fuzzy = fuzzy or "fuzzy" in (f.strip() for f in line[2:].split(","))
        elif line.startswith("#"):
            continue
        elif line.startswith('"'):
            fields[last] += po_unquote(line)
        else:
            last, _, literal = line.partition(" ")
            fields[last] = po_unquote(literal.strip())
    if "msgid" not in fields:
        return None
    forms = sorted((k for k in fields if k.startswith("msgstr[")), key=lambda k: int(k[7:-1]))
    msgstr = tuple(fields[k] for k in forms) if forms else (fields.get("msgstr", ""),)
    return Entry(fields["msgid"], msgstr, fields.get("msgctxt"), fields.get("msgid_plural"), fuzzy)


def parse_po(data):
    """Parse ``.po`` bytes into a list of :class:`Entry`, decoding with the header charset."""
    charset = header_charset(data.decode("latin-1"))
    entries = (po_entry(block) for block in po_blocks(data.decode(charset)))
    return [e for e in entries if e is not None]


def read_catalog(path):
    """Read a ``.mo`` or ``.po`` file into ``(entries, undecodable_count)``."""
    data = Path(path).read_bytes()
    if str(path).endswith(".po"):
        return parse_po(data), 0
    return parse_mo(data)


def write_mo(entries):
    """Serialise entries as a little-endian ``.mo`` file (no hash table), in the header's charset.

    Like ``msgfmt``, fuzzy entries are left out; unlike it, untranslated ones are kept, so that the
    test fixture built with this writer still exercises the empty-translation rule.
    """
    header = next((e.msgstr[0] for e in entries if e.msgid == "" and e.context is None), "")
    charset = header_charset(header)
    records = []
    for e in entries:
        if e.fuzzy:
            continue
        key = (e.context + CONTEXT_SEP if e.context is not None else "") + e.msgid
        if e.msgid_plural is not None:
            key += "\x00" + e.msgid_plural
        records.append((key.encode(charset), "\x00".join(e.msgstr).encode(charset)))
    records.sort()
    count = len(records)
    ids_at, strs_at = 28, 28 + 8 * count
    offset = strs_at + 8 * count
    tables, blob = bytearray(), bytearray()
    for column in (0, 1):
        for record in records:
            tables += struct.pack("<2I", len(record[column]), offset + len(blob))
            blob += record[column] + b"\x00"
    prologue = struct.pack("<7I", MO_MAGIC, 0, count, ids_at, strs_at, 0, offset)
    return prologue + bytes(tables) + bytes(blob)


def is_excluded_catalog(path):
    """True for GCC's catalogs (``gcc.mo``, ``gcc-12.mo``, ``cpplib.mo``…), reserved for evaluation."""
    return bool(EXCLUDED_CATALOG.match(Path(path).name.rsplit(".", 1)[0]))


def locale_dirs(lang):
    """The locale folders read for language ``lang``: ``de`` and ``de_DE`` for German, ``fr`` and ``fr_FR`` for
    French; never the regional variants (``de_AT``, ``fr_CA``…), which would duplicate source strings."""
    if not LANGUAGE.match(lang):
        raise ValueError(f"{lang!r} is not a two-letter language code such as de or fr")
    return lang, f"{lang}_{lang.upper()}"


def find_catalogs(package_dir, lang):
    """Sorted catalogs of language ``lang`` (:func:`locale_dirs`) under one extracted package tree."""
    found = []
    for locale in locale_dirs(lang):
        messages = Path(package_dir) / "usr/share/locale" / locale / "LC_MESSAGES"
        found += [p for p in sorted(messages.glob("*.mo")) if p.is_file() and not is_excluded_catalog(p)]
    return found


def read_packages(path):
    """Read ``name version`` lines (``#`` comments allowed); refuse GCC packages."""
    packages = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, version = line.split()
        if EXCLUDED_PACKAGE.match(name):
            raise ValueError(f"{name}: GCC catalogs are reserved for evaluation and may not be used")
        packages.append((name, version))
    return packages


def package_catalogs(packages, extract_dir, lang):
    """List ``(package, catalog_path)`` of language ``lang`` for the pinned packages, in packages-file order."""
    catalogs = []
    for name, _ in packages:
        found = find_catalogs(Path(extract_dir) / name, lang)
        if not found:
            dirs = " or ".join(f"usr/share/locale/{d}/LC_MESSAGES/" for d in locale_dirs(lang))
            raise FileNotFoundError(f"{name}: no {lang} catalog (*.mo in {dirs}) under {Path(extract_dir) / name}; "
                                    f"take {name} out of the package list")
        catalogs += [(name, path) for path in found]
    return catalogs
