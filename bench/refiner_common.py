"""What the refiner benches share (bench_refiner.py, refiner_targets.py, bench_fp8.py): the release refiner and
text-encoder shapes built with random weights, the refiner's prompt as random embeddings, and the stream's
kernel backend per device."""
from __future__ import annotations

import contextlib
import os
import sys
from types import SimpleNamespace

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2RefinerTransformer3DModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from camrender.model import parking  # noqa: E402
from camrender.model.refiner.loading import strip_audio  # noqa: E402
from camrender.model.refiner.stream import RefinerText  # noqa: E402
from camrender.model.refiner.tiny import build_tiny_refiner  # noqa: E402

VIDEO_FPS = 16.0
# Gemma-3-12B's text tower (the refiner's text encoder), for the encode time and memory
# Gemma-2-2B, stage 1's text encoder: resident on the GPU during a render (built for the peaks, never run)
GEMMA2_2B = dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=256, vocab_size=256000)
GEMMA3_12B_TEXT = dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=256, vocab_size=262208, sliding_window=1024)



class default_dtype:
    """Build modules directly in `dtype` (a release refiner in fp32 would need 76 GB before the cast)."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.saved = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.saved)


def build_refiner_transformer(tiny, device, dtype):
    """The release refiner DiT (diffusers defaults) without its audio branch, random weights, on `device`."""
    if tiny:
        transformer = build_tiny_refiner(seed=0).transformer
    else:
        torch.manual_seed(0)
        with torch.device(device), default_dtype(dtype):
            transformer = SanaWMLTX2RefinerTransformer3DModel()
    strip_audio(transformer)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return transformer.to(device, dtype).eval()


def build_text_model(tiny, device, dtype):
    """A Gemma-3 text model shaped like the refiner's Gemma-3-12B text tower (tiny: one small layer)."""
    # lazy: transformers' Gemma classes are optional here (a transformers without them still runs the other benches)
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**(dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=8, vocab_size=128) if tiny else GEMMA3_12B_TEXT))
    torch.manual_seed(0)
    with torch.device(device), default_dtype(dtype):
        model = Gemma3ForCausalLM(config)
    return model.to(dtype).eval()


def refiner_text(transformer, tokens, device, dtype):
    generator = torch.Generator().manual_seed(1)
    embeds = torch.randn(1, tokens, transformer.config.caption_channels, generator=generator)
    return RefinerText(embeds=embeds.to(device, dtype), mask=torch.ones(1, tokens, dtype=torch.long, device=device))


def as_refiner(transformer):
    """The parts of a `SanaWMLTX2Refiner` that `RefinerStream` reads."""
    return SimpleNamespace(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0))


def kernel_backend(device):
    """The fused refiner path's kernels: Triton on CUDA; on a CPU (tests) their PyTorch references, never the
    interpreter."""
    return "auto" if device.type == "cuda" else "torch"


@contextlib.contextmanager
def unparked():
    """Within: streams park nothing (`camrender.model.parking` parks on no device type), so a model copied or
    quantized there holds all its weights where it runs."""
    kept = parking.PARKED_DEVICE_TYPES
    parking.PARKED_DEVICE_TYPES = ()
    try:
        yield
    finally:
        parking.PARKED_DEVICE_TYPES = kept
