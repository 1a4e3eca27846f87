"""Atomic H.264 mp4 writing through imageio-ffmpeg (no torch import: trajectory previews use it too).

    with VideoWriter("orbit.mp4", fps=16) as video:
        video.append(frames)          # uint8 (F, H, W, 3), any number of calls

Frames go to a temporary file next to the target (``.orbit.mp4.<random>.part.mp4``), which is
renamed onto the target only when the `with` block ends cleanly; on an exception or Ctrl-C
the temporary file is deleted and the target is left untouched. The mp4 is fragmented
(``+frag_keyframe+empty_moov+default_base_moof``), so the partial file can be played while
segments are still being appended.
"""
from __future__ import annotations

from pathlib import Path

import imageio_ffmpeg
import numpy as np

from camrender.errors import CamrenderError
from camrender.files import check_output_path, create_new, place, temp_name_beside

FRAGMENTED_MOVFLAGS = "+frag_keyframe+empty_moov+default_base_moof"


class VideoWriter:
    """Context manager writing an H.264 (yuv420p) mp4 atomically.

    Args:
        path: target file (``.mp4``).
        fps: frame rate (frames per second, may be fractional).
        fragmented: write a fragmented mp4 (playable while being written).
        crf: x264 constant rate factor (lower is better quality; 18 is visually lossless).
        preset: x264 speed preset ("veryfast" encodes about 2.5x faster than "medium" at a larger size).
    """

    def __init__(self, path, fps: float, fragmented: bool = True, crf: int = 18,
                 preset: str = "medium"):
        self.path = check_output_path(path)
        if not fps > 0:
            raise CamrenderError(f"fps must be positive, got {fps}", path=self.path, field="fps")
        self.fps = float(fps)
        self.fragmented = fragmented
        self.crf = int(crf)
        self.preset = str(preset)
        self.partial_path: Path | None = None  # the temporary file while writing
        self.frames_written = 0
        self.size: tuple[int, int] | None = None  # (height, width) of the first frame
        self._writer = None

    def __enter__(self) -> "VideoWriter":
        # the name is held before the file exists: a Ctrl-C landing anywhere in its creation removes it
        self.partial_path = Path(temp_name_beside(self.path, ".part.mp4", prefix=f".{self.path.name}."))
        try:
            create_new(self.partial_path, self.path)
        except CamrenderError:  # not created
            self.partial_path = None
            raise
        except BaseException:
            self.partial_path.unlink(missing_ok=True)
            self.partial_path = None
            raise
        return self

    def append(self, frames) -> None:
        """Append frames: uint8 array (F, H, W, 3) or (H, W, 3); every call must keep the same H, W."""
        frames = np.asarray(frames)
        if frames.ndim == 3:
            frames = frames[None]
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"frames must be (F, H, W, 3), got {frames.shape}")
        if frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8, got {frames.dtype}")
        if self.partial_path is None:
            raise RuntimeError("VideoWriter.append outside its `with` block")
        height, width = frames.shape[1:3]
        if self._writer is None:
            if height % 2 or width % 2:
                raise CamrenderError(
                    f"H.264 needs an even frame size, got {width}x{height}", path=self.path, field="size"
                )
            self.size = (height, width)
            self._writer = self._start(width, height)
        elif (height, width) != self.size:
            raise ValueError(f"frame size changed from {self.size} to {(height, width)}")
        for frame in frames:
            self._writer.send(np.ascontiguousarray(frame))
        self.frames_written += len(frames)

    def _start(self, width: int, height: int):
        output_params = ["-crf", str(self.crf), "-preset", self.preset, "-f", "mp4"]
        if self.fragmented:
            output_params += ["-movflags", FRAGMENTED_MOVFLAGS]
        writer = imageio_ffmpeg.write_frames(
            str(self.partial_path),
            (width, height),
            fps=self.fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            quality=None,
            macro_block_size=1,  # sizes are checked above; never let ffmpeg rescale
            ffmpeg_log_level="error",
            output_params=output_params,
        )
        writer.send(None)  # start ffmpeg
        return writer

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                if self.frames_written == 0:
                    raise CamrenderError("no frames were rendered", path=self.path)
                self._close_writer()
                place(self.partial_path, self.path)
                self.partial_path = None
        finally:
            if self.partial_path is not None:  # error, Ctrl-C, or a failed close: leave nothing behind
                try:
                    self._close_writer()
                except Exception:
                    pass
                try:
                    self.partial_path.unlink()
                except FileNotFoundError:
                    pass
                self.partial_path = None
        return False
