"""Interrupted segment-mode renders: the partial folder, checkpoints, resume and stale files.

A segment-mode render of NAME.mp4 works in `.NAME.mp4.partial/` next to it:

    segment-00000.mp4 ...     the finished segments (`camrender.output.segment_video`)
    checkpoint.safetensors    the render state at a segment boundary (atomic; see `Checkpointer`)
    owner.json                pid and host of the render using the folder

A checkpoint holds every block cache (`SegmentCache`, saved generically), the streaming VAE
decoder's state, the sampler position (next segment, frames written), the torch RNG states and
the settings (`camrender.render.settings_file.checkpoint_settings`). `--resume` checks the settings
against the request (before the model loads), drops the segment files written after the
checkpoint and continues from it; the folder is removed when the render completes. A run
without `--resume` never deletes another run's files: it stops and prints the commands.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import time
from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError
from camrender.render.safetensors_header import read_header
from camrender.render.settings_file import checkpoint_settings, settings_differences

CHECKPOINT_NAME = "checkpoint.safetensors"
OWNER_NAME = "owner.json"
# Seconds between checkpoints. At the release shape (1280x704, 20 blocks) a checkpoint holds the
# block caches and the decoder's conv tails, 1.54 GiB, written in 2.5 s on an H200 machine
# (bench/bench_checkpoint.py): 1.4 % of the render time every 180 s (2.1 % every 120 s).
DEFAULT_CHECKPOINT_EVERY = 180.0


def partial_folder(out: Path) -> Path:
    """`.NAME.mp4.partial` beside `out`."""
    out = Path(out)
    return out.with_name(f".{out.name}.partial")


def leftover_part_files(out: Path) -> list:
    """`.*.part.mp4` files beside `out`: what `camrender.output.video.VideoWriter` leaves when its render is
    killed (or writes while it runs)."""
    out = Path(out)
    folder = out.parent if str(out.parent) else Path(".")
    return sorted(folder.glob(".*.part.mp4"))


def other_partial_folders(out: Path) -> list:
    """Partial folders of other videos beside `out` that no live render owns."""
    out = Path(out)
    folder = out.parent if str(out.parent) else Path(".")
    return sorted(p for p in folder.glob(".*.mp4.partial")
                  if p != partial_folder(out) and p.is_dir() and _owner_alive(p) is None)


def _owner_alive(folder: Path) -> Optional[int]:
    """The pid of another live process on this host that owns `folder`, else None."""
    try:
        owner = json.loads((folder / OWNER_NAME).read_text())
        pid, host = int(owner["pid"]), owner["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname() or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def read_checkpoint_info(path: Path) -> dict:
    """The checkpoint's JSON metadata (settings, position) from its header, without loading a tensor (the
    header is checked whole: `camrender.render.safetensors_header`)."""
    try:
        _, metadata = read_header(path)
        info = json.loads(metadata["camrender.checkpoint"])
        for key, kind in (("next_segment", int), ("segments", int), ("frames_written", int), ("settings", dict)):
            if isinstance(info[key], bool) or not isinstance(info[key], kind):
                raise TypeError(f"{key} is not {'an integer' if kind is int else 'an object'}")
        return info
    except Exception as error:  # a torn or foreign file: report it, never load it
        reason = " ".join(str(getattr(error, "detail", error)).split())[:120]
        raise CamrenderError(f"unreadable checkpoint ({type(error).__name__}: {reason})", path=path) from None


NO_CHECKPOINT = "no checkpoint: the render stopped before its first, nothing to resume"


def partial_state(folder: Path) -> tuple:
    """(the checkpoint's info or None, the words every message about `folder` uses for what it holds);
    CamrenderError for an unreadable checkpoint."""
    checkpoint = folder / CHECKPOINT_NAME
    if not checkpoint.exists():
        return None, NO_CHECKPOINT
    info = read_checkpoint_info(checkpoint)
    return info, f"checkpoint at segment {info['next_segment']} of {info['segments']}, {info['frames_written']} frames"


def partial_advice(info: Optional[dict], folder: Path, resume: str) -> str:
    """What to do with an interrupted render's `folder` (`resume`: how to run that render with --resume)."""
    remove = f"rm -r -- {shlex.quote(str(folder))}"
    if info is None:
        return f"remove it: {remove} (or {resume}, which starts over)"
    return f"{resume} to continue it, or remove it: {remove}"


def check_partials(request, resume: bool, log) -> Optional[dict]:
    """Before the model loads: report what earlier runs left for `request.out` and decide.

    Returns the checkpoint info to resume from (with `resume` and a checkpoint whose settings
    match), else None (start from the beginning). Raises CamrenderError (one line, with the
    commands to run) when a partial folder is in the way or does not match. The caller holds the output's
    claim (`camrender.output.targets.claim_output`): no other render writes the folder meanwhile.
    """
    out = Path(request.out)
    for leftover in leftover_part_files(out):
        log(f"warning: {leftover} is left over from a render that was killed (unless one is still running); "
            f"remove it: rm -- {shlex.quote(str(leftover))}")
    for other in other_partial_folders(out):
        video = other.with_name(other.name[1:-len(".partial")])
        try:
            info, where = partial_state(other)
        except CamrenderError:
            info, where = None, "an unreadable checkpoint"
        log(f"warning: {other} holds an interrupted segment-mode render of {video} ({where}): "
            f"{partial_advice(info, other, 're-run that render with --resume')}")
    folder = partial_folder(out)
    if resume and request.mode != "segments":
        raise CamrenderError("--resume continues segment-mode renders (--mode segments)", field="resume")
    if not os.path.lexists(folder):
        if resume:
            log(f"nothing to resume for {out}: rendering from the start")
        return None
    if folder.is_symlink() or not folder.is_dir():  # never ours: camrender makes it a plain folder
        kind = "a symbolic link" if folder.is_symlink() else "a file"
        raise CamrenderError(f"{folder} is {kind}, where this video's segment-mode work goes; remove it: "
                             f"rm -- {shlex.quote(str(folder))}", path=out)
    remove = f"rm -r -- {shlex.quote(str(folder))}"
    # (no other render writes it: the caller holds the output's claim, `camrender.output.targets`; the pid in
    # its owner.json may be a dead render's, reused since by another program)
    try:
        info, where = partial_state(folder)
    except CamrenderError as error:
        if not resume:
            raise CamrenderError(f"{error.detail}; --resume renders it again from the start, or remove it: {remove}",
                                 path=folder / CHECKPOINT_NAME) from None
        start_over(folder, error.detail, log)
        return None
    if not resume:
        raise CamrenderError(f"an interrupted render of this video left {folder} ({where}); "
                             f"{partial_advice(info, folder, 'add --resume')}", path=out)
    if info is None:  # killed before its first checkpoint: nothing would be lost by starting over
        shutil.rmtree(folder)
        log(f"--resume: {folder} ({where}): removed it, rendering from the start")
        return None
    current = checkpoint_settings(request)
    differ = settings_differences(info["settings"], current)
    if differ:
        shown = ", ".join(f"{key}: {info['settings'].get(key)!r} in the checkpoint, {current.get(key)!r} now"
                          for key in differ[:3])
        raise CamrenderError(f"the checkpoint was made with other settings ({shown}); resume with the original "
                             f"arguments, or remove it: {remove}", path=out, field="resume")
    return info


def start_over(folder: Path, reason: str, log) -> None:
    """--resume found an interrupted render in `folder` it cannot continue (`reason`): say so and remove it,
    so that the render starts from the beginning."""
    log(f"cannot resume from {folder} ({reason}): rendering from the start")
    shutil.rmtree(folder, ignore_errors=True)  # (what stays is replaced as the render writes it again)


class Checkpointer:
    """Writes the render state of segment mode to `folder/checkpoint.safetensors` at segment
    boundaries, at most every `every` seconds, and restores it.

    settings: `checkpoint_settings(request)`; resume_info: `check_partials`'s result or None.
    """

    def __init__(self, folder: Path, settings: dict, every: float = DEFAULT_CHECKPOINT_EVERY,
                 resume_info: Optional[dict] = None):
        self.folder = Path(folder)
        self.settings = settings
        self.every = float(every)
        self.resume_info = resume_info
        self.last_save = time.monotonic()
        self.saved = resume_info is not None  # whether the folder holds a checkpoint
        owner = {"pid": os.getpid(), "host": socket.gethostname()}
        try:
            self.folder.mkdir(exist_ok=True)
            (self.folder / OWNER_NAME).write_text(json.dumps(owner))
        except OSError as error:
            raise CamrenderError(f"cannot write: {error.strerror or error}", path=self.folder) from None

    @property
    def path(self) -> Path:
        return self.folder / CHECKPOINT_NAME

    @property
    def first_segment(self) -> int:
        return self.resume_info["next_segment"] if self.resume_info else 0

    @property
    def frames_before(self) -> int:
        return self.resume_info["frames_written"] if self.resume_info else 0

    def restore(self, cache, decoder, device, bounds=None):
        """(cache, next segment) to continue from: the saved ones on a resume, else (`cache`, 0).
        Loads the block caches and decoder state onto `device` and restores the RNG states.
        bounds: this render's segment (start, stop) list, checked against the checkpoint's."""
        # lazy: keeps `camrender --help` free of torch (state_io imports it too)
        import torch

        from camrender.render.state_io import load_tree

        if self.resume_info is None:
            return cache, 0
        remove = f"remove it: rm -r -- {shlex.quote(str(self.folder))}"
        try:  # verified before the model loaded (`camrender.output.resume_check`); this is the last guard
            tree, _ = load_tree(self.path, device=device)
            if bounds is not None and [list(b) for b in tree["bounds"]] != [list(b) for b in bounds]:
                raise ValueError("another segment layout")
            if len(tree["cache"].blocks) != len(cache.blocks):
                raise ValueError(f"{len(tree['cache'].blocks)} block caches, the model has {len(cache.blocks)}")
            decoder.load_state(tree["decoder"])
            torch.set_rng_state(tree["rng"]["cpu"].cpu())  # load_tree moved every tensor to `device`
            if tree["rng"]["cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all([state.cpu() for state in tree["rng"]["cuda"]])
        except Exception as error:  # noqa: BLE001 - whatever does not fit, one line (and the folder named)
            reason = " ".join(f"{type(error).__name__}: {error}".split())[:160]
            raise CamrenderError(f"the checkpoint does not fit this render ({reason}; another camrender "
                                 f"version?); {remove}", path=self.path) from None
        return tree["cache"], tree["next_segment"]

    def due(self) -> bool:
        return time.monotonic() - self.last_save >= self.every

    def save(self, next_segment: int, bounds: list, frames_written: int, cache, decoder) -> int:
        """Write the state after `next_segment` segments (all their files already on disk); bytes."""
        # lazy: keeps `camrender --help` free of torch (state_io imports it too)
        import torch

        from camrender.render.state_io import save_tree

        rng = {"cpu": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None}
        info = {"next_segment": next_segment, "segments": len(bounds), "frames_written": frames_written,
                "settings": self.settings, "written_at": time.time()}
        tree = {"next_segment": next_segment, "bounds": [list(b) for b in bounds], "cache": cache,
                "decoder": decoder.state(), "rng": rng}
        size = save_tree(self.path, tree, metadata={"camrender.checkpoint": json.dumps(info)})
        self.last_save = time.monotonic()
        self.saved = True
        return size

    def maybe_save(self, next_segment: int, bounds: list, frames_written: int, cache, decoder, *,
                   force: bool = False) -> None:
        """`save` when `every` seconds have passed since the last one, or when `force` (the render loop
        asked `due` already); never after the last segment."""
        if next_segment < len(bounds) and (force or self.due()):
            self.save(next_segment, bounds, frames_written, cache, decoder)

    def finish(self, completed: bool) -> None:
        """Remove the folder when the render completed, or when it stopped with nothing to resume
        from; otherwise keep it (the checkpoint and the segments before it) for --resume."""
        if completed or not self.saved:
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            (self.folder / OWNER_NAME).unlink(missing_ok=True)
