"""Find, check and load the SANA-WM refiner (`--refiner PATH|HUB_ID|tiny|none`) and place it on the GPU.

Where the refiner comes from:

- `tiny`: `camrender.model.refiner.tiny.build_tiny_refiner` (random weights, no download).
- a folder with `model_index.json`: a saved `diffusers.SanaWMLTX2Refiner` (what `save_pretrained` writes).
- the streaming checkpoint's layout: `refiner_diffusers/` (`transformer/`, `connectors/`) with the
  Gemma-3 text encoder in `gemma3_12b/` beside it; the checkpoint's root folder works too.
- a hub id (e.g. `Efficient-Large-Model/SANA-WM_streaming`): its `refiner_diffusers/` and
  `gemma3_12b/` are downloaded, then loaded as above.

`check_refiner_folder` reads only the JSON configs, so a wrong folder stops before any model
loads or any GPU work. The refiner's audio branch (LTX-2 is an audio-video model; SANA-WM's stage
2 runs its video stream only) is dropped on load: about 6 of its 19 billion parameters.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from camrender import vocabulary
from camrender.errors import CamrenderError
from camrender.model.refiner.tiny import TINY_REFINER, TINY_REFINER_TRANSFORMER_CONFIG, build_tiny_refiner
from camrender.model.stage1.loading import _HUB_ID, quiet_loading
from camrender.model.stage1.tiny import TINY_MODEL, TINY_TRANSFORMER_CONFIG

NO_REFINER = vocabulary.NO_REFINER
REFINER_TRANSFORMERS = ("SanaWMLTX2RefinerTransformer3DModel", "LTX2VideoTransformer3DModel")
REFINER_OFFLOAD = vocabulary.REFINER_OFFLOAD.values  # or a number of blocks (`streamed_blocks`)
MIN_STREAMED_BLOCKS = vocabulary.MIN_STREAMED_BLOCKS
STREAMING_REFINER, STREAMING_GEMMA = "refiner_diffusers", "gemma3_12b"
DEFAULT_TEXT_MAX_SEQUENCE_LENGTH = 1024


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CamrenderError(f"cannot read {path.name} ({error})", path=path.parent, field="refiner") from None


def _refiner_root(folder: Path) -> Path:
    """The folder holding `transformer/`: `folder` itself or its `refiner_diffusers/`."""
    nested = folder / STREAMING_REFINER
    return nested if not (folder / "transformer").is_dir() and nested.is_dir() else folder


def _text_encoder_folder(root: Path) -> Optional[Path]:
    for candidate in (root / "text_encoder", root.parent / STREAMING_GEMMA, root / STREAMING_GEMMA):
        if (candidate / "config.json").is_file():
            return candidate
    return None


def check_refiner_folder(folder, latent_channels: Optional[int] = None) -> Path:
    """Raise CamrenderError (naming the folder) unless it holds an LTX-2 refiner whose latent channels
    equal `latent_channels` (None: not checked). Returns the folder holding `transformer/`."""
    folder = Path(folder).expanduser()
    where = dict(path=folder, field="refiner")
    if not folder.is_dir():
        raise CamrenderError("refiner folder not found (pass a folder, a hub id, tiny or none)", **where)
    root = _refiner_root(folder)
    if (root / "model_index.json").is_file():
        pipeline_class = _read_json(root / "model_index.json").get("_class_name")
        if pipeline_class != "SanaWMLTX2Refiner":
            raise CamrenderError(f"not an LTX-2 refiner: model_index.json is a {pipeline_class}, "
                                 f"not a SanaWMLTX2Refiner", **where)
    if not (root / "transformer" / "config.json").is_file():
        raise CamrenderError("not an LTX-2 refiner: no transformer/config.json", **where)
    config = _read_json(root / "transformer" / "config.json")
    if config.get("_class_name") not in REFINER_TRANSFORMERS:
        raise CamrenderError(f"not an LTX-2 refiner: its transformer is a {config.get('_class_name')}", **where)
    if not (root / "connectors" / "config.json").is_file():
        raise CamrenderError("not an LTX-2 refiner: no connectors/config.json", **where)
    if _text_encoder_folder(root) is None:
        raise CamrenderError(f"no Gemma-3 text encoder: looked for text_encoder/, ../{STREAMING_GEMMA}/ "
                             f"and {STREAMING_GEMMA}/", **where)
    channels = config.get("in_channels", 128)
    if latent_channels is not None and channels != latent_channels:
        raise CamrenderError(f"the refiner works on {channels} latent channels but the VAE makes {latent_channels}",
                             **where)
    return root


def vae_latent_channels(model: str, vae=None) -> Optional[int]:
    """Latent channels of the VAE a render will use, from configs on disk (None when only the hub knows)."""
    if vae is not None:
        config = Path(vae).expanduser() / "config.json"
    elif model == TINY_MODEL:
        return TINY_TRANSFORMER_CONFIG["in_channels"]
    else:
        config = Path(model).expanduser() / "vae" / "config.json"
    if not config.is_file():
        return None
    return _read_json(config).get("latent_channels")


def resolve_refiner(spec: Optional[str], latent_channels: Optional[int] = None) -> Optional[str]:
    """Check `--refiner` before anything loads: None/"none" -> None, "tiny" -> "tiny", a folder ->
    its checked path, a hub id -> the id (checked once downloaded)."""
    if spec in (None, "", NO_REFINER):
        return None
    if spec == TINY_REFINER:
        channels = TINY_REFINER_TRANSFORMER_CONFIG["in_channels"]
        if latent_channels is not None and channels != latent_channels:
            raise CamrenderError(f"the tiny refiner works on {channels} latent channels but the VAE makes "
                                 f"{latent_channels} (use it with --model tiny)", path=spec, field="refiner")
        return spec
    folder = Path(spec).expanduser()
    if folder.exists() or not _HUB_ID.match(spec) or spec.startswith((".", "~")):
        return str(check_refiner_folder(folder, latent_channels))
    return spec


def load_refiner(spec: str, *, dtype, latent_channels: Optional[int] = None, text_encoder: bool = True):
    """A `diffusers.SanaWMLTX2Refiner` on the CPU in `dtype` (torch dtype), without its audio branch.

    spec: `resolve_refiner`'s result ("tiny", a checked folder or a hub id).
    text_encoder: False loads no Gemma-3 (`refiner.text_encoder` None: the prompt is cached).
    """
    with quiet_loading():
        if spec == TINY_REFINER:
            refiner = build_tiny_refiner(seed=0, text_encoder=text_encoder).to(dtype=dtype)
        else:
            folder = Path(spec).expanduser()
            if not folder.exists():
                folder = _download(spec)
            refiner = _from_folder(check_refiner_folder(folder, latent_channels), dtype, text_encoder)
    strip_audio(refiner.transformer)
    refiner.set_progress_bar_config(disable=True)
    return refiner


def _download(hub_id: str) -> Path:
    try:
        # lazy: keeps `camrender --help` fast (huggingface_hub's hub client imports in about 0.25 s)
        from huggingface_hub import snapshot_download

        root = snapshot_download(hub_id, allow_patterns=[f"{STREAMING_REFINER}/**", f"{STREAMING_GEMMA}/**"])
    except Exception as error:  # hub/network errors come in many types; all mean "cannot download"
        text = " ".join(str(error).split())[:160] or type(error).__name__
        raise CamrenderError(f"cannot download the refiner from the Hugging Face hub ({text})", path=hub_id,
                             field="refiner") from None
    return Path(root)


def _from_folder(root: Path, dtype, load_text_encoder: bool = True):
    # lazy: keeps `camrender --help` free of torch, diffusers
    import transformers
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaWMLTX2Refiner
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2RefinerTransformer3DModel
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    try:
        if (root / "model_index.json").is_file():
            # An LTX-2 transformer saved as `LTX2VideoTransformer3DModel` has the refiner's weights but not
            # its KV-cached forward: load that folder as the refiner class.
            listed = _read_json(root / "model_index.json").get("transformer", [None, None])[1]
            override = {} if listed == "SanaWMLTX2RefinerTransformer3DModel" else {
                "transformer": SanaWMLTX2RefinerTransformer3DModel.from_pretrained(str(root / "transformer"),
                                                                                   dtype=dtype)}
            if not load_text_encoder:
                override["text_encoder"] = None
            return SanaWMLTX2Refiner.from_pretrained(str(root), dtype=dtype, **override)
        gemma = _text_encoder_folder(root)
        architecture = (_read_json(gemma / "config.json").get("architectures") or ["Gemma3ForConditionalGeneration"])[0]
        text_encoder = (getattr(transformers, architecture).from_pretrained(str(gemma), dtype=dtype).eval()
                        if load_text_encoder else None)
        tokenizer_folder = root / "tokenizer" if (root / "tokenizer").is_dir() else gemma
        scheduler = (FlowMatchEulerDiscreteScheduler.from_pretrained(str(root / "scheduler"))
                     if (root / "scheduler").is_dir() else FlowMatchEulerDiscreteScheduler(shift=1.0))
        return SanaWMLTX2Refiner(
            transformer=SanaWMLTX2RefinerTransformer3DModel.from_pretrained(str(root / "transformer"),
                                                                            dtype=dtype),
            connectors=LTX2TextConnectors.from_pretrained(str(root / "connectors"), dtype=dtype),
            tokenizer=transformers.AutoTokenizer.from_pretrained(str(tokenizer_folder)),
            text_encoder=text_encoder,
            scheduler=scheduler,
            text_max_sequence_length=DEFAULT_TEXT_MAX_SEQUENCE_LENGTH,
        )
    except CamrenderError:
        raise
    except Exception as error:
        text = " ".join(str(error).split())[:160] or type(error).__name__
        raise CamrenderError(f"cannot load the refiner ({text})", path=root, field="refiner") from None


def _is_audio(name: str) -> bool:
    """Submodules and parameters of LTX-2's audio stream and audio-video cross-attention."""
    return "audio" in name or name.startswith("av_") or "a2v" in name or "v2a" in name or name == "cross_attn_rope"


