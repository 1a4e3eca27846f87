"""A `POST /v1/videos` body -> a checked job: every field read as `camrender.serve.fields` says, the uploads written
into the job's folder, and the render planned through `camrender.api.requests.plan_request` on the server's
`LoadSettings`, so a job is checked as `camrender render` checks its options. A refusal is a `ServeError` naming
the request's field; nothing of a refused job is kept.

A job's `spec` (stored with it) holds plan_request's options, the job's input files relative to its folder and the
server's load settings: `plan_job` plans it again, identically, when the worker renders it (after a restart too;
a server started with other load settings fails the job rather than render it otherwise).
"""
from __future__ import annotations

import dataclasses
import json
import re
import secrets
from pathlib import Path
from typing import Optional

import numpy as np

from camrender.api.requests import plan_request
from camrender.errors import CamrenderError
from camrender.files import atomic_output, make_folders
from camrender.limits import max_frames
from camrender.render.load_settings import FIELDS as LOAD_FIELDS
from camrender.render.load_settings import LoadSettings, unknown_keyword
from camrender.serve import fields as table
from camrender.serve import values
from camrender.serve.errors import ServeError
from camrender.trajectory.formats import FORMAT_MODULES
from camrender.trajectory.resample import nearest_model_length

JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")
INPUT = "input"
VIDEO = "video.mp4"
SANA_WM = "extra_params.sana_wm"
PATH_SUFFIXES = sorted({suffix for module in FORMAT_MODULES for suffix in module.SUFFIXES})
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
IMAGE_FIELDS = ("image", "input_reference", "image_reference")
TOP = table.by_name(table.TOP)
SANA = table.by_name(table.SANA_WM)
READERS = {"text": values.text, "int": values.integer, "number": values.number, "bool": values.boolean}


def new_id() -> str:
    return f"video_{secrets.token_hex(16)}"


def check_id(value: str) -> str:
    """`value` if it is a job id (video_ + 32 hex digits), else a 400: a path (../) never reaches the store."""
    if not JOB_ID.match(value or ""):
        raise ServeError(400, "not a video id (video_ followed by 32 hex digits)", param="video_id")
    return value


@dataclasses.dataclass(frozen=True)
class JobRules:
    """What every job of a server renders with: its pipeline's `load` settings, the prompt cache folder (None:
    none) and the largest image a request may upload, in bytes."""

    load: LoadSettings
    prompt_cache: Optional[str]
    max_image_bytes: int


@dataclasses.dataclass(frozen=True)
class Accepted:
    """A checked job: `spec` (what `plan_job` plans again), `summary` (what its job object shows)."""

    spec: dict
    summary: dict


def plan_job(spec: dict, folder: Path, rules: JobRules, notes: Optional[list] = None):
    """The `RenderRequest` of a stored job whose files are in `folder` (CamrenderError as `plan_request`, and for
    a job accepted by a server that loaded other settings: it is not rendered with these behind its back)."""
    accepted = spec["load"]
    current = json.loads(json.dumps(rules.load.record()))
    for name in current:
        if accepted.get(name) != current[name]:
            raise CamrenderError(f"accepted for a pipeline of other settings ({name}: {accepted.get(name)!r} then, "
                                 f"{current[name]!r} now)", field=name)
    options = dict(spec["options"])
    if options.get("intrinsics") is not None:
        options["intrinsics"] = str(folder / options["intrinsics"])
    image = None if spec["image"] is None else str(folder / spec["image"])
    return plan_request(rules.load, str(folder / spec["trajectory"]), image=image, out=folder / VIDEO,
                        prompt_cache=rules.prompt_cache, notes=notes, **options)


