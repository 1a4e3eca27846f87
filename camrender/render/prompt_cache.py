"""Encoded prompts on disk: a render whose prompts are cached never loads the text encoders.

One safetensors file per encoded prompt, named by the sha256 of its key, in the cache folder
(`resolve_cache_dir`: --prompt-cache, else $CAMRENDER_CACHE, else $XDG_CACHE_HOME/camrender, else
~/.cache/camrender). The key (JSON, also stored in the file's metadata and compared on every read)
holds what the embeddings depend on: which stage ("stage1": Gemma-2 + the chi prefix, negative prompt
under guidance; "refiner": Gemma-3 + LTX-2 connectors), the prompt(s), the encoder's identity
(`encoder_identity`: the files of the encoder's folder, a hub id's cached revision, or the tiny
model's build), the dtype and the layout version. A file that cannot be read or whose key differs
(another encoder, a hash collision, a hand-copied file) is ignored with a one-line note and
recomputed.

The embeddings are bit-identical to the encoder's on the device that computed them; an entry made on
a CPU (`camrender encode-prompt --device cpu`) differs from a GPU's encode by rounding only.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from safetensors import safe_open

from camrender.errors import CamrenderError
from camrender.files import atomic_path
from camrender.model.device import resolve_device, resolve_dtype
from camrender.model.refiner.loading import STREAMING_GEMMA, _refiner_root, _text_encoder_folder
from camrender.render.request import MAX_SEQUENCE_LENGTH
from camrender.render.safetensors_header import read_header
from camrender.vocabulary import TINY

LAYOUT_VERSION = 1
ENV_VAR = "CAMRENDER_CACHE"
OFF = "off"
DTYPES = ("bfloat16", "float16", "float32")  # what renders run in (`_dtype_name`)


def resolve_cache_dir(value: Optional[str]) -> Optional[str]:
    """The cache folder for `--prompt-cache VALUE` ("off": None, no cache); None: $CAMRENDER_CACHE, else the
    platform's user cache folder (`platform_cache_dir`)."""
    if value is None:
        value = os.environ.get(ENV_VAR) or None
    if value == OFF:
        return None
    return platform_cache_dir() if value is None else str(Path(value).expanduser())


def platform_cache_dir() -> str:
    """camrender's folder in the user cache: $XDG_CACHE_HOME/camrender or ~/.cache/camrender (Linux and other
    Unix), ~/Library/Caches/camrender (macOS), %LOCALAPPDATA%\\camrender\\Cache (Windows)."""
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return str(Path(home) / "Library" / "Caches" / "camrender")
    if sys.platform == "win32":
        return str(Path(os.environ.get("LOCALAPPDATA") or Path(home) / "AppData" / "Local") / "camrender" / "Cache")
    return str(Path(os.environ.get("XDG_CACHE_HOME") or Path(home) / ".cache") / "camrender")


def _folder_identity(folder: Path) -> list:
    """(relative name, size, mtime ns) of every file under `folder`: a changed weight file changes it."""
    rows = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            rows.append([str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns])
    return rows


def _hub_revision(hub_id: str) -> Optional[str]:
    """The commit of `hub_id`'s locally cached snapshot (refs/main), or None when nothing is cached."""
    root = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or
                                                        Path.home() / ".cache" / "huggingface") / "hub")
    ref = root / f"models--{hub_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None


def encoder_identity(source: str, parts: tuple) -> dict:
    """What identifies the encoder(s) under model `source` ("tiny", a folder or a hub id): `parts` are its
    subfolders (e.g. ("text_encoder", "tokenizer")); tiny models are identified by their build."""
    if source == TINY:
        # the label of the tiny encoders' build (camrender.model.stage1.tiny, seed 0) is part of the cache key:
        # kept as first written, so caches filled before the module moved stay valid
        return {"tiny": list(parts), "build": "camrender.model.tiny seed 0"}
    folder = Path(source).expanduser()
    if folder.is_dir():
        return {"folder": str(folder.resolve()),
                "files": {part: _folder_identity(folder / part) for part in parts if (folder / part).is_dir()}}
    return {"hub": source, "revision": _hub_revision(source), "parts": list(parts)}


