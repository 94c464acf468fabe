"""Record formats: the samples inside a dataset's files, when a file holds many.

Public training sets are rarely one file per sample: TFRecord shards, WebDataset tar shards,
JSON-lines files, flat token or feature arrays (``.bin``, ``.npy``). Registered with a record
format, each *record* is a sample of its own, named by the digest of its bytes like a file is,
so the substitutable sampler, the cache's chunks and their sharing work per sample whatever the
container. Every function here is pure: a file's bytes in, the byte spans of its samples out;
or, for a file too large to hold (``frames``), a reader of its byte ranges in (``Window``), the
spans out, the file read in pieces.

| format | a sample is | its bytes |
|---|---|---|
| ``file`` (default) | a whole file | the file |
| ``lines`` | a non-blank line (``\\n``-separated; a ``\\r`` before it is kept; a lone ``\\r`` is blank) | the line, without its ``\\n`` |
| ``tfrecord`` | a TFRecord record | its payload (e.g. a serialized ``tf.train.Example``) |
| ``tar`` | consecutive members sharing a key (WebDataset: ``dir/key.ext``) | those members as a tar fragment: ``tar_sample`` reads it |
| ``fixed:N`` | each N bytes | N bytes (the file's size must be a multiple of N) |
| ``npy`` | a row of a C-ordered ``.npy`` array (along axis 0) | the row's raw bytes: ``np.frombuffer(b, dtype).reshape(shape[1:])`` |
| ``idx`` | an item of an IDX file (MNIST, Fashion-MNIST, EMNIST: ``train-images-idx3-ubyte``) | the item's raw bytes (big-endian): a 28x28 image, a label byte |

Spans are (offset in the file, length), in file order, never overlapping.
"""

from __future__ import annotations

import ast
import functools
import io
import struct
import tarfile
from collections.abc import Callable, Iterator
from typing import Any

from microco.common.errors import InvalidArgument

__all__ = ["FORMATS", "PIECE_BYTES", "Window", "check_format", "frames", "record_spans", "tar_sample"]

Spans = list[tuple[int, int]]


def _lines(data: bytes) -> Spans:
    out: Spans = []
    start, n = 0, len(data)
    while start < n:
        end = data.find(b"\n", start)
        if end < 0:
            end = n
        # A blank line is no sample, a CRLF file's (a lone ``\r``) included.
        if end > start and not (end - start == 1 and data[start] == 0x0D):
            out.append((start, end - start))
        start = end + 1
    return out


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


@functools.lru_cache(maxsize=4096)  # a shard's records repeat few lengths
def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C (Castagnoli), rotated right by 15 and offset."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord(data: bytes) -> Spans:
    # Each record: length (uint64 LE), masked CRC32C of the length, payload, masked CRC32C of it.
    # The length's CRC is checked (8 bytes a record): a corrupt length would frame every later
    # record wrongly. The payload's is not (a pure-Python CRC over every byte is slow): every
    # sample is content-hashed at registration and at each read.
    if data[:2] == b"\x1f\x8b":
        raise InvalidArgument(
            "a gzip-compressed TFRecord file: decompress it first (records are read by range)"
        )
    out: Spans = []
    pos, n = 0, len(data)
    while pos < n:
        if pos + 12 > n:
            raise InvalidArgument(f"not a TFRecord file: {n - pos} stray bytes at offset {pos}")
        (length,) = struct.unpack_from("<Q", data, pos)
        (crc,) = struct.unpack_from("<I", data, pos + 8)
        if crc != _masked_crc32c(data[pos : pos + 8]):
            raise InvalidArgument(
                f"not a TFRecord file, or a corrupt one: the length of the record at offset {pos} "
                "fails its checksum"
            )
        if pos + 12 + length + 4 > n:
            raise InvalidArgument(
                f"not a TFRecord file: a record of {length} bytes at offset {pos} runs past its end"
            )
        out.append((pos + 12, length))
        pos += 12 + length + 4
    return out


def _key(name: str) -> str:
    """WebDataset's sample key: the member's path up to the first dot of its last component."""
    head, _, base = name.rpartition("/")
    key = base.split(".", 1)[0]
    return f"{head}/{key}" if head else key


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _tar(data: bytes) -> Spans:
    return list(_tar_frames(io.BytesIO(data), data[:6]))


