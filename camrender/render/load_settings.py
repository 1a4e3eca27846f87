"""`LoadSettings`: everything a loaded pipeline depends on, as one frozen, hashable value.

    settings = LoadSettings.create("tiny", refiner="tiny", precision="bf16")   # checked, nothing loads
    pipe = CamrenderPipeline.from_pretrained(settings=settings)                 # camrender.api

It is `CamrenderPipeline.from_pretrained`'s signature, the key under which a batch keeps its loaded pipeline
(`camrender.batch`), and the only input from which stage 1's, the refiner's and the decoder's settings are
decided (`camrender.model.settings.RenderSettings.decide`). What one render asks for (the path, frames, steps,
seed, ...) is the request's (`camrender.render.request.RenderRequest`), never this.

`create` checks every field before anything loads (files on disk, the device, the refiner's folder); each
error is a `CamrenderError` naming the option, the same text from the API and the command line.
"""
from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Optional

from camrender import vocabulary as words
from camrender.errors import CamrenderError
from camrender.model.device import check_device
from camrender.model.precision import get_precision
from camrender.model.refiner.loading import check_refiner_offload, resolve_refiner, vae_latent_channels
from camrender.model.stage1.loading import model_source
from camrender.model.stage1.recipes import WEIGHT_SUFFIXES, resolve_recipe


@dataclasses.dataclass(frozen=True)
class LoadSettings:
    """What a pipeline is loaded with (build it with `create`, which checks and resolves each field).

    Attributes:
        model: hub id, local diffusers pipeline folder, or "tiny" (the offline random-weight model).
        transformer_weights: an original-format DiT file loaded over the transformer (absolute path), or None.
        vae: a diffusers VAE folder replacing the pipeline's (absolute path), or None.
        recipe: the checkpoint's recipe name (`camrender.vocabulary.RECIPE`), told from the checkpoint when
            not given.
        allow_missing_weights: load even when `transformer_weights` leaves transformer weights unloaded.
        kernels: `camrender.vocabulary.KERNELS`: "fused" | "torch".
        dtype: `camrender.vocabulary.DTYPE`: "auto" (bfloat16 on CUDA, float32 on a CPU) | "bfloat16" | ...
        device: "cuda", "cuda:N", "cpu" or None (CUDA when available).
        offload: model CPU offload (components visit the GPU only while they run).
        cuda_graphs: replay stage 1's denoising passes as CUDA graphs (on CUDA without offload).
        stage1_precision, refiner_precision: `camrender.vocabulary.PRECISION` of each stage's linear layers.
        refiner: stage 2: None, "tiny", a checked refiner folder or a hub id.
        refiner_offload: "none" | "layers" | a number of the refiner's blocks streamed from CPU memory ("12").
        refiner_window: the refiner's KV window in latent frames (the sink plus N-1 recent ones).
        head_split: how many GPUs of a video group split every block's heads (1: none;
            `camrender.parallel.cfg.head_split_size`).
    """

    model: str = words.DEFAULT_MODEL
    transformer_weights: Optional[str] = None
    vae: Optional[str] = None
    recipe: str = words.DEFAULT_RECIPE
    allow_missing_weights: bool = False
    kernels: str = words.KERNELS.default
    dtype: str = words.DTYPE.default
    device: Optional[str] = None
    offload: bool = False
    cuda_graphs: bool = True
    stage1_precision: str = words.PRECISION.default
    refiner: Optional[str] = None
    refiner_offload: str = words.REFINER_OFFLOAD.default
    refiner_precision: str = words.PRECISION.default
    refiner_window: int = words.REFINER_WINDOW
    head_split: int = 1

    @classmethod
    def create(cls, model: str = words.DEFAULT_MODEL, *, precision: Optional[str] = None, **given) -> "LoadSettings":
        """Checked settings from the API's keywords (the fields above; `precision` sets both stages' unless
        `stage1_precision` / `refiner_precision` say otherwise). A refiner option without a refiner, an unknown
        keyword (named with the closest valid one), a missing file, a device this machine lacks, FP8 on a card
        without it: CamrenderError naming the option. Nothing loads."""
        unknown = sorted(set(given) - set(FIELDS))
        if unknown:
            raise unknown_keyword(unknown[0], [*FIELDS, "precision"])
        given = {name: value for name, value in given.items() if value is not None}
        refiner = resolve_refiner(given.pop("refiner", None), vae_latent_channels(model, given.get("vae")))
        _refuse_refiner_options(refiner, given)
        values = {**given, "model": model, "refiner": refiner}
        values["kernels"] = words.check_word(words.KERNELS, values.get("kernels", words.KERNELS.default))
        values["dtype"] = words.check_word(words.DTYPE, values.get("dtype", words.DTYPE.default))
        check_device(values.get("device"), bool(values.get("offload")), values["dtype"])
        for name in ("transformer_weights", "vae"):
            if values.get(name) is not None:
                values[name] = str(_checked_path(name, values[name]))
        if model != words.TINY:
            model_source(model)  # a folder that is not there: now, not after minutes of loading
        values["recipe"] = resolve_recipe(values.get("recipe"), values.get("transformer_weights"), model).name
        values["refiner_offload"] = check_refiner_offload(values.get("refiner_offload", "none"))
        values["refiner_window"] = _checked_window(values.get("refiner_window", words.REFINER_WINDOW))
        precisions = _stage_precisions(precision, values)
        settings = cls(**values, **precisions)
        settings.check_split()
        return settings

    def check_split(self) -> None:
        """What a head split (`head_split` > 1) and each stage's precision rule out."""
        if self.head_split > 1 and self.offload:
            raise CamrenderError("--offload does not work with the head split of several GPUs per video (each GPU "
                                 "holds its share of the weights)", field="offload")
        if self.head_split > 1 and self.kernels != "fused":
            raise CamrenderError("the head split of several GPUs per video runs --kernels fused only (--kernels "
                                 "torch is the single-GPU check path)", field="kernels")
        get_precision(self.stage1_precision).check_setup(kernels=self.kernels, offload=self.offload,
                                                         head_split=self.head_split, option="stage1_precision")

    def replace(self, **changes) -> "LoadSettings":
        """These settings with `changes` (checked again: a head split, a rank's device)."""
        changed = dataclasses.replace(self, **changes)
        changed.check_split()
        return changed

    def record(self) -> dict:
        """{field: value} as `NAME.render.json` records them."""
        return dataclasses.asdict(self)