def strip_audio(transformer) -> int:
    """Delete the refiner transformer's audio branch (its video-only forward never reads it);
    returns the number of parameters removed."""
    removed = 0
    for module in [transformer, *transformer.transformer_blocks]:
        for name in [n for n in list(module._modules) + list(module._parameters) if _is_audio(n)]:
            value = getattr(module, name)
            removed += value.numel() if hasattr(value, "numel") else sum(p.numel() for p in value.parameters())
            delattr(module, name)
    return removed


def check_refiner_offload(offload) -> str:
    """`--refiner-offload` as spelt: "none", "layers" or a number of the refiner's blocks to stream
    ("12"); returns it as a string, or raises a CamrenderError naming the field."""
    text = str(offload).strip()
    if text in REFINER_OFFLOAD or (text.isascii() and text.isdigit() and int(text) >= MIN_STREAMED_BLOCKS):
        return text if text in REFINER_OFFLOAD else str(int(text))
    raise CamrenderError(f"must be none, layers or a number of blocks ({MIN_STREAMED_BLOCKS} or more: the two "
                         f"staging slots hold two blocks), got {offload!r}", field="refiner-offload")


def streamed_blocks(offload: str) -> int:
    """How many of the refiner's blocks a numeric `--refiner-offload` streams (0 for "none" and "layers")."""
    text = check_refiner_offload(offload)
    return int(text) if text.isdigit() else 0


