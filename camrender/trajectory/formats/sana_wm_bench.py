"""NVlabs' SANA-WM-Bench scenes: a split folder or its `run_manifest.jsonl` -> per scene the first-frame image,
the prompt and the camera path (a `Trajectory`), the scene id and the benchmark's output name.

The benchmark's layout (its `docs/sana-wm-bench.md`):

    SANA-WM-Bench/images/<scene_id>.png
    SANA-WM-Bench/<split_dir>/sanawm_export_v2/run_manifest.jsonl   one JSON object a line: "id", "prompt",
        "image_path", "camera_path" (and "scene_type")
    SANA-WM-Bench/<split_dir>/sanawm_export_v2/<scene_id>.npz       "c2w" (961, 4, 4) OpenCV camera-to-world,
        "intrinsics" (961, 3, 3) in pixels of the scene's image as given, "fps" (16), "num_frames" (961)

A row's relative paths are relative to the dataset root (the folder above the split folder), as NVlabs'
evaluator resolves them; one not found there is looked for beside the manifest (hand-made manifests). A
generated video is `<scene_id>_generated.mp4` in a results folder. Not a registered trajectory format: a
scene needs its image's size for its intrinsics. Every problem is one CamrenderError naming the file (the
manifest's line) and the field.
"""
from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass

import numpy as np

from camrender.errors import CamrenderError
from camrender.trajectory.formats.fileio import read_text
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, Trajectory

MANIFEST_NAME = "run_manifest.jsonl"
EXPORT_DIR = "sanawm_export_v2"
OUTPUT_SUFFIX = "_generated.mp4"
REQUIRED_FIELDS = ("id", "prompt", "image_path", "camera_path")
_MAX_ARRAY_BYTES = MAX_FRAMES * 16 * 8  # the largest (F, 4, 4) float64 array of a path camrender accepts
_SCENE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # ids name output files: no folders, no hidden files


@dataclass(frozen=True)
class BenchRow:
    """One manifest line, its paths resolved (absolute); nothing read but the manifest."""

    scene_id: str
    prompt: str
    image: str
    camera: str
    scene_type: str | None
    manifest: str
    line: int

    @property
    def where(self) -> str:
        """The manifest line, as errors name it: "run_manifest.jsonl: line 3"."""
        return f"{self.manifest}: line {self.line}"

    @property
    def output_name(self) -> str:
        """The benchmark's name of the scene's video: `<scene_id>_generated.mp4`."""
        return self.scene_id + OUTPUT_SUFFIX


@dataclass(frozen=True)
class BenchScene:
    """A scene ready to render or score: `traj` holds c2w (F, 4, 4), intrinsics (F, 4) [fx, fy, cx, cy] in pixels
    of the image (its `width` x `height`), the fps, the prompt and the image path."""

    row: BenchRow
    traj: Trajectory

    @property
    def scene_id(self) -> str:
        return self.row.scene_id

    @property
    def output_name(self) -> str:
        return self.row.output_name


def manifest_path(source) -> str:
    """The manifest of `source`: a `.jsonl` file, a split folder (`sanawm_export_v2/run_manifest.jsonl` in it)
    or the export folder itself."""
    source = os.fspath(source)
    if os.path.isdir(source):
        for candidate in (os.path.join(source, EXPORT_DIR, MANIFEST_NAME), os.path.join(source, MANIFEST_NAME)):
            if os.path.isfile(candidate):
                return candidate
        raise CamrenderError(f"no {EXPORT_DIR}/{MANIFEST_NAME} or {MANIFEST_NAME} in this folder (a SANA-WM-Bench "
                             f"split folder holds {EXPORT_DIR}/{MANIFEST_NAME})", path=source)
    if not os.path.exists(source):
        raise CamrenderError("file not found", path=source)
    return source


def read_manifest(source) -> list[BenchRow]:
    """The rows of the manifest of `source` (see `manifest_path`), in file order; blank lines are skipped.
    CamrenderError naming the line and field for malformed JSON, a missing or empty field, a scene id that
    cannot name a file, or an id given twice. Files are not opened (`load_scene` reads them)."""
    manifest = os.path.abspath(manifest_path(source))
    dataset_root = os.path.dirname(os.path.dirname(os.path.dirname(manifest)))
    rows, seen = [], {}
    for number, text in enumerate(read_text(manifest, what="a manifest").splitlines(), start=1):
        if not text.strip():
            continue
        where = f"{manifest}: line {number}"
        try:
            entry = json.loads(text)
        except (json.JSONDecodeError, RecursionError, ValueError) as error:
            raise CamrenderError(f"not a JSON object: {str(error)[:120]}", path=where) from None
        if not isinstance(entry, dict):
            raise CamrenderError(f"must be a JSON object, got {type(entry).__name__}", path=where)
        for name in REQUIRED_FIELDS:
            value = entry.get(name)
            if not isinstance(value, str) or not value.strip():
                raise CamrenderError("missing" if value is None else "must be a non-empty string", path=where,
                                     field=name)
        scene_id = entry["id"]
        if not _SCENE_ID.fullmatch(scene_id):
            raise CamrenderError(f"{scene_id!r} cannot name a file (letters, digits, '_', '.', '-')", path=where,
                                 field="id")
        if scene_id in seen:
            raise CamrenderError(f"{scene_id!r} is also on line {seen[scene_id]}", path=where, field="id")
        seen[scene_id] = number
        scene_type = entry.get("scene_type")
        rows.append(BenchRow(scene_id, entry["prompt"], _resolve(entry["image_path"], dataset_root, manifest),
                             _resolve(entry["camera_path"], dataset_root, manifest),
                             scene_type if isinstance(scene_type, str) else None, manifest, number))
    if not rows:
        raise CamrenderError("holds no scenes", path=manifest)
    return rows