def _tar_frames(fileobj: Any, head: bytes) -> Iterator[tuple[int, int]]:
    """A tar's samples from ``fileobj`` (seekable; ``head``: its first bytes), member by member:
    its headers are read and its members' data skipped, so a shard is never held whole."""
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            # tarfile's own word for it is "truncated header" or "invalid header".
            raise InvalidArgument(
                f"a {kind}-compressed tar (.tgz, .tar.gz...): decompress it first (records are read by range)"
            )
    key: str | None = None
    start = end = 0
    names: set[str] = set()
    try:
        tf = tarfile.open(fileobj=fileobj, mode="r:")
        while True:
            m = tf.next()
            if m is None:
                break
            tf.members = []  # type: ignore[attr-defined]  # (a shard's members are not kept: each is framed, then dropped)
            if m.islnk() or m.issym():
                # Its bytes are another member's, outside this sample's fragment: ``tar_sample``
                # would silently give the sample without it.
                raise InvalidArgument(
                    f"tar member {m.name!r} is a {'hard' if m.islnk() else 'symbolic'} link to "
                    f"{m.linkname!r}: write the shard with each member's own bytes "
                    "(GNU tar --hard-dereference / --dereference)"
                )
            if not m.isfile():
                continue
            # m.offset: its first header (a long name's or pax header's included); data padded to 512.
            stop = m.offset_data + ((m.size + 511) // 512) * 512
            k = _key(m.name)
            if k == key:
                if m.name in names:
                    # tar_sample's dict would keep only the last (WebDataset refuses it too).
                    raise InvalidArgument(f"tar member {m.name!r} appears twice in one sample")
                names.add(m.name)
                end = stop
                continue
            if key is not None:
                yield start, end - start
            key, start, end, names = k, m.offset, stop, {m.name}
    except tarfile.TarError as exc:
        raise InvalidArgument(f"not a tar file: {exc}") from exc
    if key is not None:
        yield start, end - start


def tar_sample(raw: bytes) -> dict[str, bytes]:
    """A ``tar`` sample's members: {extension (after the key's first dot): bytes}, as WebDataset
    gives them (``{"jpg": ..., "cls": ...}``)."""
    tf = tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
    out: dict[str, bytes] = {}
    for m in tf.getmembers():
        if m.isfile():
            f = tf.extractfile(m)
            assert f is not None
            out[m.name.rpartition("/")[2].split(".", 1)[1] if "." in m.name.rpartition("/")[2] else ""] = (
                f.read()
            )
    return out


def _fixed(size: int) -> Callable[[bytes], Spans]:
    def spans(data: bytes) -> Spans:
        if len(data) % size:
            raise InvalidArgument(f"a file of {len(data)} bytes is not a whole number of {size}-byte records")
        return [(off, size) for off in range(0, len(data), size)]

    return spans


def _npy(data: bytes) -> Spans:
    start, rows, row = _npy_layout(data, len(data))
    return [(start + r * row, row) for r in range(rows)]


def _npy_head(data: bytes) -> int:
    """How many bytes a ``.npy``'s magic and header take, from its first 12 (0: not one)."""
    if data[:6] != b"\x93NUMPY" or len(data) < 12 or data[6] not in (1, 2, 3):
        return 0
    if data[6] == 1:
        return 10 + int(struct.unpack_from("<H", data, 8)[0])
    return 12 + int(struct.unpack_from("<I", data, 8)[0])


def _npy_layout(data: bytes, total: int) -> tuple[int, int, int]:
    """A ``.npy``'s (first row's offset, rows, bytes a row) from its first bytes (``data``,
    the header at least) and its size."""
    if data[:6] != b"\x93NUMPY":
        raise InvalidArgument("not a .npy file (no NUMPY magic)")
    major = data[6]
    if major == 1:
        (hlen,) = struct.unpack_from("<H", data, 8)
        start = 10 + hlen
    elif major in (2, 3):
        (hlen,) = struct.unpack_from("<I", data, 8)
        start = 12 + hlen
    else:
        raise InvalidArgument(f"unsupported .npy version {major}")
    try:
        header = ast.literal_eval(data[start - hlen : start].decode("latin1"))
        shape, fortran, descr = tuple(header["shape"]), bool(header["fortran_order"]), header["descr"]
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"bad .npy header: {exc}") from exc
    if not isinstance(descr, str) or "O" in descr:
        raise InvalidArgument("a .npy of Python objects or structured rows: save it as a plain numeric array")
    if fortran and len(shape) > 1:
        raise InvalidArgument("a Fortran-ordered .npy: its rows are not contiguous (save it C-ordered)")
    if not shape:
        raise InvalidArgument("a 0-d .npy array has no rows")
    import numpy as np

    try:
        item = np.dtype(descr).itemsize
    except TypeError as exc:
        raise InvalidArgument(f"bad .npy dtype {descr!r}: {exc}") from exc
    rows, row = int(shape[0]), item
    for d in shape[1:]:
        row *= int(d)
    # A row's size is the header's (dtype and shape), never the body's share: a file cut short
    # or padded by a whole number of rows would otherwise split into rows of the wrong width.
    body = total - start
    if body < rows * row:
        raise InvalidArgument(
            f".npy data of {body} bytes is short of its {rows} rows of {row} bytes (a truncated file?)"
        )
    return start, rows, row