class PromptCache:
    """The cache folder; `log(line)` receives the one-line notes (unreadable or foreign entries)."""

    def __init__(self, folder, log: Optional[Callable[[str], None]] = None):
        self.folder = Path(folder)
        self.log = log or (lambda line: None)

    def path(self, key: dict) -> Path:
        digest = hashlib.sha256(_canonical(key).encode()).hexdigest()[:40]
        return self.folder / f"{key['stage']}-{digest}.safetensors"

    def get(self, key: dict) -> Optional[dict]:
        """{name: tensor} stored under `key`, or None (absent, unreadable or another key: noted)."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as handle:
                stored = (handle.metadata() or {}).get("key")
                if stored != _canonical(key):
                    self.log(f"prompt cache entry {path} is for another prompt or encoder; encoding again")
                    return None
                return {name: handle.get_tensor(name) for name in handle.keys()}
        except Exception as error:  # a truncated or foreign file fails in many ways; all mean "unusable"
            text = " ".join(str(error).split())[:100] or type(error).__name__
            self.log(f"prompt cache entry {path} is unreadable ({text}); encoding again")
            return None

    def other_dtypes(self, key: dict) -> list:
        """The dtypes other than `key`'s in which the cache holds an entry of `key` (by name only: a damaged one
        is found when it is read)."""
        if self.path(key).is_file():
            return []
        return [dtype for dtype in DTYPES if dtype != key["dtype"] and self.path({**key, "dtype": dtype}).is_file()]

    def put(self, key: dict, tensors: dict) -> Path:
        """Store `tensors` under `key`: a temporary file, checked whole and renamed into place, so an entry is
        never partial. CamrenderError (naming the entry) when it cannot be written (a full disk)."""
        # lazy: keeps `camrender --help` free of torch (safetensors.torch imports it)
        from safetensors.torch import save_file

        path = self.path(key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_path(path, prefix=f".{path.name}.", suffix=".tmp") as temporary:
                save_file({name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()},
                          temporary, metadata={"key": _canonical(key)})
                read_header(temporary)  # whole (a short write can pass without an error)
        except CamrenderError:
            raise
        except Exception as error:  # noqa: BLE001 - safetensors reports a failed write as its own error type
            reason = " ".join(str(getattr(error, "strerror", None) or error).split())[:160]
            raise CamrenderError(f"cannot write the prompt cache entry: {reason}", path=path) from None
        return path

    def fetch(self, key: dict, compute: Callable[[], dict]) -> dict:
        """The entry under `key`, else `compute()` stored there and returned (noted when the prompt is cached
        in another dtype only; an entry that cannot be stored is a note too: the render goes on)."""
        found = self.get(key)
        if found is not None:
            return found
        others = self.other_dtypes(key)
        if others:
            what = "stage 1's prompt" if key["stage"] == "stage1" else "the refiner's prompt"
            self.log(f"the prompt cache holds {what} in {' and '.join(others)}, but this render runs in "
                     f"{key['dtype']}: encoding again (`camrender encode-prompt --dtype {key['dtype']}` caches it "
                     f"for such renders)")
        tensors = compute()
        try:
            self.put(key, tensors)
        except CamrenderError as error:
            self.log(f"{error}; continuing without caching it")
        return tensors


def _canonical(key: dict) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


# ------------------------------------------------------------------ the two stages' keys and lookups
def _dtype_name(request) -> str:
    load = request.settings
    return str(resolve_dtype(load.dtype, resolve_device(load.device))).replace("torch.", "")


def stage_one_key(request, guidance: bool) -> dict:
    """Stage 1's Gemma-2 embeddings of the request (the negative prompt too under guidance)."""
    return {"stage": "stage1", "version": LAYOUT_VERSION, "prompt": request.prompt or "",
            "negative_prompt": (request.negative_prompt or "") if guidance else None,
            "max_sequence_length": MAX_SEQUENCE_LENGTH, "dtype": _dtype_name(request),
            "encoder": encoder_identity(request.settings.model, ("text_encoder", "tokenizer"))}


def refiner_key(request) -> dict:
    """The refiner's Gemma-3 + connectors embeddings of the request's prompt."""
    return {"stage": "refiner", "version": LAYOUT_VERSION, "prompt": request.prompt or "",
            "dtype": _dtype_name(request),
            "encoder": _refiner_identity(request.settings.refiner)}


def _refiner_identity(spec: str) -> dict:
    """The refiner's connectors and tokenizer folders and its Gemma-3 folder (inside or beside it)."""
    folder = Path(spec).expanduser()
    if spec == TINY or not folder.is_dir():
        return encoder_identity(spec, ("text_encoder", "connectors", "tokenizer"))

    root = _refiner_root(folder)
    gemma = _text_encoder_folder(root)
    identity = encoder_identity(str(root), ("connectors", "tokenizer", "text_encoder"))
    if gemma is not None and gemma.parent != root:
        identity["files"][STREAMING_GEMMA] = _folder_identity(gemma)
    return identity


def note(line: str) -> None:
    print(f"camrender: {line}", file=sys.stderr)


def cache_of(request, quiet: bool = False) -> Optional[PromptCache]:
    folder = getattr(request, "prompt_cache", None)
    return None if folder is None else PromptCache(folder, log=None if quiet else note)


def cached_pair(request, key: dict, compute: Callable[[], tuple], device) -> tuple:
    """(embeds, mask) under `key` in the request's cache (either may be None), else `compute()`'s, stored; each in
    storage of its own whichever way it came (`_owned`)."""
    cache = cache_of(request)
    if cache is None:
        return _owned(*compute())

    def as_tensors():
        embeds, mask = compute()
        return {"embeds": embeds} if mask is None else {"embeds": embeds, "mask": mask}

    found = cache.fetch(key, as_tensors)
    mask = found.get("mask")
    return _owned(found["embeds"].to(device), None if mask is None else mask.to(device))


def _owned(embeds, mask) -> tuple:
    """Copies of an encoded prompt in storage of their own. An encoder hands views into its padded output, a cache
    entry tensors of their own: with equal values the kernels reading them still round differently (1e-6), so a
    render that resumes from a checkpoint made while it encoded the prompt, then reads it from the cache, would
    drift from the uninterrupted render."""
    return tuple(None if tensor is None else tensor.clone() for tensor in (embeds, mask))


def cached_stages(request) -> dict:
    """{"stage1": bool, "refiner": bool}: whether each stage's prompt is in the request's cache (readable, same
    key), so its encoder need not load."""
    guidance = request.guidance is not None and request.guidance > 1.0
    cache = cache_of(request, quiet=True)  # the render's own lookup notes a bad entry
    if cache is None:
        return {"stage1": False, "refiner": False}
    return {"stage1": cache.get(stage_one_key(request, guidance)) is not None,
            "refiner": request.settings.refiner is not None and cache.get(refiner_key(request)) is not None}
