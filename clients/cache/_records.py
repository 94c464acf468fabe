"""Record formats: the samples inside a dataset's files, when a file holds many.

Public training sets are rarely one file per sample: TFRecord shards, WebDataset tar shards,
JSON-lines files, flat token or feature arrays (``.bin``, ``.npy``). Registered with a record
format, each *record* is a sample of its own, named by the digest of its bytes like a file is,
so the substitutable sampler, the cache's chunks and their sharing work per sample whatever the
container. Every function here is pure: a file's bytes in, the byte spans of its samples out.

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
from collections.abc import Callable

from microco.common.errors import InvalidArgument

__all__ = ["FORMATS", "check_format", "record_spans", "tar_sample"]

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
    for magic, kind in _COMPRESSED.items():
        if data.startswith(magic):
            # tarfile's own word for it is "truncated header" or "invalid header".
            raise InvalidArgument(
                f"a {kind}-compressed tar (.tgz, .tar.gz...): decompress it first (records are read by range)"
            )
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
        everything = tf.getmembers()
    except tarfile.TarError as exc:
        raise InvalidArgument(f"not a tar file: {exc}") from exc
    for m in everything:
        if m.islnk() or m.issym():
            # Its bytes are another member's, outside this sample's fragment: ``tar_sample``
            # would silently give the sample without it.
            raise InvalidArgument(
                f"tar member {m.name!r} is a {'hard' if m.islnk() else 'symbolic'} link to "
                f"{m.linkname!r}: write the shard with each member's own bytes "
                "(GNU tar --hard-dereference / --dereference)"
            )
    members = [m for m in everything if m.isfile()]
    out: Spans = []
    key, start, end, names = None, 0, 0, set()
    for m in members:
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
            out.append((start, end - start))
        key, start, end, names = k, m.offset, stop, {m.name}
    if key is not None:
        out.append((start, end - start))
    return out


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
    body = len(data) - start
    if body < rows * row:
        raise InvalidArgument(
            f".npy data of {body} bytes is short of its {rows} rows of {row} bytes (a truncated file?)"
        )
    return [(start + r * row, row) for r in range(rows)]


# IDX's type codes (the third byte of its magic) -> bytes per value.
_IDX_ITEM = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def _idx(data: bytes) -> Spans:
    """Items of an IDX file (LeCun's MNIST layout, what torchvision's ``MNIST`` reads): two zero
    bytes, a type code, the number of dimensions, each dimension as a big-endian uint32, then
    the values; an item is one index along the first dimension. Without this format such a file
    could only be one sample (its 16-byte header breaks ``fixed:N``)."""
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
    body = len(data) - start
    # Exactly: torchvision refuses a file whose body is not its shape's too.
    if body != shape[0] * row:
        raise InvalidArgument(
            f"IDX data of {body} bytes is not its {shape[0]} items of {row} bytes (a truncated or padded file?)"
        )
    return [(start + r * row, row) for r in range(shape[0])]


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
