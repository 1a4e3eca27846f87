"""Load the SANA-WM pipeline (hub id, local diffusers folder, or the built-in "tiny" model) and DiT weights.

    pipe = load_pipeline("Efficient-Large-Model/SANA-WM_bidirectional-diffusers", dtype="auto", device=None)
    report = load_transformer_weights(pipe.transformer, "sana_dit/model.pt")

Original-format DiT checkpoints (chunk-causal `.safetensors`, streaming `.pt`) use the
diffusers transformer's parameter names after unwrapping a `generator` entry, stripping a
`model.` prefix, renaming the timestep MLP (`t_embedder.mlp.0/2` -> `t_embedder.linear_1/2`)
and dropping what only the original class has (`pos_embed`, `y_embedder.y_embedding`, the
caption-dropout embedding). A file that leaves any transformer weight unloaded is refused.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path

from camrender.errors import CamrenderError
from camrender.model.device import resolve_device, resolve_dtype
from camrender.model.stage1.recipes import unreadable_weights
from camrender.model.stage1.tiny import TINY_MODEL, build_tiny_pipeline

DEFAULT_MODEL = "Efficient-Large-Model/SANA-WM_bidirectional-diffusers"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SUGGESTION = "pass --model PATH (a downloaded diffusers folder) or --model tiny (offline test model)"


# ----------------------------------------------------------------------------- pipeline
def load_pipeline(model: str = DEFAULT_MODEL, *, dtype="auto", device=None, offload: bool = False,
                  transformer_weights=None, vae=None, log=None, allow_missing_weights: bool = False,
                  text_encoder: bool = True):
    """Load a `SanaWMPipeline` ready to run on `device`.

    Args:
        model: hub id, local diffusers pipeline folder, or "tiny" (`camrender.model.stage1.tiny`).
        dtype: "auto" | "bfloat16" | "float16" | "float32" (or a torch dtype).
        device: "cuda", "cpu", ... or None (CUDA when available).
        offload: model CPU offload (needs `accelerate` and a GPU): each component is moved to the
            GPU only while it runs.
        transformer_weights: optional original-format DiT file loaded over the transformer.
        vae: optional diffusers `AutoencoderKLLTX2Video` folder replacing the pipeline's VAE
            (e.g. the streaming checkpoint's causal VAE, `SANA-WM_streaming/ltx2_causal_vae`).
        log: optional callable(str) for warnings (missing/unexpected weight keys).
        allow_missing_weights: keep transformer weights the file lacks as they are instead of refusing.
        text_encoder: False loads no text encoder (`pipe.text_encoder` None: the prompt is cached).

    Raises CamrenderError when the folder is missing, the hub is unreachable, or the weights
    do not fit.
    """
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    with quiet_loading():
        if model == TINY_MODEL:
            pipe = build_tiny_pipeline(seed=0, text_encoder=text_encoder)
            pipe.to(dtype=torch_dtype)
        else:
            pipe = _from_pretrained(model, torch_dtype, {} if text_encoder else {"text_encoder": None})
        if vae is not None:
            pipe.register_modules(vae=load_vae(vae, torch_dtype))
    if transformer_weights is not None:
        report = load_transformer_weights(pipe.transformer, transformer_weights,
                                          allow_missing=allow_missing_weights)
        if log is not None:
            for line in report.summary_lines():
                log(line)
    if offload:
        if device.type != "cuda":
            raise CamrenderError("--offload moves components to a GPU while they run; it needs a CUDA device",
                                 field="offload")
        try:  # lazy: accelerate is optional (the offload extra)
            import accelerate  # noqa: F401
        except ImportError:
            raise CamrenderError("--offload needs the accelerate package (pip install accelerate)",
                                 field="offload") from None
        pipe.enable_model_cpu_offload(device=device)
    else:
        pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@contextlib.contextmanager
def quiet_loading():
    """diffusers' and transformers' notes while a model loads or changes dtype off ("modules that should be kept in
    float32: []", hub chatter): camrender's own lines say what matters. Their levels are restored after."""
    # lazy: keeps `camrender --help` free of torch, diffusers
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    saved = diffusers_logging.get_verbosity(), transformers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        diffusers_logging.set_verbosity(saved[0])
        transformers_logging.set_verbosity(saved[1])


def model_source(model: str) -> str:
    """What `from_pretrained` loads for `model`: a local pipeline folder or a hub id. CamrenderError
    (before anything loads) when it is neither."""
    folder = Path(model).expanduser()
    if folder.exists():
        if not folder.is_dir() or not (folder / "model_index.json").is_file():
            raise CamrenderError(f"not a diffusers pipeline folder (no model_index.json); {_SUGGESTION}",
                                 path=folder, field="model")
        source = str(folder)
    elif _HUB_ID.match(model) and not model.startswith((".", "~")):
        source = model
    else:
        raise CamrenderError(f"model folder not found; {_SUGGESTION}", path=model, field="model")
    return source


def _from_pretrained(model: str, torch_dtype, components=None):
    # lazy: keeps `camrender --help` free of torch, diffusers
    from diffusers import SanaWMPipeline

    source = model_source(model)
    try:
        return SanaWMPipeline.from_pretrained(source, dtype=torch_dtype, **(components or {}))
    except Exception as error:  # hub/network errors come in many types; all mean "cannot load"
        raise CamrenderError(f"{_load_failure(model, source, error)}; {_SUGGESTION}", field="model") from None


def load_vae(folder, torch_dtype):
    """An `AutoencoderKLLTX2Video` from a local diffusers folder (its `config.json` + weights)."""
    # lazy: keeps `camrender --help` free of torch, diffusers
    from diffusers import AutoencoderKLLTX2Video

    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise CamrenderError("not a diffusers VAE folder (no config.json)", path=folder, field="vae")
    try:
        return AutoencoderKLLTX2Video.from_pretrained(str(folder), dtype=torch_dtype)  # diffusers 0.42: dtype=, torch_dtype= warns
    except Exception as error:
        text = " ".join(str(error).split())[:160] or type(error).__name__
        raise CamrenderError(f"cannot load the VAE ({text})", path=folder, field="vae") from None


def _load_failure(model: str, source: str, error: Exception) -> str:
    """One short clause saying why `from_pretrained` failed."""
    text = " ".join(str(error).split())
    if source != model:  # a local folder
        return f"cannot load the pipeline folder ({text[:160] or type(error).__name__})"
    offline_words = ("not fully cached", "offline", "connect", "resolve", "Name or service", "timed out", "HTTPS")
    if any(word in text for word in offline_words):
        return f"cannot load {model!r}: the Hugging Face hub is unreachable and the model is not in the local cache"
    return f"cannot load {model!r} from the Hugging Face hub ({text[:160] or type(error).__name__})"


# ----------------------------------------------------------------------------- original-format DiT weights
@dataclasses.dataclass
class WeightsReport:
    """What `load_transformer_weights` did: names of loaded, missing and unexpected keys."""

    path: str
    loaded: list
    missing: list
    unexpected: list

    def summary_lines(self, show: int = 5) -> list:
        lines = [f"{self.path}: loaded {len(self.loaded)} tensors"]
        for label, names in (("missing (kept as initialised)", self.missing), ("unexpected (ignored)", self.unexpected)):
            if names:
                more = f", ... ({len(names) - show} more)" if len(names) > show else ""
                lines.append(f"{self.path}: {len(names)} {label}: {', '.join(names[:show])}{more}")
        return lines


# Original (NVlabs `SanaMSVideoCamCtrl*`) parameter names -> diffusers `SanaWMTransformer3DModel` names.
ORIGINAL_RENAMES = {
    "t_embedder.mlp.0.": "t_embedder.linear_1.",
    "t_embedder.mlp.2.": "t_embedder.linear_2.",
}
# Entries only the original class has: the sincos position buffer (unused with RoPE, popped by the
# official loader) and the caption-dropout embedding (training only).
ORIGINAL_ONLY = ("pos_embed", "y_embedder.y_embedding")


def original_to_diffusers_key(key: str):
    """The diffusers name of an original-format key (prefix `model.` stripped, timestep MLP
    renamed), or None for an original-only entry."""
    name = key[len("model."):] if key.startswith("model.") else key
    if name.startswith(ORIGINAL_ONLY):
        return None
    for old, new in ORIGINAL_RENAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def map_original_state_dict(state: dict) -> dict:
    """An original-format state dict (already unwrapped) keyed by diffusers names; tensors only."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    mapped = {}
    for key, value in state.items():
        name = original_to_diffusers_key(key) if isinstance(value, torch.Tensor) else None
        if name is not None:
            mapped[name] = value
    return mapped


def read_original_state_dict(path) -> dict:
    """Tensors of an original-format DiT file, keyed by the diffusers transformer's names.

    `.safetensors` or a torch pickle (`.pt`, `.pth`, `.bin`, read with weights_only=True);
    a `generator` (or `state_dict`) entry is unwrapped (in a safetensors file: the `generator.`
    key prefix, other entries ignored), then `map_original_state_dict`.
    """
    # lazy: keeps `camrender --help` free of torch
    import torch

    path = Path(path)
    where = dict(path=path, field="transformer-weights")
    if not path.is_file():
        raise CamrenderError("weights file not found", **where)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:
        raise unreadable_weights(path, error) from None
    for wrapper in ("generator", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
            break
        flat = f"{wrapper}."  # the same wrapper flattened into key prefixes (safetensors)
        if isinstance(state, dict) and any(key.startswith(flat) for key in state):
            state = {key[len(flat):]: value for key, value in state.items() if key.startswith(flat)}
            break
    if not isinstance(state, dict):
        raise CamrenderError("file does not hold a state dict", **where)
    return map_original_state_dict(state)


def load_transformer_weights(transformer, path, *, allow_missing: bool = False, tensors=None) -> WeightsReport:
    """Load an original-format DiT file into a `SanaWMTransformer3DModel` in place (dtype/device kept).

    A file that leaves any transformer weight unloaded raises CamrenderError naming the first
    missing keys, unless `allow_missing` (then they keep their values and are reported);
    unexpected keys are reported. A file sharing no key with the model, or with a tensor of the
    wrong shape, raises CamrenderError. `tensors`: the file's state dict already mapped
    (`map_original_state_dict`), instead of reading `path`.
    """
    where = dict(path=Path(path), field="transformer-weights")
    tensors = read_original_state_dict(path) if tensors is None else tensors
    expected = transformer.state_dict()
    loaded = [name for name in tensors if name in expected]
    if not loaded:
        raise CamrenderError("no tensor in this file matches the SANA-WM transformer", **where)
    for name in loaded:
        if tuple(tensors[name].shape) != tuple(expected[name].shape):
            raise CamrenderError(
                f"{name}: shape {tuple(tensors[name].shape)} does not match the model's {tuple(expected[name].shape)}",
                **where,
            )
    missing = [name for name in expected if name not in tensors]
    if missing and not allow_missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CamrenderError(f"leaves {len(missing)} transformer weights unloaded ({', '.join(missing[:3])}{more}); "
                             f"pass --allow-missing-weights to render anyway", **where)
    transformer.load_state_dict({name: tensors[name] for name in loaded}, strict=False)
    return WeightsReport(
        path=str(path),
        loaded=loaded,
        missing=missing,
        unexpected=[name for name in tensors if name not in expected],
    )
