"""The camera path as a stream: per-segment cameras in, the transformer's camera tensors out, as needed.

A render does not need the whole path before it starts. The caller hands in an iterable of
`SegmentCamera` (the poses and intrinsics of some consecutive video frames: one segment's, usually);
`CameraFeed.take(start, stop)` pulls from it only as many items as latent frames [start, stop) need.
The segment loop asks for segment k's cameras when it starts segment k, after segment k-1's latents
are finished, so a generator that reads the user's latest input at that moment steers the next
segment while the earlier ones are refined, decoded and written (a queue filled by another thread
works the same way: the generator blocks on it).

Video frames of latent frames [start, stop) with the VAE's time stride s = 8 (`video_frames`):
[0, s (stop - 1) + 1) for the first segment, [s (start - 1) + 1, s (stop - 1) + 1) after it, so the
segments of a path tile its frames. Latent frame 0's Plucker window reads video frames 0..7: a
first segment of one latent frame makes the feed pull the next segment's cameras too.

The tensors equal, bit for bit, the rows of the whole path's (`camrender.render.camera.build_camera_inputs`):
each latent frame is computed on its own from the frames it reads.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Optional

import numpy as np
import torch

from camrender.errors import CamrenderError
from camrender.model.device import to_device
from camrender.render.camera import latent_camera_rows, to_latent_grid
from camrender.trajectory.crop import crop_intrinsics
from camrender.trajectory.model import Trajectory, validate_intrinsics, validate_pose
from camrender.trajectory.rotations import invert_rigid

TIME_STRIDE = 8  # video frames per latent frame after the first (the VAE's time compression)


@dataclasses.dataclass(frozen=True, eq=False)
class SegmentCamera:
    """The cameras of consecutive video frames of a path (one segment's, usually).

    c2w: (F_seg, 4, 4) camera-to-world poses, OpenCV camera axes, world units (any origin: the render
    takes them relative to the path's first frame); intrinsics: (F_seg, 4) [fx, fy, cx, cy] in pixels
    of a `width` x `height` image (the first-frame image's size; cover-cropped to the video like it).
    """

    c2w: np.ndarray
    intrinsics: np.ndarray
    width: int
    height: int

    def __post_init__(self):
        object.__setattr__(self, "c2w", np.asarray(self.c2w, dtype=np.float64))
        object.__setattr__(self, "intrinsics", np.asarray(self.intrinsics, dtype=np.float64))
        if self.c2w.ndim != 3 or self.c2w.shape[1:] != (4, 4) or not len(self.c2w):
            raise CamrenderError(f"poses must have shape (F, 4, 4) with F >= 1, got {self.c2w.shape}", field="c2w")
        if self.intrinsics.shape != (len(self.c2w), 4):
            raise CamrenderError(f"intrinsics must have shape ({len(self.c2w)}, 4), got {self.intrinsics.shape}",
                                 field="intrinsics")

    @property
    def num_frames(self) -> int:
        return len(self.c2w)


def video_frames(start: int, stop: int, time_stride: int = TIME_STRIDE) -> tuple:
    """Half-open range of the video frames latent frames [start, stop) stand for (module docstring)."""
    first = 0 if start == 0 else time_stride * (start - 1) + 1
    return first, time_stride * (stop - 1) + 1


def trajectory_segments(traj: Trajectory, bounds, time_stride: int = TIME_STRIDE) -> Iterator[SegmentCamera]:
    """Yield `traj`'s cameras one segment at a time: bounds are latent-frame ranges (`segment_bounds`)."""
    for start, stop in bounds:
        first, last = video_frames(start, stop, time_stride)
        yield SegmentCamera(traj.c2w[first:last], traj.intrinsics[first:last], traj.width, traj.height)


class CameraFeed:
    """Camera tensors of latent frames, computed from an iterable of `SegmentCamera` pulled as needed.

    num_frames: F, the video frames the render makes (8k + 1); the stream must hold exactly that many.
    height, width: video size in pixels; vae_stride: (time, height, width) compression of the VAE;
    device, dtype: of the returned tensors; batch: rows of the camera conditions (2 under guidance).
    """

    def __init__(self, cameras: Iterable[SegmentCamera], *, num_frames: int, height: int, width: int,
                 vae_stride=(TIME_STRIDE, 32, 32), device="cpu", dtype=torch.float32, batch: int = 1):
        self._cameras = iter(cameras)
        self.num_frames = int(num_frames)
        self.height, self.width = int(height), int(width)
        self.time_stride = int(vae_stride[0])
        self.latent_h, self.latent_w = self.height // vae_stride[1], self.width // vae_stride[2]
        self.latent_frames = (self.num_frames - 1) // self.time_stride + 1
        self.device, self.dtype, self.batch = device, dtype, int(batch)
        self._poses = []  # (n, 4, 4) float64 relative to video frame 0, per pulled item
        self._intrinsics = []  # (n, 4) float64 on the latent grid
        self._first_inverse: Optional[np.ndarray] = None
        self._size = None
        self.received = 0  # video frames pulled so far
        self.pulls = 0  # items pulled so far

    def take(self, start: int, stop: int) -> tuple:
        """(camera_conditions (batch, t, 20), chunk_plucker (1, 48, t, h, w)) of latent frames [start, stop),
        t = stop - start, in the feed's device and dtype. Pulls cameras until those frames are known."""
        if not 0 <= start < stop <= self.latent_frames:
            raise ValueError(f"latent frames [{start}, {stop}) are outside the render's {self.latent_frames}")
        reads = max(self.time_stride * (stop - 1), min(self.time_stride - 1, self.num_frames - 1))
        self._pull_until(reads)
        poses, intrinsics = np.concatenate(self._poses), np.concatenate(self._intrinsics)
        conditions, plucker = latent_camera_rows(poses, intrinsics, range(start, stop), self.num_frames,
                                                 self.latent_h, self.latent_w, self.time_stride)
        # float64 -> float32 on the CPU, then the model's dtype on its device: as the whole-path tensors (copied
        # without waiting for the GPU's queue: the previous segment's passes may still be running)
        conditions = torch.from_numpy(np.ascontiguousarray(conditions)).float()[None]
        plucker = torch.from_numpy(np.ascontiguousarray(plucker)).float()[None]
        return (to_device(conditions, self.device, self.dtype).repeat(self.batch, 1, 1),
                to_device(plucker, self.device, self.dtype))

    def _pull_until(self, frame: int) -> None:
        """Pull items until video frame `frame` (absolute index) has arrived."""
        while self.received <= frame:
            try:
                camera = next(self._cameras)
            except StopIteration:
                raise CamrenderError(f"the camera stream ended after {self.received} frames; the render has "
                                     f"{self.num_frames}", frame=self.received, field="cameras") from None
            self._add(camera)

    def _add(self, camera: SegmentCamera) -> None:
        if not isinstance(camera, SegmentCamera):
            raise CamrenderError(f"the camera stream must yield SegmentCamera objects, got {type(camera).__name__}",
                                 frame=self.received, field="cameras")
        if self.received + camera.num_frames > self.num_frames:
            raise CamrenderError(f"the camera stream holds more than the render's {self.num_frames} frames",
                                 frame=self.num_frames, field="cameras")
        size = (camera.width, camera.height)
        if self._size is not None and size != self._size:
            raise CamrenderError(f"intrinsics are for {size[0]}x{size[1]} but earlier ones for "
                                 f"{self._size[0]}x{self._size[1]}", frame=self.received, field="width")
        for index in range(camera.num_frames):
            validate_pose(camera.c2w[index], frame=self.received + index)
            validate_intrinsics(camera.intrinsics[index], frame=self.received + index)
        self._size = size
        if self._first_inverse is None:
            self._first_inverse = invert_rigid(camera.c2w[0])
        poses = self._first_inverse @ camera.c2w  # as `relative_poses` over the whole path
        if self.received == 0:
            poses[0] = np.eye(4)
        intrinsics = crop_intrinsics(camera.intrinsics, size, (self.width, self.height))
        self._poses.append(poses)
        self._intrinsics.append(to_latent_grid(intrinsics, self.height, self.width, self.latent_h, self.latent_w))
        self.received += camera.num_frames
        self.pulls += 1
