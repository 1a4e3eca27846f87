"""Whether an mp4 is whole, from its box structure alone (no decoder, no ffprobe, no torch): checked before a
written video is renamed into place and before `--resume` trusts a segment file.

    summary = read_summary(path)        # Mp4Summary(frames=17, width=112, height=64, fragmented=False)

camrender writes unfragmented mp4s with the index (`moov`) before the data (`mdat`, `+faststart`). Such a file
is whole when its top-level boxes tile it exactly, it holds one `moov` and an `mdat`, and the samples its video
track's sample table counts (`stsz`: one per frame) fit in its `mdat`s. A file cut short, padded, or not an
mp4 at all raises `Mp4Error` saying where.
"""
from __future__ import annotations

import dataclasses
import os
import struct

from camrender.errors import CamrenderError
from camrender.files import open_regular

MAX_INDEX_BYTES = 64 * 2**20  # a moov of 8185 frames' tables is a few hundred KB; past this it is not ours
MAX_TOP_BOXES = 1000  # ftyp, moov, mdat (and free) in ours; a file of millions of tiny boxes is not one


class Mp4Error(ValueError):
    """The file is not a whole mp4 (the message says what is wrong)."""


@dataclasses.dataclass(frozen=True)
class Mp4Summary:
    """frames: samples of the first video track (0 for a fragmented file: its frames live in fragments);
    width, height: that track's size in pixels; fragmented: the file has movie fragments (`moof`)."""

    frames: int
    width: int
    height: int
    fragmented: bool


def _name(kind: bytes) -> str:
    """A box type as text: its four letters, or hex when they are not printable (a garbage file)."""
    return repr(kind.decode("ascii")) if kind.isascii() and kind.decode("ascii").isprintable() else kind.hex()


def _boxes(data: bytes, start: int, end: int):
    """(type, payload start, payload end) of the boxes tiling data[start:end]; Mp4Error when one overruns."""
    at = start
    while at < end:
        if end - at < 8:
            raise Mp4Error(f"{end - at} stray bytes at offset {at}")
        size, kind = struct.unpack_from(">I4s", data, at)
        header = 8
        if size == 1:
            if end - at < 16:
                raise Mp4Error(f"box {_name(kind)} cut short at offset {at}")
            size, header = struct.unpack_from(">Q", data, at + 8)[0], 16
        elif size == 0:
            size = end - at  # "to the end": only the last box may say so
        if size < header or at + size > end:
            raise Mp4Error(f"box {_name(kind)} at offset {at} claims {size} bytes, "
                           f"{end - at} are left")
        yield kind, at + header, at + size
        at += size


def _top_level(handle, length: int):
    """(type, payload start, payload end) of the file's top-level boxes, reading only their headers."""
    at, count = 0, 0
    while at < length:
        count += 1
        if count > MAX_TOP_BOXES:
            raise Mp4Error(f"more than {MAX_TOP_BOXES} top-level boxes")
        handle.seek(at)
        head = handle.read(16)
        if len(head) < 8:
            raise Mp4Error(f"{length - at} stray bytes at the end (offset {at})")
        size, kind = struct.unpack_from(">I4s", head)
        header = 8
        if size == 1 and len(head) == 16:
            size, header = struct.unpack_from(">Q", head, 8)[0], 16
        elif size == 0:
            size = length - at
        if size < header or at + size > length:
            raise Mp4Error(f"cut short: box {_name(kind)} at offset {at} claims {size} bytes, "
                           f"{length - at} are left")
        yield kind, at + header, at + size
        at += size


def _child(data: bytes, start: int, end: int, kind: bytes):
    for found, payload, stop in _boxes(data, start, end):
        if found == kind:
            return payload, stop
    return None


def _video_track(moov: bytes):
    """(frames, width, height, bytes of its samples) of the first video track of a `moov` payload."""
    for kind, start, end in _boxes(moov, 0, len(moov)):
        if kind != b"trak":
            continue
        mdia = _child(moov, start, end, b"mdia")
        hdlr = mdia and _child(moov, *mdia, b"hdlr")
        if not hdlr or moov[hdlr[0] + 8:hdlr[0] + 12] != b"vide":
            continue
        minf = _child(moov, *mdia, b"minf")
        stbl = minf and _child(moov, *minf, b"stbl")
        stsd = stbl and _child(moov, *stbl, b"stsd")
        stsz = stbl and _child(moov, *stbl, b"stsz")
        if not (stsd and stsz) or stsd[1] - stsd[0] < 8 + 36 or stsz[1] - stsz[0] < 12:
            raise Mp4Error("the video track has no sample table")
        width, height = struct.unpack_from(">HH", moov, stsd[0] + 8 + 32)  # the first visual sample entry's size
        sample_size, count = struct.unpack_from(">II", moov, stsz[0] + 4)
        if sample_size:
            total = sample_size * count
        else:
            if stsz[1] - stsz[0] < 12 + 4 * count:
                raise Mp4Error(f"the sample table lists {count} frames but holds fewer sizes")
            total = sum(struct.unpack_from(f">{count}I", moov, stsz[0] + 12)) if count else 0
        return count, width, height, total
    raise Mp4Error("no video track")


def read_summary(path) -> Mp4Summary:
    """The `Mp4Summary` of the mp4 at `path`; Mp4Error when it is not whole (CamrenderError when it is missing
    or not a regular file, OSError when it cannot be read)."""
    with open_regular(path, "video file") as handle:
        length = os.fstat(handle.fileno()).st_size
        if length == 0:
            raise Mp4Error("empty file")
        top = list(_top_level(handle, length))
        kinds = [kind for kind, _, _ in top]
        if kinds[0] != b"ftyp":
            raise Mp4Error("not an mp4 (no ftyp box first)")
        if kinds.count(b"moov") != 1:
            raise Mp4Error(f"{kinds.count(b'moov')} movie indexes (moov), expected one: the file was not finished")
        if b"mdat" not in kinds:
            raise Mp4Error("no media data (mdat)")
        _, start, end = top[kinds.index(b"moov")]
        if end - start > MAX_INDEX_BYTES:
            raise Mp4Error(f"a movie index of {end - start} bytes")
        handle.seek(start)
        moov = handle.read(end - start)
    try:
        frames, width, height, sample_bytes = _video_track(moov)
    except struct.error as error:  # a box too short for what its type holds
        raise Mp4Error(f"a damaged movie index ({error})") from None
    media = sum(end - start for kind, start, end in top if kind == b"mdat")
    if sample_bytes > media:
        raise Mp4Error(f"the index holds {sample_bytes} bytes of frames, the media data {media}: cut short")
    return Mp4Summary(frames, width, height, fragmented=b"moof" in kinds)


def check_whole(video, frames: int | None, shown, size: tuple | None = None) -> None:
    """CamrenderError naming `shown` (the target `video` stands in for) unless the mp4 `video` is whole and,
    when given, holds `frames` frames of `size` (height, width): a writer's last check before the rename."""
    try:
        summary = read_summary(video)
    except (Mp4Error, OSError, CamrenderError) as error:
        reason = getattr(error, "detail", error)
        raise CamrenderError(f"the written video is not whole ({reason}); is the disk full?", path=shown) from None
    if (frames is not None and summary.frames != frames) or (size is not None and
                                                              (summary.height, summary.width) != tuple(size)):
        raise CamrenderError(f"the written video holds {summary.frames} frames of {summary.width}x{summary.height}, "
                             f"not the {frames} written; is the disk full?", path=shown)
