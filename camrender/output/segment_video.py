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
import subprocess
from pathlib import Path

import imageio_ffmpeg

from camrender.errors import CamrenderError
from camrender.files import atomic_path, fsync_path, remove_quietly, temp_beside
from camrender.output.video import VideoWriter

SEGMENT_PATTERN = "segment-{:05d}.mp4"


def segment_files(folder: Path) -> list[Path]:
    """The segment files in `folder`, in order."""
    return sorted(folder.glob("segment-*.mp4")) if folder.is_dir() else []


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
        present = segment_files(self.folder)
        if len(present) < self.next_segment:
            raise CamrenderError(f"the checkpoint is at segment {self.next_segment} but only {len(present)} "
                                 f"segment files are in {self.folder}", path=self.path)
        for stale in present[self.next_segment:]:  # rendered after the checkpoint: they are rendered again
            stale.unlink()
        return self

    def append(self, frames) -> None:
        """Write one segment's uint8 frames (F, H, W, 3) as the next segment file."""
        target = self.folder / SEGMENT_PATTERN.format(self.next_segment)
        with VideoWriter(target, fps=self.fps, fragmented=False) as video:
            video.append(frames)
        fsync_path(target)  # a checkpoint written after it may refer to it (its rename: `save_tree`)
        self.next_segment += 1
        self.frames_written += video.frames_written

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            join_segments(segment_files(self.folder), self.path)
        return False


def join_segments(parts: list, path: Path) -> None:
    """Join mp4 files of one stream settings into `path` by stream copy (ffmpeg's concat demuxer),
    through a temporary file renamed into place."""
    if not parts:
        raise CamrenderError("no frames were rendered", path=path)
    listing = temp_beside(path, ".list.txt", prefix=f".{path.name}.")
    with open(listing, "w") as out:
        out.writelines(f"file '{os.path.abspath(part)}'\n" for part in parts)
    try:
        with atomic_path(path, prefix=f".{path.name}.", suffix=".part.mp4") as temp:
            command = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error", "-f", "concat", "-safe", "0",
                       "-i", listing, "-c", "copy", "-movflags", "+faststart", temp]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise CamrenderError(f"joining the segments failed: {' '.join(result.stderr.split())[:200]}",
                                     path=path)
    finally:
        remove_quietly(listing)


