"""Renaming a lowered kernel: the name hlofuse gave it at build time -> the name of one region.

Kernels are built and lowered once per region *body* (``kernelize.lower_region``'s cache: the
same region in another module, process or source line hits it), so the name a family passes to
``pallas_call(name=...)`` (or, for the plain-JAX cpu kernels, to :func:`named_kernel`) is the
build's: ``hlofuse_<family>_<spec digest>``. Each region's kernel is then renamed in the
lowered module's text, before it is parsed, to the region's own name (``kernelize`` names it
after the region kind and the user's source line). The build name is one hlofuse chose itself,
unique by its digest, so replacing it is a rename of exactly what it named:

* locations: the name stack of every kernel op (``jit(fused)/<name>/mul``), which becomes the
  ``op_name`` metadata of XLA's HLO (profilers attribute time by it);
* Triton (gpu): the custom call's ``name``, and the kernel function inside the serialized
  Triton module (``ir``, MLIR bytecode), which XLA looks up by that name and compiles under it:
  its name in GPU profiles and in ptxas' output. The bytecode is renamed in its string table
  (:func:`rename_bytecode`);
* Mosaic (tpu): the custom call's ``kernel_name`` (the Mosaic body, base64 in
  ``backend_config``, cannot hold the name: ``_`` is not a base64 character).

Sub-kernels named ``<name>_stats``, ``<name>_dkv``, ... become ``<new>_stats``, ...
"""

from __future__ import annotations

import functools
import re

import jax

from hlofuse.core import ir as hir

__all__ = ["RenameError", "named_kernel", "rename", "rename_bytecode"]


class RenameError(ValueError):
    """A lowered kernel whose name could not be replaced everywhere (kernelize keeps the
    build's name for it: a partial rename would leave XLA a Triton call naming no function)."""


def named_kernel(fn, name: str):
    """``fn`` (a plain-JAX kernel) with its ops under ``jax.named_scope(name)``: their
    locations carry the kernel's name as a ``pallas_call``'s ops do, so :func:`rename` names
    every kernel the same way. ``.kernel_name`` is ``name``; ``.unscoped`` is ``fn`` (for a
    kernel that wraps this one under its own name)."""
    @functools.wraps(fn)
    def scoped(*args):
        with jax.named_scope(name):
            return fn(*args)
    scoped.kernel_name = name
    scoped.unscoped = fn
    return scoped


# a serialized Triton module (mhlo.backend_config's ``ir``): an MLIR string literal
_IR_PAYLOAD = re.compile(r'\bir = "((?:[^"\\]|\\.)*)"')


def rename(text: str, old: str, new: str) -> str:
    """``text`` (a lowered kernel module) with the kernel name ``old`` replaced by ``new``
    everywhere, serialized Triton modules included. Raises :class:`RenameError` when a
    serialized module holds ``old`` where its string table does not."""
    if old == new or old not in text:
        return text
    out, pos = [], 0
    for m in _IR_PAYLOAD.finditer(text):
        out.append(text[pos:m.start(1)].replace(old, new))
        data = unescape(m.group(1))
        out.append(escape(rename_bytecode(data, old.encode(), new.encode()))
                   if old.encode() in data else m.group(1))
        pos = m.end(1)
    out.append(text[pos:].replace(old, new))
    return "".join(out)


# -- MLIR string literals ---------------------------------------------------------------------