# IDX's type codes (the third byte of its magic) -> bytes per value.
_IDX_ITEM = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def _idx(data: bytes) -> Spans:
    """Items of an IDX file (LeCun's MNIST layout, what torchvision's ``MNIST`` reads): two zero
    bytes, a type code, the number of dimensions, each dimension as a big-endian uint32, then
    the values; an item is one index along the first dimension. Without this format such a file
    could only be one sample (its 16-byte header breaks ``fixed:N``)."""
    start, rows, row = _idx_layout(data, len(data))
    return [(start + r * row, row) for r in range(rows)]


def _idx_layout(data: bytes, total: int) -> tuple[int, int, int]:
    """An IDX file's (first item's offset, items, bytes an item) from its first bytes
    (``data``, the header at least) and its size."""
    if data[:2] == b"\x1f\x8b":
        raise InvalidArgument("a gzip-compressed IDX file (as downloaded): decompress it first")
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_ITEM or data[3] == 0:
        raise InvalidArgument("not an IDX file (no 0x0000 magic with a known type and dimensions)")
    dims = data[3]
    start = 4 + 4 * dims
    if len(data) < start:
        raise InvalidArgument(f"an IDX header of {dims} dimensions cut short")
    shape = struct.unpack_from(f">{dims}I", data, 4)
    row = _IDX_ITEM[data[2]]
    for d in shape[1:]:
        row *= d
    body = total - start
    # Exactly: torchvision refuses a file whose body is not its shape's too.
    if body != shape[0] * row:
        raise InvalidArgument(
            f"IDX data of {body} bytes is not its {shape[0]} items of {row} bytes (a truncated or padded file?)"
        )
    return start, shape[0], row


FORMATS: dict[str, Callable[[bytes], Spans]] = {
    "lines": _lines,
    "tfrecord": _tfrecord,
    "tar": _tar,
    "npy": _npy,
    "idx": _idx,
}


def check_format(fmt: str) -> str:
    """``fmt`` if it names a record format (``file``, ``lines``, ``tfrecord``, ``tar``, ``npy``,
    ``idx``, ``fixed:N``), else ``InvalidArgument`` listing them."""
    if fmt == "file" or fmt in FORMATS:
        return fmt
    if fmt.startswith("fixed:"):
        try:
            if int(fmt[6:]) > 0:
                return f"fixed:{int(fmt[6:])}"
        except ValueError:
            pass
    raise InvalidArgument(
        f"unknown record format {fmt!r}: use file, lines, tfrecord, tar, npy, idx or fixed:N (N bytes)"
    )


def record_spans(fmt: str, data: bytes) -> Spans:
    """The (offset, length) of each sample in a file's ``data`` under record format ``fmt``."""
    fmt = check_format(fmt)
    if fmt == "file":
        return [(0, len(data))]
    if fmt.startswith("fixed:"):
        return _fixed(int(fmt[6:]))(data)
    return FORMATS[fmt](data)


#: A record file is read at registration in pieces of about this many bytes, not whole.
PIECE_BYTES = 8 << 20


