"""The `colmap` backend: COLMAP's structure from motion through pycolmap, on the CPU, with no weights.

The frames are written as PNGs to a temporary folder; each gets a PINHOLE camera holding the requested
intrinsics (fixed: the render was asked for them, and a short clip cannot pin a focal length down); SIFT
features, sequential matching (each frame against the next `SEQUENTIAL_OVERLAP`; every pair verified with its
essential matrix, `MAX_H_INLIER_RATIO`) and COLMAP's global mapper (GLOMAP: rotation averaging, then global
positioning and bundle adjustment). On 11 proxy-scene paths of 21 frames (orbit, dolly, hand-held walks looking
5 to 15 degrees down) the global mapper placed every one within 0.2 degrees; the incremental mapper, with the
same matches, missed 7 by 1 to 10 degrees. The largest model wins; frames outside it are unregistered. A video
without parallax (a pure pan, a still camera) cannot be placed. Install: `pip install "camrender[eval]"`.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from camrender.errors import CamrenderError
from camrender.eval.estimate import Estimate

SEQUENTIAL_OVERLAP = 10  # frames each frame is matched with, forward in time
SIFT_PEAK_THRESHOLD = 0.003  # below COLMAP's 0.0067: generated and synthetic frames are smooth
SIFT_MAX_FEATURES = 4096
EXTRACT_CHUNK = 16  # frames a feature-extraction call takes (progress is reported per chunk)
# A pair of frames whose matches a homography explains (COLMAP's default: 80 % of the essential matrix's inliers)
# is taken as planar and its relative pose decomposed from the homography, which has two solutions; on videos
# that look at the ground (the proxy scene's, and many generated ones) that put whole paths 2-10 degrees off
# (8 of 13 hand-held paths), so every pair keeps its essential matrix (none of the 13).
MAX_H_INLIER_RATIO = 1.0
RANDOM_SEED = 0  # every random choice of the pipeline (RANSAC, rotation averaging, positioning): repeatable runs
INSTALL = 'the colmap backend needs pycolmap: pip install "camrender[eval]" (or pip install "pycolmap>=4.2")'


def _pycolmap():
    try:
        import pycolmap
    except ImportError:
        raise CamrenderError(INSTALL, field="backend") from None
    if not hasattr(pycolmap, "global_mapping"):  # the global mapper came with COLMAP 4
        raise CamrenderError(f"{INSTALL}; found pycolmap {getattr(pycolmap, '__version__', '?')}", field="backend")
    return pycolmap


class ColmapEstimator:
    """`estimate(frames, intrinsics, progress)` with pycolmap (module docstring)."""

    name = "colmap"

    def __init__(self):
        self.pycolmap = _pycolmap()

    def estimate(self, frames: np.ndarray, intrinsics: np.ndarray, progress=None) -> Estimate:
        """Poses of (N, H, W, 3) uint8 `frames` with (N, 4) [fx, fy, cx, cy] `intrinsics` in their pixels (OpenCV:
        pixel centres at integers). progress(done, total, info, stage=, unit=) hears of features, matching and
        mapping (the frames registered)."""
        pycolmap = self.pycolmap
        quiet_level, pycolmap.logging.minloglevel = pycolmap.logging.minloglevel, 3  # our own lines say it
        pycolmap.set_random_seed(RANDOM_SEED)
        try:
            with tempfile.TemporaryDirectory(prefix="camrender-eval-") as work:
                return self._run(work, frames, intrinsics, progress)
        finally:
            pycolmap.logging.minloglevel = quiet_level

    def _run(self, work: str, frames, intrinsics, progress) -> Estimate:
        from PIL import Image

        pycolmap = self.pycolmap
        images, database, models = (os.path.join(work, name) for name in ("images", "database.db", "models"))
        os.makedirs(images)
        os.makedirs(models)
        names = [f"{index:06d}.png" for index in range(len(frames))]
        for name, frame in zip(names, frames):
            Image.fromarray(frame).save(os.path.join(images, name), compress_level=1)
        extraction = pycolmap.FeatureExtractionOptions()
        extraction.sift.peak_threshold = SIFT_PEAK_THRESHOLD
        extraction.sift.max_num_features = SIFT_MAX_FEATURES
        if progress is not None:
            progress(0, len(names), stage="colmap features", unit="frame")
        for start, stop in _chunks(intrinsics):
            reader = pycolmap.ImageReaderOptions()
            reader.camera_model = "PINHOLE"
            fx, fy, cx, cy = (float(value) for value in intrinsics[start])
            # COLMAP puts pixel centres at +0.5
            reader.camera_params = ",".join(repr(value) for value in (fx, fy, cx + 0.5, cy + 0.5))
            pycolmap.extract_features(database, images, image_names=names[start:stop],
                                      camera_mode=pycolmap.CameraMode.PER_IMAGE, reader_options=reader,
                                      extraction_options=extraction, device=pycolmap.Device.cpu)
            if progress is not None:
                progress(stop, len(names), stage="colmap features", unit="frame")
        pairing = pycolmap.SequentialPairingOptions()
        pairing.overlap = min(SEQUENTIAL_OVERLAP, len(names) - 1)
        verification = pycolmap.TwoViewGeometryOptions()
        verification.max_H_inlier_ratio = MAX_H_INLIER_RATIO
        verification.ransac.random_seed = RANDOM_SEED
        pycolmap.match_sequential(database, pairing_options=pairing, verification_options=verification,
                                  device=pycolmap.Device.cpu)
        if progress is not None:
            progress(1, 1, stage="colmap matching", unit="step")
        options = pycolmap.GlobalPipelineOptions()
        mapper = options.mapper
        options.random_seed = mapper.random_seed = RANDOM_SEED
        mapper.rotation_averaging.random_seed = mapper.global_positioning.random_seed = RANDOM_SEED
        mapper.global_positioning.use_gpu = False
        adjustment = options.mapper.bundle_adjustment
        adjustment.refine_focal_length = adjustment.refine_principal_point = adjustment.refine_extra_params = False
        adjustment.ceres.use_gpu = False
        reconstructions = pycolmap.global_mapping(database, images, models, options=options)
        estimate = _poses(reconstructions.values(), names)
        if progress is not None:
            progress(1, 1, f"{int(estimate.registered.sum())}/{len(names)} frames registered", stage="colmap mapping",
                     unit="step")
        return estimate


def _chunks(intrinsics: np.ndarray):
    """[start, stop) runs of at most EXTRACT_CHUNK frames sharing their intrinsics (one reader setting a call)."""
    start = 0
    for index in range(1, len(intrinsics) + 1):
        if index == len(intrinsics) or index - start == EXTRACT_CHUNK or \
                not np.array_equal(intrinsics[index], intrinsics[start]):
            yield start, index
            start = index


def _poses(reconstructions, names) -> Estimate:
    """The largest reconstruction's camera-to-world poses by frame (the frames' PNG names hold their index)."""
    best = max(reconstructions, key=lambda model: model.num_reg_images(), default=None)
    if best is None or best.num_reg_images() == 0:
        return Estimate.failed(len(names), "COLMAP placed no frames (too little texture or parallax to match)")
    c2w = np.tile(np.eye(4), (len(names), 1, 1))
    registered = np.zeros(len(names), bool)
    for image in best.images.values():
        if image.has_pose:
            index = int(os.path.splitext(image.name)[0])
            w2c = np.eye(4)
            w2c[:3] = image.cam_from_world().matrix()
            c2w[index] = np.linalg.inv(w2c)
            registered[index] = True
    return Estimate(c2w, registered)
