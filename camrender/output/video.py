"""Atomic H.264 mp4 writing through the ffmpeg that imageio-ffmpeg bundles (no torch import: trajectory
previews use it too).

    with VideoWriter("orbit.mp4", fps=16) as video:
        video.append(frames)          # uint8 (F, H, W, 3), any number of calls

Frames go to a temporary file next to the target (``.orbit.mp4.<random>.part.mp4``), which is
renamed onto the target only when the `with` block ends cleanly and the file is whole: ffmpeg exited
without an error (a full disk, a file-size limit) and the mp4's own index holds every frame appended
(`camrender.output.mp4_check`). Otherwise the temporary file is deleted, the target is left untouched and
the error is one line. The mp4 is unfragmented with its index first (``+faststart``): players seek in it
at once and tools report its frame count; every video camrender writes (full mode, segment mode, previews,
live flights) is written this way.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from camrender.errors import CamrenderError
from camrender.files import check_output_path, create_new, place, temp_name_beside
from camrender.output.mp4_check import check_whole

MOVFLAGS = "+faststart"
# Popen's arguments for a child in a process group of its own (Python 3.10: the same through os.setpgrp)
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
STDERR_SHOWN = 200  # characters of ffmpeg's last error line put into the one-line error


def exit_words(code) -> str:
    """What ffmpeg's exit status `code` says (a negative one: the signal that stopped it, e.g. a file-size
    limit's SIGXFSZ)."""
    if code is not None and code < 0:
        try:
            return f"ffmpeg was stopped by {signal.Signals(-code).name} ({signal.strsignal(-code)})"
        except ValueError:
            return f"ffmpeg was stopped by signal {-code}"
    return f"ffmpeg exited with status {code}" if code else "ffmpeg stopped"


class VideoWriter:
    """Context manager writing an H.264 (yuv420p) mp4 atomically.

    Args:
        path: target file (``.mp4``).
        fps: frame rate (frames per second, may be fractional).
        crf: x264 constant rate factor (lower is better quality; 18 is visually lossless).
        preset: x264 speed preset ("veryfast" encodes about 2.5x faster than "medium" at a larger size).
    """

    def __init__(self, path, fps: float, crf: int = 18, preset: str = "medium"):
        self.path = check_output_path(path)
        if not fps > 0:
            raise CamrenderError(f"fps must be positive, got {fps}", path=self.path, field="fps")
        self.fps = float(fps)
        self.crf = int(crf)
        self.preset = str(preset)
        self.partial_path: Path | None = None  # the temporary file while writing
        self.frames_written = 0
        self.size: tuple[int, int] | None = None  # (height, width) of the first frame
        self._encoder: subprocess.Popen | None = None
        self._log = None  # ffmpeg's stderr, a temporary file (a pipe could fill up and stall it)

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
        if self._encoder is None:
            if height % 2 or width % 2:
                raise CamrenderError(
                    f"H.264 needs an even frame size, got {width}x{height}", path=self.path, field="size"
                )
            self.size = (height, width)
            self._start(width, height)
        elif (height, width) != self.size:
            raise ValueError(f"frame size changed from {self.size} to {(height, width)}")
        try:
            for frame in frames:
                self._encoder.stdin.write(np.ascontiguousarray(frame).data)
        except OSError:  # ffmpeg stopped (a full disk, a file-size limit): its own words say why
            raise self._failure("writing the video failed") from None
        self.frames_written += len(frames)

    def _start(self, width: int, height: int) -> None:
        rate = Fraction(self.fps).limit_denominator()
        command = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-nostdin", "-loglevel", "error",
                   "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(rate), "-i", "-",
                   "-an", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", str(self.crf), "-preset", self.preset,
                   "-movflags", MOVFLAGS, "-f", "mp4", os.fspath(self.partial_path)]
        self._log = tempfile.TemporaryFile()
        # its own process group: a Ctrl-C at the terminal reaches this process, which stops ffmpeg and removes the
        # partial file (ffmpeg would otherwise stop on its own and leave a file that looks finished)
        self._encoder = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._log,
                                         **OWN_GROUP)

    def _finish(self) -> None:
        """Close ffmpeg's input and wait for it; CamrenderError when it failed or the file is not whole."""
        encoder = self._encoder
        try:
            encoder.stdin.close()
        except OSError:
            pass
        if encoder.wait() != 0:
            raise self._failure("writing the video failed")
        check_whole(self.partial_path, self.frames_written, self.path, self.size)

    def _failure(self, what: str) -> CamrenderError:
        """The one-line error of a failed ffmpeg, with its last error line (it is stopped first)."""
        self._stop()
        said = ""
        if self._log is not None:
            self._log.seek(0)
            lines = [line for line in self._log.read().decode("utf-8", "replace").splitlines() if line.strip()]
            said = " ".join(lines[-1].split())[:STDERR_SHOWN] if lines else ""
        code = self._encoder.returncode if self._encoder is not None else None
        return CamrenderError(f"{what}: {said or exit_words(code)}", path=self.path)

    def _stop(self) -> None:
        """Stop ffmpeg if it still runs (an error or an interrupt: what it wrote is discarded)."""
        encoder = self._encoder
        if encoder is None:
            return
        if encoder.poll() is None:
            encoder.kill()
        encoder.wait()
        try:
            encoder.stdin.close()
        except OSError:
            pass

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                if self.frames_written == 0:
                    raise CamrenderError("no frames were rendered", path=self.path)
                self._finish()
                try:
                    place(self.partial_path, self.path)
                except OSError as error:
                    raise CamrenderError(f"cannot write: {error.strerror or error}", path=self.path) from None
                self.partial_path = None
        finally:
            if self.partial_path is not None:  # error, Ctrl-C, or a failed close: leave nothing behind
                self._stop()
                try:
                    self.partial_path.unlink()
                except FileNotFoundError:
                    pass
                self.partial_path = None
            if self._log is not None:
                self._log.close()
                self._log = None
        return False