def accept(body: dict, folder: Path, rules: JobRules) -> Accepted:
    """Check the request `body` ({field: value}; a multipart body's files as `values.Upload`), write its uploads
    under `folder`/input, on disk with the folders that hold them (the job survives a crash once it is stored),
    and plan its render. ServeError (4xx) naming the field for anything refused."""
    _check_names(body, rules.load)
    sana = _sana_wm(body)
    options = _options(body, sana)
    folder = Path(folder)
    inputs = folder / INPUT
    make_folders(inputs / "path", durable=True)
    given = {name for name in body} | {f"{SANA_WM}.{name}" for name in sana}
    spec = {"options": options, "image": _write_image(body, inputs, rules.max_image_bytes),
            "load": json.loads(json.dumps(rules.load.record()))}
    spec["trajectory"], path_field = _write_path(body, sana, inputs)
    if "intrinsics" in sana:
        options["intrinsics"] = _write_intrinsics(sana["intrinsics"], inputs)
    fields_of = _field_names(given, path_field, next((name for name in IMAGE_FIELDS if name in body), None))
    notes = []
    request = _planned(spec, folder, rules, fields_of, notes)
    if "seconds" in body:
        seconds = values.number(body["seconds"], "seconds")
        if seconds <= 0 or seconds * request.fps > max_frames(request.mode):
            raise ServeError(400, f"must be positive and at most {max_frames(request.mode)} frames at "
                                  f"{request.fps:g} fps, got {seconds:g}", param="seconds")
        options["frames"] = nearest_model_length(round(seconds * request.fps) + 1, request.recipe.frame_stride)
        notes = []
        request = _planned(spec, folder, rules, fields_of, notes)
    if spec["image"] is None and request.image is not None:
        raise ServeError(400, "names an image file on the server; send the image itself (input_reference)",
                         param=path_field)
    summary = {"size": f"{request.width}x{request.height}", "num_frames": request.num_frames, "fps": request.fps,
               "seconds": f"{(request.num_frames - 1) / request.fps:.3f}".rstrip("0").rstrip("."),
               "prompt": request.prompt, "seed": request.seed, "mode": request.mode,
               "notes": [_without_folder(note, folder) for note in notes],
               "user": values.text(body["user"], "user") if "user" in body else None}
    return Accepted(spec, summary)


def _check_names(body: dict, load: LoadSettings) -> None:
    for name in body:
        if name in TOP:
            continue
        if name in table.REFUSED:
            raise ServeError(400, f"not taken by camrender: {table.REFUSED[name]}", param=name, code="unsupported")
        if name in table.SERVER_OPTIONS:
            raise ServeError(400, f"set by the server: {table.SERVER_OPTIONS[name]}", param=name, code="unsupported")
        if name in table.CLI_NAMES:
            raise ServeError(400, f"camrender's --{name.replace('_', '-')} is {table.CLI_NAMES[name]!r} here",
                             param=name, code="unknown_field")
        if name in LOAD_FIELDS or name == "precision":
            raise ServeError(400, f"decided when the pipeline loads (camrender serve --{name.replace('_', '-')})",
                             param=name, code="unsupported")
        raise ServeError(400, unknown_keyword(name, TOP).detail.replace("setting", "field"), param=name,
                         code="unknown_field")
    if "model" in body and values.text(body["model"], "model") != load.model:
        raise ServeError(400, f"this server renders with {load.model!r}", param="model")
    if "n" in body and values.integer(body["n"], "n") != 1:
        raise ServeError(400, "one video per job (n = 1)", param="n")
    for group in (("seconds", "num_frames"), ("size", "width"), ("size", "height")):
        if all(name in body for name in group):
            raise ServeError(400, f"give {group[0]} or {group[1]}, not both", param=group[1])
    images = [name for name in IMAGE_FIELDS if name in body]
    if len(images) > 1:
        raise ServeError(400, f"give one first-frame image, not {' and '.join(images)}", param=images[1])


def _sana_wm(body: dict) -> dict:
    """`extra_params.sana_wm` ({} when absent), its names checked."""
    if "extra_params" not in body:
        return {}
    extra = values.json_object(body["extra_params"], "extra_params")
    for key in extra:
        if key != "sana_wm":
            raise ServeError(400, "not taken (camrender reads extra_params.sana_wm)", param=f"extra_params.{key}")
    sana = values.json_object(extra.get("sana_wm", {}), SANA_WM)
    for key in sana:
        if key not in SANA:
            hint = " (give it at the top level)" if key in TOP else ""
            raise ServeError(400, f"not taken{hint}", param=f"{SANA_WM}.{key}")
    return sana


def _options(body: dict, sana: dict) -> dict:
    """plan_request's keywords of the plain fields (typed), and of `size`."""
    options = {}
    for source, prefix in ((TOP, ""), (SANA, f"{SANA_WM}.")):
        given = body if not prefix else sana
        for name, field in source.items():
            if field.option is None or name not in given:
                continue
            if field.option in options:
                raise ServeError(400, f"given twice (also as {field.option})", param=prefix + name)
            options[field.option] = READERS[field.kind](given[name], prefix + name)
    if "size" in body:
        options["width"], options["height"] = values.size(body["size"], "size")
    return options


