"""Reading a video to score: its frame count, rate and size (`probe`), and chosen frames (`read_frames`), through
imageio-ffmpeg. Anything ffmpeg cannot read is one CamrenderError naming the file (field "video")."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from camrender.errors import CamrenderError


@dataclass(frozen=True)
class VideoInfo:
    """A readable video: `frames` decoded frames of `width` x `height` pixels at `fps`."""

    path: str
    frames: int
    fps: float
    width: int
    height: int


def _unreadable(path, error) -> CamrenderError:
    # imageio-ffmpeg's message: a summary line, then ffmpeg's whole stderr (banner first, the reason last)
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and not line.startswith("===")]
    reason = (lines[0] + (f" ({lines[-1]})" if len(lines) > 1 else ""))[:200] if lines else type(error).__name__
    return CamrenderError(f"cannot read the video: {reason}", path=path, field="video")


def probe(path) -> VideoInfo:
    """Frame count (every frame decoded once, as the scorer reads them), frame rate and size of the video at `path`."""
    import imageio_ffmpeg  # lazy: ffmpeg only for the commands that read videos

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CamrenderError("file not found" if not os.path.exists(path) else "is not a file", path=path,
                             field="video")
    reader = imageio_ffmpeg.read_frames(path)
    try:
        meta = next(reader)
        frames, _ = imageio_ffmpeg.count_frames_and_secs(path)
    except (OSError, RuntimeError, StopIteration, ValueError, KeyError) as error:
        raise _unreadable(path, error) from None
    finally:
        reader.close()
    width, height = meta.get("size") or (0, 0)
    if frames < 1 or width < 1 or height < 1:
        raise CamrenderError(f"holds no picture ({frames} frames of {width}x{height})", path=path, field="video")
    return VideoInfo(path, int(frames), float(meta.get("fps") or 0.0), int(width), int(height))


def read_frames(info: VideoInfo, indices) -> np.ndarray:
    """(len(indices), height, width, 3) uint8: the frames at `indices` (any order, repeats allowed) in one pass."""
    import imageio_ffmpeg

    indices = [int(i) for i in indices]
    wanted = set(indices)
    if not wanted:
        return np.zeros((0, info.height, info.width, 3), np.uint8)
    kept = {}
    reader = imageio_ffmpeg.read_frames(info.path)
    try:
        next(reader)
        for index, data in enumerate(reader):
            if index in wanted:
                kept[index] = np.frombuffer(data, np.uint8).reshape(info.height, info.width, 3).copy()
                if len(kept) == len(wanted):
                    break
    except (OSError, RuntimeError, ValueError) as error:
        raise _unreadable(info.path, error) from None
    finally:
        reader.close()
    missing = sorted(wanted - set(kept))
    if missing:
        raise CamrenderError(f"ends before frame {missing[0]} ({info.frames} frames were counted)", path=info.path,
                             field="video")
    return np.stack([kept[i] for i in indices])
