"""Segment-mode video output: one independently encoded mp4 per segment in a partial folder,
joined (stream copy, no re-encode) into the target when the render completes.

Each segment is its own H.264 stream (a fresh x264 encoder, starting with a keyframe), so the
bytes of segment k depend only on its frames: a render that resumes at segment k writes
exactly the files an uninterrupted render would have written, and the joined video is the
same frame for frame. Layout (`camrender.render.resume` owns the folder):

    .NAME.mp4.partial/segment-00000.mp4, segment-00001.mp4, ...   each playable on its own
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import imageio_ffmpeg

from camrender.errors import CamrenderError
from camrender.files import atomic_path, fsync_path, remove_quietly, temp_beside
from camrender.output.mp4_check import check_whole
from camrender.output.video import STDERR_SHOWN, VideoWriter, exit_words

SEGMENT_PATTERN = "segment-{:05d}.mp4"
SEGMENT_NAME = re.compile(r"segment-(\d{5})\.mp4")


def segment_files(folder: Path) -> list[Path]:
    """The entries of `folder` named as segment files (`SEGMENT_PATTERN`, nothing else), in order."""
    if not folder.is_dir():
        return []
    return sorted((path for path in folder.iterdir() if SEGMENT_NAME.fullmatch(path.name)), key=lambda p: p.name)


def segment_path(folder: Path, index: int) -> Path:
    """Segment `index`'s file in `folder`."""
    return Path(folder) / SEGMENT_PATTERN.format(index)


class SegmentVideoWriter:
    """`VideoWriter`'s interface (`with`, `append`, `frames_written`) for segment mode: every
    `append` call is one segment, written to its own file in `folder`; a clean exit joins them
    into `path` (atomically) and leaves the folder to its owner to remove.

    first_segment: index of the first segment this run appends (a resume continues the
    numbering; files from that index on, rendered after the checkpoint, are replaced).
    frames_before: video frames the earlier segments hold.
    """

    def __init__(self, path, fps: float, folder: Path, first_segment: int = 0, frames_before: int = 0):
        self.path = Path(path)
        self.fps = float(fps)
        self.folder = Path(folder)
        self.next_segment = first_segment
        self.frames_written = frames_before

    def __enter__(self) -> "SegmentVideoWriter":
        self.folder.mkdir(exist_ok=True)
        missing = [index for index in range(self.next_segment) if not segment_path(self.folder, index).is_file()]
        if missing:
            raise CamrenderError(f"the checkpoint is at segment {self.next_segment} but segment file {missing[0]} "
                                 f"is not in {self.folder}", path=self.path)
        for stale in segment_files(self.folder):  # rendered after the checkpoint: they are rendered again
            if int(SEGMENT_NAME.fullmatch(stale.name).group(1)) >= self.next_segment:
                remove_entry(stale)
        return self

    def append(self, frames) -> None:
        """Write one segment's uint8 frames (F, H, W, 3) as the next segment file."""
        target = segment_path(self.folder, self.next_segment)
        with VideoWriter(target, fps=self.fps) as video:
            video.append(frames)
        fsync_path(target)  # a checkpoint written after it may refer to it (its rename: `save_tree`)
        self.next_segment += 1
        self.frames_written += video.frames_written

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            parts = [segment_path(self.folder, index) for index in range(self.next_segment)]
            join_segments(parts, self.path, frames=self.frames_written)
        return False


def concat_listing(parts: list) -> str:
    """ffmpeg's concat list of `parts` (files of one folder, where the list is written): names relative to
    that folder, quoted for the concat demuxer, so the folder's own name (a quote, a newline) never meets
    its parser."""
    lines = []
    for part in parts:
        name = Path(part).name
        if "\n" in name or "\r" in name:
            raise CamrenderError("a segment file name holds a line break", path=part)
        lines.append("file '" + name.replace("'", "'\\''") + "'\n")
    return "".join(lines)


def join_segments(parts: list, path: Path, frames: int | None = None) -> None:
    """Join mp4 files of one folder and one stream settings into `path` by stream copy (ffmpeg's concat
    demuxer), through a temporary file renamed into place once ffmpeg succeeded and the file is whole
    (holding `frames` frames when given); any failure is one CamrenderError and leaves nothing at `path`."""
    if not parts:
        raise CamrenderError("no frames were rendered", path=path)
    folders = {os.path.dirname(os.path.abspath(part)) for part in parts}
    if len(folders) != 1:
        raise ValueError("join_segments joins the files of one folder")
    listing = temp_beside(parts[0], ".list.txt", prefix=".join.")
    try:
        with open(listing, "w", encoding="utf-8") as out:
            out.write(concat_listing(parts))
        with atomic_path(path, prefix=f".{path.name}.", suffix=".part.mp4") as temp:
            command = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-nostdin", "-loglevel", "error", "-f", "concat",
                       "-safe", "0", "-i", listing, "-c", "copy", "-movflags", "+faststart", temp]
            result = subprocess.run(command, capture_output=True, text=True, errors="replace")
            if result.returncode != 0:
                said = " ".join(result.stderr.split())[:STDERR_SHOWN] or exit_words(result.returncode)
                raise CamrenderError(f"joining the segments failed: {said}", path=path)
            check_whole(temp, frames, path)
    except OSError as error:
        raise CamrenderError(f"joining the segments failed: {error.strerror or error}", path=path) from None
    finally:
        remove_quietly(listing)


def remove_entry(path: Path) -> None:
    """Remove a file, a link or a folder (a stale entry of the partial folder, whatever it became)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
