"""Read the text files gpupool takes (configuration, traces, node lists, profiles) as UTF-8, each
problem said in one sentence: a file that is not UTF-8 (with the line of the first bad byte), one that
is gzip-compressed, or one past a bound (a device such as /dev/zero named by mistake has no end)."""

from __future__ import annotations

import io
from pathlib import Path

from gpupool.errors import InvalidInput

_GZIP_MAGIC = b"\x1f\x8b"


def read_text(path: Path | str, what: str, *, bound: tuple[int, str] | None = None) -> str:
    """The UTF-8 text of `path` (`what` names it in errors: 'the configuration file'). OSError as
    open() raises it; InvalidInput with one sentence when the file is not UTF-8, or, with `bound`
    (the most bytes, the sentence past them), when it holds more, of which no more is read (a device
    or a pipe named by mistake, such as /dev/zero, has no end)."""
    with open(path, "rb") as handle:
        data = handle.read() if bound is None else handle.read(bound[0] + 1)
    if bound is not None and len(data) > bound[0]:
        raise InvalidInput(bound[1])
    if data.startswith(_GZIP_MAGIC):
        raise InvalidInput(f"Cannot read {what} {str(path)!r}: it is gzip-compressed; decompress it first "
                           f"(gunzip -k {str(path)!r}) and give the uncompressed file.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidInput(f"Cannot read {what} {str(path)!r}: it is not UTF-8 text (byte "
                           f"0x{data[exc.start]:02x} on line {line}); save it as UTF-8.") from None


def text_stream(path: Path | str, what: str) -> io.StringIO:
    """`read_text(path, what)` as a stream for the csv module (newline='' as csv asks): a CSV file that
    is not UTF-8, or is compressed, is one sentence before any row is read, never a decoding error in
    the middle of reading it."""
    return io.StringIO(read_text(path, what), newline="")