def _resolve(path: str, dataset_root: str, manifest: str) -> str:
    if os.path.isabs(path):
        return path
    in_root = os.path.join(dataset_root, path)
    beside = os.path.join(os.path.dirname(manifest), path)
    return beside if not os.path.exists(in_root) and os.path.exists(beside) else in_root


def image_size(path: str, where: str, field: str = "image_path") -> tuple[int, int]:
    """(width, height) of the image file `path` (its header only); CamrenderError naming `where` and `field`."""
    from PIL import Image, UnidentifiedImageError  # lazy: the trajectory commands need no PIL

    if not os.path.isfile(path):
        raise CamrenderError(f"file not found: {path}", path=where, field=field)
    try:
        with Image.open(path) as image:
            return image.size
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise CamrenderError(f"cannot read the image {path}: {str(error)[:120]}", path=where, field=field) from None


def load_scene(row: BenchRow) -> BenchScene:
    """Read a row's image size and camera `.npz` into a validated `BenchScene` (errors name the file and field)."""
    width, height = image_size(row.image, row.where)
    if not os.path.isfile(row.camera):
        raise CamrenderError(f"file not found: {row.camera}", path=row.where, field="camera_path")
    c2w, intrinsics, fps = read_camera(row.camera)
    traj = Trajectory(c2w, intrinsics, width, height, fps, prompt=row.prompt, image=row.image, source=row.camera)
    return BenchScene(row, traj.validate())


def read_bench(source) -> list[BenchScene]:
    """Every scene of a split folder or manifest, each read and checked (`read_manifest`, `load_scene`)."""
    return [load_scene(row) for row in read_manifest(source)]


def read_camera(path: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(c2w (F, 4, 4), intrinsics (F, 4) [fx, fy, cx, cy], fps) of a benchmark camera `.npz`; no pickles, no
    array larger than a `MAX_FRAMES` path, shapes and counts checked (the frames are checked by the caller)."""
    try:
        with zipfile.ZipFile(path) as archive:
            sizes = {info.filename: info.file_size for info in archive.infolist()}
        arrays = {}
        with np.load(path, allow_pickle=False) as npz:
            for name in ("c2w", "intrinsics", "fps", "num_frames"):
                if f"{name}.npy" not in sizes:
                    if name in ("c2w", "intrinsics"):
                        raise CamrenderError("missing from the file", path=path, field=name)
                    continue
                if sizes[f"{name}.npy"] > 2 * _MAX_ARRAY_BYTES:
                    raise CamrenderError(f"holds {sizes[name + '.npy']} bytes, more than a {MAX_FRAMES}-frame path",
                                         path=path, field=name)
                arrays[name] = npz[name]
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CamrenderError(f"not a .npz archive: {str(error)[:120]}", path=path) from None
    except ValueError as error:  # an object array (a pickle) or a damaged member
        raise CamrenderError(f"cannot read: {str(error)[:120]}", path=path) from None
    for name, array in arrays.items():
        if array.dtype.kind not in "fiu":
            raise CamrenderError(f"must hold numbers, got {array.dtype}", path=path, field=name)
    c2w = arrays["c2w"].astype(np.float64)
    if c2w.ndim != 3 or c2w.shape[1:] != (4, 4) or len(c2w) == 0:
        raise CamrenderError(f"must have shape (F, 4, 4), got {c2w.shape}", path=path, field="c2w")
    k = arrays["intrinsics"].astype(np.float64)
    k = k[None] if k.shape == (3, 3) else k
    if k.ndim != 3 or k.shape[1:] != (3, 3) or len(k) not in (1, len(c2w)):
        raise CamrenderError(f"must have shape ({len(c2w)}, 3, 3) or (3, 3), got {arrays['intrinsics'].shape}",
                             path=path, field="intrinsics")
    intrinsics = np.broadcast_to(np.stack([k[:, 0, 0], k[:, 1, 1], k[:, 0, 2], k[:, 1, 2]], axis=1), (len(c2w), 4))
    if "num_frames" in arrays and (arrays["num_frames"].size != 1 or int(arrays["num_frames"]) != len(c2w)):
        raise CamrenderError(f"says {arrays['num_frames'].tolist()} frames, c2w holds {len(c2w)}", path=path,
                             field="num_frames")
    if "fps" in arrays and arrays["fps"].size != 1:
        raise CamrenderError(f"must be one number, got shape {arrays['fps'].shape}", path=path, field="fps")
    fps = float(arrays["fps"].reshape(-1)[0]) if "fps" in arrays else DEFAULT_FPS
    return c2w, intrinsics.copy(), fps