def place_refiner(refiner, device, offload: str = "none") -> None:
    """Put the refiner where a render runs it.

    offload "none": the transformer lives on `device`; "layers": it stays in CPU memory and its
    blocks visit `device` one at a time (diffusers group offloading, the next block's copy
    overlapping the current block's compute on CUDA); a number N: N of its blocks, spread over the
    list, stay in page-locked CPU memory and visit `device` through two staging slots while the rest
    lives there (`camrender.model.block_streaming`: N - 2 blocks' weights off the GPU, hidden behind
    the resident blocks' compute while the copies are shorter than a pass). Either way the text encoder
    and connectors stay on the CPU and visit `device` for the one prompt encoding of a render
    (`camrender.model.refiner.stream.encode_refiner_prompt`); under "layers" the text encoder streams its
    layers too (the Gemma-3-12B encoder alone is 24 GB in bf16).
    """
    # lazy: keeps `camrender --help` free of torch
    import torch

    device = torch.device(device)
    offload = check_refiner_offload(offload)
    blocks = refiner.transformer.transformer_blocks
    count = streamed_blocks(offload)
    if count > len(blocks):
        raise CamrenderError(f"the refiner has {len(blocks)} blocks, cannot stream {count}", field="refiner-offload")
    if count:
        from camrender.model.block_streaming import stream_blocks  # lazy: torch

        _move_except(refiner.transformer, blocks, device)
        stream_blocks(blocks, count, device)
        return
    if offload == "none" or device.type != "cuda":
        refiner.transformer.to(device)
        return
    try:  # lazy: accelerate is optional (the offload extra)
        import accelerate  # noqa: F401
    except ImportError:
        raise CamrenderError("--refiner-offload layers needs the accelerate package (pip install accelerate)",
                             field="refiner-offload") from None
    stream_layers(refiner, device, use_stream=True)