def unescape(s: str) -> bytes:
    """The bytes of an MLIR string literal's body (``\\XX`` hex escapes, ``\\\\``, ``\\"``,
    ``\\n``, ``\\t``)."""
    out, i = bytearray(), 0
    while i < len(s):
        c = s[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        nxt = s[i + 1]
        if nxt in '\\"':
            out.append(ord(nxt))
            i += 2
        elif nxt in "nt":
            out.append(10 if nxt == "n" else 9)
            i += 2
        else:
            out.append(int(s[i + 1:i + 3], 16))
            i += 3
    return bytes(out)


def escape(data: bytes) -> str:
    """An MLIR string literal's body for ``data``, as MLIR prints it (``llvm::printEscapedString``:
    printable ASCII but ``"`` as is, ``\\`` doubled, every other byte ``\\XX``)."""
    out = []
    for b in data:
        if b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F and b != 0x22:
            out.append(chr(b))
        else:
            out.append(f"\\{b:02X}")
    return "".join(out)


# -- MLIR bytecode ----------------------------------------------------------------------------
# (mlir/docs/BytecodeFormat.md) magic "ML\xefR", version (varint), producer (NUL-terminated),
# then sections: [id | aligned << 7] [length varint] ([alignment varint] [0xCB padding]) data.
# The string section (id 0): [count varint] [each string's size incl. its NUL, varints, last
# string first] [the strings, NUL-terminated, first first]. Every other section refers to a
# string by its index, so a string may change length; only the sections after it move.

_STRING_SECTION, _RESOURCE_SECTION = 0, 5


def _read_varint(b: bytes, p: int) -> tuple[int, int]:
    first = b[p]
    if first & 1:
        return first >> 1, p + 1
    if first == 0:
        return int.from_bytes(b[p + 1:p + 9], "little"), p + 9
    n = (first & -first).bit_length() - 1          # trailing zeros: this many more bytes
    return int.from_bytes(b[p:p + n + 1], "little") >> (n + 1), p + n + 1


def _varint(v: int) -> bytes:
    for n in range(1, 9):                           # n bytes hold 7 * n value bits
        if v < 1 << (7 * n):
            return ((v << n) | (1 << (n - 1))).to_bytes(n, "little")
    return b"\x00" + v.to_bytes(8, "little")


def _sections(b: bytes) -> tuple[int, list]:
    """(offset of the first section, [(id, aligned, start of data, end of data)])."""
    if not b.startswith(hir.MAGIC_BYTECODE):
        raise RenameError("not MLIR bytecode")
    _, p = _read_varint(b, 4)                       # version
    p = b.index(0, p) + 1                           # producer
    first, out = p, []
    while p < len(b):
        code = b[p]
        length, p = _read_varint(b, p + 1)
        if code & 0x80:
            align, p = _read_varint(b, p)
            while p % align:
                p += 1
        out.append((code & 0x7F, bool(code & 0x80), p, p + length))
        p += length
    if p != len(b):
        raise RenameError("bytecode sections overrun the buffer")
    return first, out


def rename_bytecode(data: bytes, old: bytes, new: bytes) -> bytes:
    """MLIR bytecode ``data`` with ``old`` replaced by ``new`` in every string of its string
    table (symbol names, string attributes, location names). Raises :class:`RenameError` when
    ``old`` also occurs outside the string table, or when a section after the string table
    needs alignment (a resource blob: moving it would misalign it)."""
    first, sections = _sections(data)
    idx = [i for i, s in enumerate(sections) if s[0] == _STRING_SECTION]
    if len(idx) != 1:
        raise RenameError("bytecode without exactly one string section")
    i = idx[0]
    if any(al or (sid == _RESOURCE_SECTION and end > start)
           for sid, al, start, end in sections[i + 1:]):
        raise RenameError("an aligned section follows the string section")
    _, aligned, start, end = sections[i]
    if aligned:
        raise RenameError("aligned string section")
    if old in data[:start] or old in data[end:]:
        raise RenameError("the name occurs outside the bytecode's string table")
    sec = data[start:end]
    count, p = _read_varint(sec, 0)
    sizes = []
    for _ in range(count):
        size, p = _read_varint(sec, p)
        sizes.append(size)
    sizes.reverse()
    if sum(sizes) != len(sec) - p:
        raise RenameError("string section sizes do not add up")
    strings, q = [], p
    for size in sizes:
        s = sec[q:q + size]
        if not s.endswith(b"\x00"):
            raise RenameError("string without its NUL")
        strings.append(s[:-1].replace(old, new))
        q += size
    body = _varint(count) + b"".join(_varint(len(s) + 1) for s in reversed(strings)) \
        + b"".join(s + b"\x00" for s in strings)
    head = bytes([sections[i][0]]) + _varint(len(body))
    # the section header starts where the previous section's data ended (or at ``first``)
    header_at = sections[i - 1][3] if i else first
    return data[:header_at] + head + body + data[end:]
