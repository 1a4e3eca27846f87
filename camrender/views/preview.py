"""CPU preview of a camera path through a synthetic proxy scene (numpy only, no torch).

The proxy scene lives in the OpenCV world frame the trajectory uses (+x right, +y down,
+z forward), so "up" is -y. With ``scale = 1`` (world units of the trajectory):

* ground: the plane y = +1.5 (1.5 units below the origin), a 1-unit checker with grid
  lines; the world x axis (z = 0) is drawn red, the z axis (x = 0) blue;
* a fixed grain over the ground and the landmarks (`camrender.views.grain`), features for
  pose estimators;
* sky: a gradient from a pale horizon to a deep blue zenith, with fog over the ground
  so the horizon line is visible;
* landmarks standing on the ground (see `LANDMARKS`): red ahead (+z), magenta right
  (+x), cyan left (-x), orange behind (-z), and others, so a glance tells where the
  camera looks.

By default poses are taken relative to frame 0 (``inv(c2w_0) @ c2w_f``), as the model
sees them (SPEC section 1.1): the first frame always looks from the origin along +z
(dark post 2 units ahead, red sphere behind it). Pixel (column u, row v) has image coordinates (u, v) (OpenCV: pixel
centres at integer coordinates), ray direction ((u - cx) / fx, (v - cy) / fy, 1) in the
camera frame -- the same grid the model's Plucker maps use.

Rendering is per-pixel analytic ray casting in float32: sky and ground vectorised over
bands of rows (threads share the bands: numpy releases the GIL on large array
operations), each landmark over the pixel window its projection can cover.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from camrender.errors import CamrenderError
from camrender.limits import MAX_PREVIEW_SIDE
from camrender.trajectory.rotations import relative_poses
from camrender.trajectory.stats import fields_of_view
from camrender.views.overlay import draw_text
from camrender.views.proxy_scene import GROUND_Y, LANDMARKS, Landmark, ProxyScene  # noqa: F401 (re-exported)

PREVIEW_X264_PRESET = "veryfast"

def preview_size(traj, width: int | None = None, height: int | None = None) -> tuple[int, int]:
    """Output (width, height): the trajectory's own size, or the requested one (the missing side
    keeps the aspect ratio; both rounded to even numbers for H.264)."""
    if width is None and height is None:
        w, h = traj.width, traj.height
    elif height is None:
        w, h = width, width * traj.height / traj.width
    elif width is None:
        w, h = height * traj.width / traj.height, height
    else:
        w, h = width, height
    w, h = max(2, int(math.floor(w / 2 + 0.5)) * 2), max(2, int(math.floor(h / 2 + 0.5)) * 2)
    if max(w, h) > MAX_PREVIEW_SIDE:
        given = "--width/--height" if width is not None or height is not None else "the trajectory's image size"
        raise CamrenderError(f"a preview is at most {MAX_PREVIEW_SIDE} pixels a side, got {w}x{h} from {given}",
                             field="size")
    return w, h


def scaled_intrinsics(traj, width: int, height: int) -> np.ndarray:
    """(F, 4) intrinsics of `traj` rescaled to width x height (fx, cx times width/W; fy, cy times height/H)."""
    k = np.asarray(traj.intrinsics, np.float64).copy()
    k[:, [0, 2]] *= width / traj.width
    k[:, [1, 3]] *= height / traj.height
    return k


def pose_angles(c2w: np.ndarray) -> tuple[float, float, float]:
    """(yaw, pitch, roll) in degrees of an OpenCV c2w: yaw > 0 turned towards +x, pitch > 0
    looking up (towards -y), roll about the view axis (right-handed about +z)."""
    r = np.asarray(c2w)[:3, :3]
    yaw = math.degrees(math.atan2(r[0, 2], r[2, 2]))
    pitch = math.degrees(math.asin(max(-1.0, min(1.0, -r[1, 2]))))
    roll = math.degrees(math.atan2(r[1, 0], r[1, 1]))
    return yaw + 0.0, pitch + 0.0, roll + 0.0  # + 0.0 turns -0.0 into 0.0 for display


def render_frames(traj, *, width: int | None = None, height: int | None = None, overlay: bool = False,
                  scene_scale: float = 1.0, relative: bool = True, threads: int | None = None):
    """Yield one (H, W, 3) uint8 frame per trajectory frame (see module docstring)."""
    w, h = preview_size(traj, width, height)
    intr = scaled_intrinsics(traj, w, h)
    poses = relative_poses(traj.c2w) if relative else np.asarray(traj.c2w, np.float64)
    scene = ProxyScene(scene_scale)
    threads = threads or min(8, os.cpu_count() or 1)
    executor = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        for f in range(len(poses)):
            image = scene.render(poses[f], intr[f], w, h, executor=executor)
            if overlay:
                draw_text(image, overlay_lines(f, len(poses), poses[f], intr[f], w, h))
            yield image
    finally:
        if executor is not None:
            executor.shutdown()


def overlay_lines(frame: int, num_frames: int, c2w, intrinsics, width: int, height: int) -> list[str]:
    """Text drawn by --overlay: frame number, camera position, yaw/pitch/roll and horizontal fov."""
    x, y, z = np.asarray(c2w)[:3, 3]
    yaw, pitch, roll = pose_angles(c2w)
    hfov = fields_of_view([intrinsics], width, height)[0][0]
    return [
        f"frame {frame}/{num_frames - 1}",
        f"x {x:+.2f} y {y:+.2f} z {z:+.2f}",
        f"yaw {yaw:+.1f} pitch {pitch:+.1f} roll {roll:+.1f}",
        f"hfov {hfov:.1f}",
    ]


def write_preview(traj, path, *, width: int | None = None, height: int | None = None, overlay: bool = False,
                  scene_scale: float = 1.0, relative: bool = True, progress=None) -> tuple[int, int]:
    """Render the preview of `traj` to an mp4 at `path` (atomic); returns the (width, height) written.
    progress: None, or `progress(done, total)` called after each frame (`camrender.cli.progress.StageProgress`)."""
    # lazy: keeps `camrender --help` and the other `traj` commands free of imageio_ffmpeg (output.video imports it)
    from camrender.output.video import VideoWriter

    w, h = preview_size(traj, width, height)
    frames = render_frames(traj, width=w, height=h, overlay=overlay, scene_scale=scene_scale, relative=relative)
    # x264's default ("medium") costs more than the rendering itself.
    # points at or behind a camera plane divide by ~0: the scene clips them; numpy's warnings are noise here
    with VideoWriter(path, traj.fps, preset=PREVIEW_X264_PRESET) as writer, np.errstate(all="ignore"):
        for done, image in enumerate(frames, 1):
            writer.append(image[None])
            if progress is not None:
                progress(done, traj.num_frames)
    return w, h
