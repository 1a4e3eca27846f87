"""The jobs of a batch (`read_jobs`): a JSON-lines file, one render per line, or a folder of trajectory files.

- a JSON-lines file: {"trajectory": "a.json", "output": "a.mp4", "image": ..., "prompt": ...,
  "options": {"steps": 30, ...}}; any `camrender render` option may stand at the top level or under "options"
  (dashes or underscores), relative paths are relative to the file's folder;
- a folder of trajectory files: each one renders to OUT_DIR/<name>.mp4 (OUT_DIR defaults to the folder; the
  `*.traj.json` side files of earlier renders and the `*_intrinsics.npy` beside pose files are not jobs);
- a SANA-WM-Bench split folder (or its `run_manifest.jsonl`): each scene renders its camera `.npz` from its image
  and prompt to OUT_DIR/<scene_id>_generated.mp4 (`camrender.trajectory.formats.sana_wm_bench`).

A job's values are checked when it is planned (`camrender.batch.plan`).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError
from camrender.trajectory.formats import FORMAT_MODULES, looks_like_actions
from camrender.trajectory.formats import sana_wm_bench as bench
from camrender.trajectory.formats.fileio import json_lines, read_text

ALIASES = {"trajectory": "traj", "output": "out"}


@dataclasses.dataclass
class Job:
    """One render of a batch: `where` names it in messages ("jobs.jsonl line 3", a trajectory file);
    `values` maps `camrender render` parameter names to the job's values (paths resolved); `error`: why
    the line is not a job at all (not JSON, an unknown key), reported when the batch is planned."""

    where: str
    values: dict
    error: str = ""


# ----------------------------------------------------------------------------- reading JOBS
def read_jobs(source: Path, keys: dict, out_dir: Optional[Path] = None) -> list:
    """The jobs of a JSON-lines file, a folder of trajectory files or a SANA-WM-Bench split (see the module
    docstring). keys: {name:
    whether its value is a file path} of the keys a job may have (a render's options: `camrender render`'s).

    Raises CamrenderError when JOBS itself cannot be read (no such file, an empty folder). A line
    that is not a JSON object or has an unknown key becomes a Job with `error` set (naming the file
    and line), so that planning lists every bad line at once; a job's values are checked when it
    is planned.
    """
    source = Path(source)
    if is_bench_source(source):
        return _bench_jobs(source, out_dir)
    if source.is_dir():
        return _folder_jobs(source, out_dir or source)
    if out_dir is not None:
        raise CamrenderError("--out-dir is for a folder of trajectories; a jobs file names each output",
                             path=source, field="out-dir")
    jobs = []
    text = read_text(source, what="a jobs file")
    _refuse_one_document(text, source)
    for number, line in enumerate(json_lines(text), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            jobs.append(Job(where, _line_values(line, where, keys, source.parent)))
        except CamrenderError as error:
            jobs.append(Job(where, {}, error=str(error)))
    return jobs


def _refuse_one_document(text: str, source: Path) -> None:
    """A JSON document over several lines (a trajectory given as JOBS) is one error, not one per line."""
    if text.count("\n") < 2 or text.lstrip()[:1] not in "{[":
        return
    try:
        json.loads(json_lines(text)[0])
    except ValueError:
        try:
            json.loads(text)
        except ValueError:
            return
        raise CamrenderError("is one JSON document over several lines, not a jobs file (JSON lines: one job object "
                             "per line); to render trajectory files, pass their folder", path=source) from None


def _line_values(line: str, where: str, keys: dict, folder: Path) -> dict:
    """The render parameters of one JSON line (paths relative to `folder`); CamrenderError naming `where`."""
    try:
        entry = json.loads(line)
    except (json.JSONDecodeError, RecursionError, ValueError) as error:
        column = f" at column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
        message = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply or too long a number"
        raise CamrenderError(f"invalid JSON{column}: {message}", path=where) from None
    if not isinstance(entry, dict):
        raise CamrenderError("a job is a JSON object", path=where)
    options = entry.pop("options", {})
    if not isinstance(options, dict):
        raise CamrenderError("must be a JSON object", path=where, field="options")
    values = {}
    for key, value in {**entry, **options}.items():
        name = ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
        if name not in keys:
            raise CamrenderError("unknown key (keys are trajectory, output and camrender render's options)",
                                 path=where, field=key)
        if keys[name] and isinstance(value, str) and not _action_string(name, value, folder):
            value = str(folder / Path(value).expanduser())  # absolute paths stay as they are
        values[name] = value
    return values


def _action_string(name: str, value: str, folder: Path) -> bool:
    """Whether a job's "trajectory" is an action string ("w-100,dw-60"), not a file in the jobs file's folder."""
    return name == "traj" and looks_like_actions(value) and not (folder / value).exists()


def _folder_jobs(folder: Path, out_dir: Path) -> list:
    suffixes = {suffix for module in FORMAT_MODULES for suffix in module.SUFFIXES}
    files = sorted(path for path in folder.iterdir()
                   if path.is_file() and path.suffix.lower() in suffixes and not path.name.endswith(".traj.json")
                   and not path.name.endswith("_intrinsics.npy"))  # the intrinsics beside NAME_pose.npy
    if not files:
        raise CamrenderError(f"no trajectory files ({', '.join(sorted(suffixes))}) in this folder", path=folder)
    return [Job(str(path), {"traj": str(path), "out": str(out_dir / (path.stem + ".mp4"))}) for path in files]


def is_bench_source(source: Path) -> bool:
    """Whether `source` is a SANA-WM-Bench split folder, its export folder or its `run_manifest.jsonl`."""
    if source.is_dir():
        return (source / bench.EXPORT_DIR / bench.MANIFEST_NAME).is_file() or (source / bench.MANIFEST_NAME).is_file()
    return source.name == bench.MANIFEST_NAME


def _bench_jobs(source: Path, out_dir: Optional[Path]) -> list:
    """One job a scene: its camera `.npz`, image and prompt, rendered to OUT_DIR/<scene_id>_generated.mp4 (the
    benchmark's results layout, e.g. results/METHOD/SPLIT); a bad manifest is refused whole, naming its line."""
    if out_dir is None:
        raise CamrenderError("a SANA-WM-Bench split writes <scene_id>_generated.mp4 into a results folder: give "
                             "--out-dir (e.g. results/METHOD/SPLIT)", path=source, field="out-dir")
    return [Job(row.where, {"traj": row.camera, "image": row.image, "prompt": row.prompt,
                            "out": str(Path(out_dir) / row.output_name)}) for row in bench.read_manifest(source)]