def _write_image(body: dict, inputs: Path, max_bytes: int) -> Optional[str]:
    """The first-frame image written to inputs/image.<format>; its path in the job's folder (None: none given)."""
    name = next((name for name in IMAGE_FIELDS if name in body), None)
    if name is None:
        return None
    value = body[name]
    if name == "image_reference" and not isinstance(value, dict):
        value = values.json_object(value, name)
    data = values.image_bytes(value, name, max_bytes)
    # lazy: the header only, to name the file by its format (the render reads the image whole, plan_request checks)
    import io

    import PIL.Image

    try:
        with PIL.Image.open(io.BytesIO(data)) as handle:
            kind = (handle.format or "image").lower()
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as error:
        raise ServeError(400, f"is not an image the server reads ({type(error).__name__})", param=name) from None
    return _write(inputs / f"image.{kind}", data).relative_to(inputs.parent).as_posix()


def _write_path(body: dict, sana: dict, inputs: Path) -> tuple:
    """(the camera path's file in the job's folder, the field that gave it): `trajectory`, or sana_wm's `action`
    or `camera` (exactly one)."""
    given = [name for name in ("trajectory", f"{SANA_WM}.action", f"{SANA_WM}.camera")
             if (name in body if name == "trajectory" else name.rsplit(".", 1)[1] in sana)]
    if not given:
        raise ServeError(400, f"give the camera path: trajectory, or {SANA_WM}.action or .camera", param="trajectory")
    if len(given) > 1:
        raise ServeError(400, f"give one camera path, not {' and '.join(given)}", param=given[1])
    folder = inputs / "path"
    if "trajectory" in body:
        path = _write_document(body["trajectory"], folder)
    elif "action" in sana:
        path = _write(folder / "path.actions", values.text(sana["action"], f"{SANA_WM}.action").encode())
    else:
        path = _write_poses(sana["camera"], folder)
    return path.relative_to(inputs.parent).as_posix(), given[0]


def _write_document(value, folder: Path) -> Path:
    """A `trajectory` field as a file the format readers tell apart: file parts keep their names (the suffix, and
    names such as images.txt, say the format; the parts after the first are files its reader takes from beside it:
    COLMAP's cameras.txt, a pose file's NAME_intrinsics.npy); a JSON object is a .json; a text is a .json when it
    parses as a JSON object, else a .txt (an action string, a RealEstate10K or COLMAP file's text)."""
    if isinstance(value, values.Upload):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(part, values.Upload) for part in value):
        written = [_write_part(part, folder) for part in value]
        if len({path.name for path in written}) < len(written):
            raise ServeError(400, "two files of the same name", param="trajectory")
        return written[0]
    if isinstance(value, dict):
        _refuse_image_path(value)
        return _write(folder / "trajectory.json", json.dumps(value).encode())
    content = values.text(value, "trajectory")
    try:
        parsed = json.loads(content)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        _refuse_image_path(parsed)
    name = "trajectory.json" if isinstance(parsed, dict) else "trajectory.txt"
    return _write(folder / name, content.encode())


def _write_part(part: values.Upload, folder: Path) -> Path:
    """One file part of `trajectory`, under its own name (or trajectory.SUFFIX when that is no plain file name)."""
    name = Path(part.filename or "").name
    suffix = Path(name).suffix.lower()
    if suffix not in PATH_SUFFIXES:
        raise ServeError(400, f"cannot tell the format from the file name {name!r} (suffixes: "
                              f"{', '.join(PATH_SUFFIXES)})", param="trajectory")
    if suffix == ".json":
        try:
            parsed = json.loads(part.data)
        except (ValueError, RecursionError):
            parsed = None  # its reader says what is wrong with it
        if isinstance(parsed, dict):
            _refuse_image_path(parsed)
    return _write(folder / (name if SAFE_NAME.match(name) else f"trajectory{suffix}"), part.data)


def _refuse_image_path(document: dict) -> None:
    """A path document's "image" (v1) names a file on the server: refused before anything looks for it."""
    if "image" in document:
        raise ServeError(400, "image: names a file on the server; send the image itself (input_reference)",
                         param="trajectory")


