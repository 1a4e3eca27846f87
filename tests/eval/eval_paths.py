"""Shared by the eval tests: camera paths with known poses, videos of them through the proxy scene, and NVlabs'
released evaluator modules from the kit (importable as `eval_paths`: pytest puts this folder on sys.path)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from camrender.trajectory import Trajectory, save
from camrender.trajectory.rotations import look_at_rotation, rot_x, rot_y, rot_z
from camrender.views.preview import write_preview

ROOT = Path(__file__).resolve().parents[2]
KIT_CANDIDATES = (os.environ.get("SANA_WM_KIT"), ROOT / "shared" / "reference" / "nvlabs-sana-wm",
                  ROOT.parent / "shared" / "reference" / "nvlabs-sana-wm")
EVALUATORS = Path("src") / "tools" / "metrics" / "sana_wm"

WIDTH, HEIGHT, FRAMES, FPS = 384, 216, 81, 16.0  # 81 frames at interval 4: 21 scored
FOCAL = 0.5 * WIDTH / math.tan(math.radians(30))  # 60 degrees across


def kit_module(name: str):
    """A module of the kit's released evaluators (`pose_utils`, `eval_unified`), or a skip saying where it was
    looked for (the kit travels with the repository as shared/reference/nvlabs-sana-wm)."""
    for base in KIT_CANDIDATES:
        if base and (Path(base) / EVALUATORS / f"{name}.py").is_file():
            spec = importlib.util.spec_from_file_location(f"kit_{name}", Path(base) / EVALUATORS / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    pytest.skip(f"NVlabs' kit not found ({EVALUATORS}/{name}.py under $SANA_WM_KIT or shared/reference/nvlabs-sana-wm)")


def look_at(position, target) -> np.ndarray:
    c2w = np.eye(4)
    c2w[:3, :3] = look_at_rotation(np.asarray(position, float), np.asarray(target, float), [0.0, -1.0, 0.0])
    c2w[:3, 3] = position
    return c2w


def orbit(frames: int = FRAMES) -> np.ndarray:
    """90 degrees around a point on the ground 3 units ahead, 2.5 units out, 1.5 up (OpenCV: up is -y)."""
    angles = np.radians(np.linspace(0.0, 90.0, frames))
    target = np.array([0.0, 1.5, 3.0])
    return np.stack([look_at([-2.5 * math.sin(a), 0.0, 3.0 - 2.5 * math.cos(a)], target) for a in angles])


def dolly(frames: int = FRAMES) -> np.ndarray:
    """1.5 units straight ahead, level."""
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 2, 3] = np.linspace(0.0, 1.5, frames)
    return c2w


def handheld(frames: int = FRAMES) -> np.ndarray:
    """A walk forward and to the right, looking 15 degrees down, with sway, bob and a slow turn."""
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    for index, s in enumerate(np.linspace(0.0, 1.0, frames)):
        yaw, pitch, roll = np.radians([4 * math.sin(5 * s) + 10 * s, 15 + 2 * math.sin(7 * s), math.sin(11 * s)])
        c2w[index, :3, :3] = rot_y(yaw) @ rot_x(-pitch) @ rot_z(roll)
        c2w[index, :3, 3] = [0.4 * s + 0.02 * math.sin(9 * s), 0.03 * math.sin(13 * s), 1.2 * s]
    return c2w


PATHS = {"orbit": orbit, "dolly": dolly, "handheld": handheld}


def trajectory(c2w: np.ndarray, width: int = WIDTH, height: int = HEIGHT) -> Trajectory:
    """A path at WIDTH x HEIGHT scaled to width x height (same field of view), FPS."""
    scale = width / WIDTH
    intrinsics = np.tile([FOCAL * scale, FOCAL * scale, width / 2, height / 2], (len(c2w), 1))
    return Trajectory(c2w, intrinsics, width, height, FPS)


def write_case(folder: Path, name: str, c2w: np.ndarray) -> tuple[Path, Path]:
    """`name.mp4`, the proxy-scene preview of the path (WIDTH x HEIGHT) with its poses as given (`traj preview
    --absolute`: the paths look at the scene as drawn above), and `name.traj.json` beside it."""
    traj = trajectory(c2w)
    video, path = folder / f"{name}.mp4", folder / f"{name}.traj.json"
    save(traj, path)
    write_preview(traj, video, relative=False)
    return video, path


SPLIT_DIR = "benchmark_v2_smooth_60s"


def write_bench(root: Path, scenes: dict, image_size=(2 * WIDTH, 2 * HEIGHT)) -> Path:
    """A SANA-WM-Bench release in `root` with `scenes` {scene_id: c2w (F, 4, 4)}: images/<id>.png of `image_size`
    and <split>/sanawm_export_v2/<id>.npz (intrinsics (F, 3, 3) of FOCAL's field of view in the image's pixels)
    listed in run_manifest.jsonl with dataset-relative paths; returns the manifest."""
    from PIL import Image

    export = root / SPLIT_DIR / "sanawm_export_v2"
    export.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    lines = []
    for scene_id, c2w in scenes.items():
        Image.new("RGB", image_size, (90, 120, 150)).save(root / "images" / f"{scene_id}.png")
        k = trajectory(c2w, *image_size).intrinsics
        matrices = np.zeros((len(c2w), 3, 3))
        matrices[:, 0, 0], matrices[:, 1, 1], matrices[:, 0, 2], matrices[:, 1, 2] = k.T
        matrices[:, 2, 2] = 1.0
        np.savez(export / f"{scene_id}.npz", c2w=c2w.astype(np.float32), intrinsics=matrices.astype(np.float32),
                 fps=np.float32(FPS), num_frames=np.int64(len(c2w)))
        lines.append(json.dumps({"id": scene_id, "prompt": f"a walk through {scene_id}",
                                 "scene_type": scene_id.split("_")[0], "image_path": f"images/{scene_id}.png",
                                 "camera_path": f"{SPLIT_DIR}/sanawm_export_v2/{scene_id}.npz"}))
    manifest = export / "run_manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest
