"""Trajectory file formats: a registry of importer/exporter modules.

A format is one module with:
    NAME         short name used by ``--from`` / ``--to`` (e.g. "nerfstudio")
    SUFFIXES     file suffixes it claims, lower case (e.g. (".json",))
    DESCRIPTION  one line for help texts
    read(path) -> Trajectory
    write(traj, path)            only if the format can be exported (write atomically); may return
                                 the list of files written when there are several
    sniff(doc_or_text) -> bool   optional: when several formats share a suffix, the
                                 first module whose sniff accepts the content wins
    FILENAMES    optional: conventional file names (e.g. ("images.txt",)); when no sniff
                 accepts the content, a module claiming the file's name reads it
                                 (JSON suffixes get the parsed document, others the text)
To add a format, write the module and append it to FORMAT_MODULES.
"""
from __future__ import annotations

import os

from camrender.errors import CamrenderError
from camrender.trajectory import controls
from camrender.trajectory.formats import (actions, bench_npz, colmap, nerfstudio, npy, realestate10k, transforms_json,
                                          v1)
from camrender.trajectory.formats.fileio import MAX_COLMAP_BYTES, MAX_FILE_BYTES, read_json, read_text

FORMAT_MODULES = [v1, realestate10k, nerfstudio, actions, colmap, transforms_json, npy, bench_npz]


def names(exportable: bool = False) -> list[str]:
    return [m.NAME for m in FORMAT_MODULES if not exportable or hasattr(m, "write")]


ALIASES = {"re10k": "realestate10k", "json": "v1", "transforms": "transforms_json"}


def help_text(exportable: bool = False) -> str:
    """The format names for an option's help, e.g. "v1, realestate10k (or re10k), ..."."""
    aliases = {name: alias for alias, name in ALIASES.items()}
    return ", ".join(f"{n} (or {aliases[n]})" if n in aliases else n for n in names(exportable))


def get(name: str):
    """The format module called ``name`` (or one of its `ALIASES`)."""
    name = ALIASES.get(name, name)
    for module in FORMAT_MODULES:
        if module.NAME == name:
            return module
    raise CamrenderError(f"unknown format {name!r} (known: {', '.join(names())})", field="format")


def _read_only(module, path) -> CamrenderError:
    return CamrenderError(
        f"format {module.NAME} can be read but not written (writable: {', '.join(names(exportable=True))})",
        path=os.fspath(path),
    )


def _suffix(path) -> str:
    return os.path.splitext(os.fspath(path))[1].lower()


def detect(path, *, for_writing: bool = False):
    """Pick the format module for ``path``: by suffix, then by content when a suffix is shared.

    For writing, only the suffix counts and the first exportable module claiming it wins.
    """
    suffix = _suffix(path)
    candidates = [m for m in FORMAT_MODULES if suffix in m.SUFFIXES]
    if for_writing and candidates and not any(hasattr(m, "write") for m in candidates):
        raise _read_only(candidates[0], path)
    if for_writing:
        candidates = [m for m in candidates if hasattr(m, "write")]
    if not candidates:
        usable = names(exportable=for_writing)
        raise CamrenderError(
            f"cannot tell the format from the suffix {suffix or '(none)'!r}; pass one of: {', '.join(usable)}",
            path=os.fspath(path),
        )
    if for_writing or len(candidates) == 1:
        return candidates[0]
    if suffix == ".json":
        content = read_json(path, keep=True)  # the reader picked below takes this document (parsed once)
    else:
        big = os.path.basename(os.fspath(path)).lower() in colmap.FILENAMES  # an images.txt with its 2D points
        content = read_text(path, MAX_COLMAP_BYTES if big else MAX_FILE_BYTES)
    for module in candidates:
        sniff = getattr(module, "sniff", None)
        if sniff is not None and sniff(content):
            return module
    named = [m for m in candidates if os.path.basename(os.fspath(path)).lower() in getattr(m, "FILENAMES", ())]
    if named:  # a broken images.txt / transforms.json: its own reader says what is wrong with it
        return named[0]
    return candidates[0]


