"""The settings of a render as a JSON record: `NAME.render.json` beside the video, and the part
of a segment-mode checkpoint a resume is checked against.

The record is built from the fields of the request (`camrender.render.request.RenderRequest`), whatever
they are: a field added to the request is recorded with no change here. The trajectory is
stored as a per-frame v1 document (in `NAME.render.json`) or as a digest (in checkpoints).

    camrender render --from-render NAME.render.json --out again.mp4   # the same video
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError
from camrender.files import atomic_write_text
from camrender.trajectory import v1
from camrender.trajectory.model import trajectory_digest
from camrender.trajectory.formats.fileio import read_json

RENDER_JSON_VERSION = 1
NOT_SETTINGS = ("traj", "out", "prompt_cache", "cameras", "settings")  # the path (stored apart), the target (given
# on each command line), where this machine keeps encoded prompts (not part of the video), a camera stream (no
# whole path) and the load settings (recorded field by field beside the request's)


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)  # e.g. a PIL image given in code: recorded, not reproducible


def settings_record(request) -> dict:
    """{name: JSON value} of what `request` asked for, one flat record: its own fields but the trajectory and the
    output path, its recipe by name (and the flow shift it samples with), and its pipeline's `LoadSettings`."""
    record = {f.name: _jsonable(getattr(request, f.name)) for f in dataclasses.fields(request)
              if f.name not in NOT_SETTINGS}
    record["recipe"] = request.recipe.name
    record["flow_shift"] = request.recipe.flow_shift
    return {**record, **_jsonable(request.settings.record())}


def file_identity(path) -> str:
    """"SIZE bytes, modified NS" of a weights file or folder's config (a changed file under the same
    name is caught without reading gigabytes); "" when there is no such file."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        stat = path.stat()
    except OSError:
        return ""
    return f"{stat.st_size} bytes, modified {stat.st_mtime_ns}"


def checkpoint_settings(request) -> dict:
    """What a resume must match: the settings, the trajectory digest and the identity of the weight
    files named by path (--transformer-weights, --vae)."""
    files = {f"{name}_file": file_identity(getattr(request.settings, name)) for name in ("transformer_weights", "vae")
             if getattr(request.settings, name) is not None}
    return {**settings_record(request), "trajectory_sha256": trajectory_digest(request.traj), **files}


def settings_differences(saved: dict, current: dict) -> list:
    """Names of the settings whose values differ (missing on one side counts), sorted."""
    return sorted(key for key in set(saved) | set(current) if saved.get(key, "<unset>") != current.get(key, "<unset>"))


def write_render_json(request, path, ran: Optional[dict] = None) -> None:
    """`NAME.render.json`: the settings as asked, what ran (`ran`: the resolved dtype, device, CUDA graphs, ...,
    `camrender.model.settings.RenderSettings.record()`) and the rendered path (per-frame v1 document)."""
    doc = {"camrender_render": RENDER_JSON_VERSION, "settings": settings_record(request),
           **({} if ran is None else {"ran": _jsonable(ran)}), "trajectory": v1.to_document(request.traj, path)}
    atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")


def read_render_json(path) -> tuple:
    """(settings dict, Trajectory) of a `NAME.render.json`; CamrenderError naming the file otherwise."""
    doc = read_json(path, what="a render file")
    if not isinstance(doc, dict) or doc.get("camrender_render") != RENDER_JSON_VERSION:
        raise CamrenderError(f"not a camrender render file (expected \"camrender_render\": {RENDER_JSON_VERSION})",
                             path=path)
    settings, trajectory = doc.get("settings"), doc.get("trajectory")
    if not isinstance(settings, dict):
        raise CamrenderError("must be an object", path=path, field="settings")
    if not isinstance(trajectory, dict):
        raise CamrenderError("must be a trajectory document", path=path, field="trajectory")
    return settings, v1.parse_document(trajectory, path=str(path))