def _write_poses(camera, folder: Path) -> Path:
    """sana_wm's `camera` {"poses": (F, 4, 4) c2w} as a NAME_pose.npy (its reader checks each pose)."""
    name = f"{SANA_WM}.camera"
    camera = values.json_object(camera, name)
    for key, allowed in (("format", ("c2w_4x4",)), ("coordinate_system", ("official", "opencv"))):
        if key in camera and camera[key] not in allowed:
            raise ServeError(400, f"must be {' or '.join(allowed)}, got {str(camera[key])[:40]!r}",
                             param=f"{name}.{key}")
    unknown = sorted(set(camera) - {"poses", "format", "coordinate_system"})
    if unknown or "poses" not in camera:
        raise ServeError(400, "not taken" if unknown else "is missing", param=f"{name}.{unknown[0] if unknown else 'poses'}")
    try:
        poses = np.asarray(camera["poses"], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ServeError(400, "must be a list of 4x4 matrices of numbers", param=f"{name}.poses") from None
    return _write_array(folder / "path_pose.npy", poses)


def _write_intrinsics(value, inputs: Path) -> str:
    """sana_wm's `intrinsics` {fx, fy, cx, cy} as an intrinsics .npy; its path in the job's folder."""
    name = f"{SANA_WM}.intrinsics"
    value = values.json_object(value, name)
    keys = ("fx", "fy", "cx", "cy")
    for key in sorted(set(keys) ^ set(value)):
        raise ServeError(400, "not taken" if key in value else "is missing", param=f"{name}.{key}")
    numbers = np.array([values.number(value[key], f"{name}.{key}") for key in keys])
    return _write_array(inputs / "intrinsics.npy", numbers).relative_to(inputs.parent).as_posix()


def _write_array(path: Path, array: np.ndarray) -> Path:
    with atomic_output(path, "wb", durable=True) as out:
        np.save(out, array, allow_pickle=False)
    return path


def _write(path: Path, data: bytes) -> Path:
    """`data` into `path`, on disk (its data and its name) before the job is stored."""
    with atomic_output(path, "wb", durable=True) as out:
        out.write(data)
    return path


def _field_names(given: set, path_field: str, image_field: Optional[str]) -> dict:
    """{plan_request's name of a value (an option, or an error's field): the request field that gave it}; "_path",
    "_image", "_intrinsics": the fields that gave the job's files."""
    names = {}
    for source, prefix in ((table.TOP, ""), (table.SANA_WM, f"{SANA_WM}.")):
        names.update({field.option: prefix + field.name for field in source
                      if field.option and prefix + field.name in given})
    names.update({"frames": "seconds" if "seconds" in given else names.get("frames", path_field),
                  "image": image_field or "input_reference", "_path": path_field, "_image": image_field,
                  "_intrinsics": f"{SANA_WM}.intrinsics"})
    if "size" in given:
        names.update(width="size", height="size")
    return names


def _planned(spec: dict, folder: Path, rules: JobRules, fields_of: dict, notes: list):
    """plan_job, its CamrenderError a ServeError naming the request's field."""
    try:
        return plan_job(spec, folder, rules, notes)
    except CamrenderError as error:
        raise _refusal(error, folder, fields_of) from None


def _refusal(error: CamrenderError, folder: Path, fields_of: dict) -> ServeError:
    """`error` of planning a job as a 400 naming the request field: the error's own field when a request field
    gave it, else the field that gave the file it names; the message leaves out the server's paths."""
    where = (error.field or "").replace("-", "_")
    param = fields_of.get(where)
    if param is None and error.path is not None:
        inputs = (folder / INPUT).resolve()
        named = Path(error.path).resolve()
        if named.is_relative_to(inputs):
            kind = named.relative_to(inputs).parts[0]
            param = fields_of["_path" if kind == "path" else "_image" if kind.startswith("image") else "_intrinsics"]
    if param is None and where in TOP:
        param = where
    parts = [] if error.frame is None else [f"frame {error.frame}"]
    if error.field and where not in fields_of and where != param:  # a field inside a file: c2w, fx, ...
        parts.append(error.field)
    return ServeError(400, _without_folder(": ".join(parts + [error.detail]), folder), param=param)


def _without_folder(text: str, folder: Path) -> str:
    """`text` with the job folder's path left out: a refusal or a note names the job's files by their place in its
    folder. (The job's render file, `GET /v1/videos/{id}/render.json`, is served as written: it names the server's
    model, weights and store paths, for `camrender render --from-render` on the server; docs/serve.md.)"""
    return text.replace(f"{folder.resolve()}/", "").replace(f"{folder}/", "")