def _move_except(module, skipped, device) -> None:
    """Move `module`'s parameters and buffers to `device`, except those under `skipped` (placed by the
    caller): never the whole model on the device at once."""
    for child in module.children():
        if child is not skipped:
            child.to(device)
    for name, param in module._parameters.items():
        if param is not None:
            param.data = param.data.to(device)
    for name, buffer in module._buffers.items():
        if buffer is not None:
            module._buffers[name] = buffer.to(device)


def stream_layers(refiner, device, *, use_stream: bool) -> None:
    """Group-offload the refiner's transformer blocks and its text encoder's decoder layers: each block
    visits `device` while it runs. Modules already streamed are left as they are (a second render
    with the same pipeline places its refiner again).

    use_stream: the transformer's next block is copied on a side CUDA stream while the current one
    runs. The text encoder runs once per render: its decoder layers stream one by one, synchronously,
    each offloaded on its own (`_stream_decoder_layers`).
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch
    from diffusers import hooks

    transformer = refiner.transformer
    if not is_layer_streamed(transformer):
        if use_stream and torch.device(device).type == "cuda":
            # page-locked in place: the offloader keeps these (no 2nd copy); buffers too (FP8 weights are buffers)
            for param in list(transformer.parameters()) + list(transformer.buffers()):
                if param.device.type == "cpu" and not param.is_pinned():
                    param.data = param.data.pin_memory()
        hooks.apply_group_offloading(transformer, onload_device=device, offload_type="block_level",
                                     num_blocks_per_group=1, use_stream=use_stream)
    if refiner.text_encoder is not None and not is_layer_streamed(refiner.text_encoder):
        _stream_decoder_layers(refiner.text_encoder, device)


def _stream_decoder_layers(text_encoder, device) -> None:
    """The text encoder's decoder layers (its largest `layers` list) stay in CPU memory and visit `device`
    one at a time; the rest (embeddings tied to the LM head, final norm, vision tower: ~3 GB for
    Gemma-3-12B) lives on `device`.

    Why not one block-level offload of the whole encoder: its layers sit in nested modules
    (`model.layers`, `model.language_model.layers`), and diffusers 0.42.1 (a) registers a
    `layer_execution_tracker` on the same inner layers once per nesting level when streaming ("Hook
    with name layer_execution_tracker already exists"), and (b) offloads the inner model's embedding
    after the inner forward, while the LM head that shares its weight still has to run.
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch
    from diffusers import hooks

    lists = [(name, module) for name, module in text_encoder.named_modules()
             if name.split(".")[-1] == "layers" and isinstance(module, torch.nn.ModuleList)]
    name, layers = max(lists, key=lambda item: sum(p.numel() for p in item[1].parameters()))
    prefix = name + "."
    for tensor_name, tensor in [*text_encoder.named_parameters(), *text_encoder.named_buffers()]:
        if not tensor_name.startswith(prefix):
            tensor.data = tensor.data.to(device)
    for layer in layers:  # each layer one group: onloaded before its forward, offloaded after
        hooks.apply_group_offloading(layer, onload_device=device, offload_device=torch.device("cpu"),
                                     offload_type="block_level", num_blocks_per_group=1, use_stream=False)


def is_layer_streamed(module) -> bool:
    """Whether `stream_layers` (diffusers group offloading) manages the module's placement: a group
    offloading hook on the module or any of its submodules."""
    for submodule in module.modules():
        registry = getattr(submodule, "_diffusers_hook", None)
        if registry is not None and registry.get_hook("group_offloading") is not None:
            return True
    return False