FIELDS = tuple(field.name for field in dataclasses.fields(LoadSettings))
REFINER_FIELDS = ("refiner_offload", "refiner_precision", "refiner_window")  # need a refiner


def unknown_keyword(name: str, valid) -> CamrenderError:
    """The error of a mistyped keyword: names the closest valid one."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]}?)" if close else f" (valid: {', '.join(sorted(valid))})"
    return CamrenderError(f"unknown setting {name!r}{hint}", field=name)


def _refuse_refiner_options(refiner, given: dict) -> None:
    """A refiner option given without a refiner is refused rather than ignored."""
    if refiner is not None:
        return
    for name in REFINER_FIELDS:
        if name in given:
            option = "--" + name.replace("_", "-")
            raise CamrenderError(f"{option} applies to the refiner (stage 2): pass --refiner too, or drop it",
                                 field=option.lstrip("-"))


def _stage_precisions(precision: Optional[str], values: dict) -> dict:
    """{"stage1_precision", "refiner_precision"}: each stage's given word, else `precision`'s, else bf16; each
    checked against the device, the error naming the option that chose it."""
    chosen = {}
    for name in ("stage1_precision", "refiner_precision"):
        option = name if values.get(name) is not None else "precision"
        word = values.pop(name, None) or precision or words.PRECISION.default
        words.check_word(words.PRECISION, word, field=option.replace("_", "-"))
        get_precision(word).check_device(values.get("device"), option.replace("_", "-"))
        chosen[name] = word
    return chosen


def _checked_path(name: str, path) -> Path:
    """--transformer-weights (a .safetensors / .pt file) or --vae (a folder with a config.json), absolute."""
    field = name.replace("_", "-")
    path = Path(path).expanduser()
    if name == "vae":
        if not (path / "config.json").is_file():
            problem = "folder not found" if not path.exists() else "not a diffusers VAE folder (no config.json)"
            raise CamrenderError(problem, path=path, field=field)
        return path.resolve()
    if not path.is_file():
        problem = ("is a directory, expected a .safetensors or .pt file" if path.is_dir() else
                   "is not a regular file (a FIFO, device or socket)" if path.exists() else "file not found")
        raise CamrenderError(problem, path=path, field=field)
    if path.suffix.lower() not in WEIGHT_SUFFIXES:
        raise CamrenderError(f"--transformer-weights (original-format DiT weights) must end with "
                             f"{' or '.join(WEIGHT_SUFFIXES)}, got {path.suffix.lower() or 'no suffix'!r}", path=path)
    return path.resolve()


def _checked_window(window) -> int:
    """--refiner-window: a whole number of latent frames, 1 .. `camrender.vocabulary.MAX_REFINER_WINDOW`."""
    if isinstance(window, bool) or not isinstance(window, (int, str)) or not str(window).strip().lstrip("-").isdigit():
        raise CamrenderError(f"must be a whole number of latent frames, got {window!r}", field="refiner-window")
    window = int(window)
    if window < 1:
        raise CamrenderError(f"must be at least 1 latent frame, got {window}", field="refiner-window")
    if window > words.MAX_REFINER_WINDOW:
        raise CamrenderError(f"must be at most {words.MAX_REFINER_WINDOW} latent frames (the RoPE table's), got "
                             f"{window}", field="refiner-window")
    return window