def looks_like_actions(text) -> bool:
    """Whether a --traj / SOURCE argument that names no file reads as an action string ("w-80,aw-40")."""
    text = os.fspath(text)
    return "-" in text and "/" not in text and os.sep not in text and "." not in text


def import_file(path, fmt: str | None = None, *, scheme=None, intrinsics=None, image_size=None, notes=None):
    """Read ``path`` as format ``fmt`` (or the detected one) into a validated Trajectory.

    A ``path`` that names no file but reads as an action string is parsed as one (``fmt`` None
    or "actions"); a missing file or a directory is reported as such before any format is guessed.
    scheme: the `camrender.trajectory.controls.ControlScheme` of action strings (default sana-wm).
    intrinsics: a .npy file of intrinsics (`npy.load_intrinsics`'s shapes) replacing the path's, in
    pixels of ``image_size`` (width, height) of the first-frame image when given. notes: a list
    that gets one-line notes (a pose .npy without intrinsics).
    """
    module = get(fmt) if fmt else None
    if not os.fspath(path):
        raise CamrenderError("no file given (the path is an empty string)")
    if intrinsics is not None and not os.fspath(intrinsics).lower().endswith(".npy"):
        raise CamrenderError("must be a .npy file ((3, 3), (F, 3, 3), (4,) or (F, 4))", path=os.fspath(intrinsics),
                             field="intrinsics")
    if not os.path.exists(path):
        if module in (None, actions) and looks_like_actions(path):
            return _replace_intrinsics(actions.from_string(os.fspath(path), scheme=scheme), intrinsics, image_size)
        raise CamrenderError("file not found", path=os.fspath(path))
    if module is None and os.path.isdir(path):  # (--from colmap reads a model folder)
        raise CamrenderError("is a directory, not a trajectory file", path=os.fspath(path))
    module = module or detect(path)
    if module is npy:
        return npy.read(path, intrinsics=intrinsics, image_size=image_size, notes=notes)
    if module is bench_npz and intrinsics is None:  # its intrinsics are in pixels of the first-frame image
        return bench_npz.read(path, image_size=image_size, notes=notes)
    traj = module.read(path, scheme=scheme) if module is actions else module.read(path)
    return _replace_intrinsics(traj, intrinsics, image_size)


def read_path(source, fmt: str | None = None, *, action_scheme=None, translation_speed=None, rotation_speed=None,
              pitch_limit=None, smooth=None, intrinsics=None, image_size=None, notes=None):
    """(Trajectory, ControlScheme or None): `source` (a file, or an action string) read as a render reads it,
    with the action scheme of those options (`camrender.trajectory.controls.make_scheme`) and `intrinsics`
    (a .npy replacing the path's, in pixels of `image_size` (width, height) when given). The scheme is None
    unless `source` is an action string. notes: a list that gets one-line notes."""
    scheme = controls.make_scheme(action_scheme, translation_speed=translation_speed, rotation_speed=rotation_speed,
                                  pitch_limit=pitch_limit, smooth=smooth)
    traj = import_file(source, fmt, scheme=scheme, intrinsics=intrinsics, image_size=image_size, notes=notes)
    return traj, (scheme if reads_actions(source, fmt) else None)


def reads_actions(source, fmt: str | None = None) -> bool:
    """Whether `source` (with `--from fmt`) is read as an action string."""
    if fmt:
        return get(fmt) is actions
    if not os.path.exists(source):
        return looks_like_actions(source)
    return os.path.isfile(source) and detect(source) is actions


def _replace_intrinsics(traj, intrinsics, image_size):
    return traj if intrinsics is None else npy.with_intrinsics(traj, intrinsics, image_size).validate()


def export_file(traj, path, fmt: str | None = None) -> list:
    """Write ``traj`` to ``path`` in format ``fmt`` (or the one its suffix names); returns the files
    written (a format may write more than one: COLMAP's cameras.txt beside images.txt)."""
    module = get(fmt) if fmt else detect(path, for_writing=True)
    if not hasattr(module, "write"):
        raise _read_only(module, path)
    written = module.write(traj, path)
    return [os.fspath(p) for p in written] if written else [os.fspath(path)]