class Window:
    """One file's bytes read by range (``read_range(start, size)``) in pieces of about
    ``piece`` bytes, the last two kept: a format's framing (``frames``) and the hashing of
    the records it frames read each byte about once, and a file of any size is never held
    whole. ``size``: the file's size as listed (checked before it is relied on)."""

    def __init__(self, read_range: Callable[[int, int], bytes], size: int, piece: int = 0) -> None:
        self._read = read_range
        self.listed = size
        self.piece = piece or PIECE_BYTES
        self.end: int | None = None  # the file's size, once a read came back short
        self._kept: list[tuple[int, bytes]] = []

    def get(self, start: int, size: int) -> bytes:
        """``size`` bytes from ``start`` (fewer at the file's end)."""
        for base, data in self._kept:
            stop = base + len(data)
            if base <= start and (start + size <= stop or stop == self.end):
                return data[start - base : start - base + size]
        want = max(size, self.piece)
        data = self._read(start, want)
        if len(data) < want:
            self.end = start + len(data)
        self._kept = [*self._kept[-1:], (start, data)]
        return data[:size]

    def size(self) -> int:
        """The file's size: the listed one, checked against the bytes there."""
        n = self.listed
        if self.end is None and not (len(self.get(n - 1, 2)) == 1 if n > 0 else not self.get(0, 1)):
            raise InvalidArgument(
                "its size changed while it was being indexed: register it again once it holds still"
            )
        return n if self.end is None else self.end


def _line_frames(w: Window) -> Iterator[tuple[int, int]]:
    pos, want = 0, w.piece
    while True:
        data = w.get(pos, want)
        at_end = w.end is not None and pos + len(data) >= w.end
        cut = len(data) if at_end else data.rfind(b"\n") + 1
        if not cut:
            if not data:
                return
            want *= 2  # a line longer than a piece
            continue
        for start, length in _lines(data):  # (lines up to the cut: spans as in the whole file)
            if start >= cut:
                break
            yield pos + start, length
        pos, want = pos + cut, w.piece
        if at_end:
            return


def _tfrecord_frames(w: Window) -> Iterator[tuple[int, int]]:
    if w.get(0, 2) == b"\x1f\x8b":
        raise InvalidArgument(
            "a gzip-compressed TFRecord file: decompress it first (records are read by range)"
        )
    pos = 0
    while True:
        head = w.get(pos, 12)
        if not head:
            return
        if len(head) < 12:
            raise InvalidArgument(f"not a TFRecord file: {len(head)} stray bytes at offset {pos}")
        (length,) = struct.unpack_from("<Q", head, 0)
        (crc,) = struct.unpack_from("<I", head, 8)
        if crc != _masked_crc32c(head[:8]):
            raise InvalidArgument(
                f"not a TFRecord file, or a corrupt one: the length of the record at offset {pos} "
                "fails its checksum"
            )
        # (a record within a piece is read with the piece it starts in: its hashing reads it there)
        whole = 12 + length + 4
        if len(w.get(pos, whole) if whole <= w.piece else w.get(pos + 12 + length, 4)) < (
            whole if whole <= w.piece else 4
        ):
            raise InvalidArgument(
                f"not a TFRecord file: a record of {length} bytes at offset {pos} runs past its end"
            )
        yield pos + 12, length
        pos += 12 + length + 4


class _WindowFile:
    """A ``Window`` as the seekable file ``tarfile`` reads headers from."""

    def __init__(self, w: Window) -> None:
        self.w, self.pos = w, 0

    def read(self, size: int = -1) -> bytes:
        data = self.w.get(self.pos, size if size >= 0 else self.w.size() - self.pos)
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (self.pos if whence == 1 else self.w.size() if whence == 2 else 0)
        return self.pos

    def tell(self) -> int:
        return self.pos


def frames(fmt: str, w: Window) -> Iterator[tuple[int, int]]:
    """The (offset, length) of each sample of the file read through ``w``, in file order, as
    ``record_spans`` gives them for its bytes, reading it in pieces (``fixed:N`` has its own,
    ``_index._fixed_pieces``; a whole file is one sample)."""
    fmt = check_format(fmt)
    if fmt == "lines":
        yield from _line_frames(w)
    elif fmt == "tfrecord":
        yield from _tfrecord_frames(w)
    elif fmt == "tar":
        yield from _tar_frames(_WindowFile(w), w.get(0, 6))
    elif fmt in ("npy", "idx"):
        head = w.get(0, 12)
        if fmt == "npy":
            need = _npy_head(head)
        else:
            need = 4 + 4 * head[3] if len(head) >= 4 else 0
        layout = _npy_layout if fmt == "npy" else _idx_layout
        start, rows, row = layout(w.get(0, need) if need else head, w.size())
        for r in range(rows):
            yield start + r * row, row
    else:
        spans = record_spans(fmt, w.get(0, w.size()))
        yield from spans
