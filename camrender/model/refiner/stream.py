"""Stage 2: the SANA-WM refiner (diffusers' `SanaWMLTX2Refiner`), streamed block by block.

The refiner is an LTX-2 DiT that polishes stage-1 latents chunk-causally: latent frame 0 is the
attention sink (kept verbatim), every later run of `block_size` (3) frames is one block, denoised
from the stage-1 latents re-noised to sigma 0.909375 through the 3-step distilled list while its
queries attend to [sink, the <= 10 most recent refined frames, the block]. A block therefore needs
only its own stage-1 frames and the refined past: `RefinerStream.push` refines each block as soon
as its frames have arrived, so segment mode keeps growing the video segment by segment with a
bounded window (memory flat in the path length).

`RefinerStream` drives diffusers' own modules (the refiner transformer, its
`SanaWMRefinerKVCache` and the scheduler's sigma list) in the order `SanaWMLTX2Refiner.__call__`
does, block for block and with the same noise draws, so the refined latents equal that call's
on the whole clip (tests/model/test_refiner.py). What it changes is how the loop runs: it takes the
stage-1 latents piecewise, encodes the prompt once per render, builds each block's RoPE once
(not per step), gives the transformer one timestep per row instead of one per token (the same
values, 2640x fewer adaLN rows at 704x1280), keeps the sigmas as Python numbers and builds RoPE
and noise without host-device syncs, computes the prompt's cross-attention keys and values once
per render (`_TextMemo`), keeping the projections that make them in CPU memory otherwise
(`camrender.model.parking`), and runs SDPA cuDNN-first on CUDA.

The refiner runs eagerly. Replaying its steady-state passes as CUDA graphs was tried and taken
out: on an H200 a graphed render was no faster (the GPU, not the host, bounds the refiner) and,
with the stages overlapped on CUDA streams, it stalled the GPU
(bench/results/2026-12-01_refiner_schedules_h200.json).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Optional

import torch
from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache
from diffusers.pipelines.sana_wm.refiner import STAGE_2_DISTILLED_SIGMA_VALUES, _pack_latents, _unpack_latents
from diffusers.utils.torch_utils import randn_tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from camrender.model.device import to_device
from camrender.model.parking import park_all
from camrender.model.refiner.block import use_refiner_kernels
from camrender.model.refiner.loading import is_layer_streamed
from camrender.model.refiner.window import WindowKVCache
from camrender.model.stage1.softmax_attention import SDPA_BACKENDS

SINK_FRAMES = 1  # the released recipe: latent frame 0 is the sink
BLOCK_FRAMES = 3
KV_MAX_FRAMES = 11  # sink + 10 recent frames


@dataclasses.dataclass(frozen=True)
class RefinerText:
    """The refiner's prompt, encoded once per render: embeds (1, L, D_caption) and mask (1, L) of 0/1,
    or None (every token kept)."""

    embeds: torch.Tensor
    mask: Optional[torch.Tensor]


def encode_refiner_prompt(refiner, prompt: str, device, dtype) -> RefinerText:
    """Gemma-3 + LTX-2 connectors through diffusers' `SanaWMLTX2Refiner._encode_prompt`.

    The text encoder and connectors visit `device` for this one call when they live elsewhere
    (they run once per render; the Gemma-3-12B encoder is 24 GB in bf16), and go back after.
    """
    moved = []
    for name in ("text_encoder", "connectors"):
        module = getattr(refiner, name)
        if not is_layer_streamed(module) and _device_of(module) != torch.device(device):
            moved.append((module, _device_of(module)))
            module.to(device)
    try:
        with torch.no_grad():
            embeds, mask = refiner._encode_prompt(prompt or "", device=device, dtype=dtype)
    finally:
        for module, home in moved:
            module.to(home)
        if moved and torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return RefinerText(embeds=embeds, mask=mask)


def _device_of(module) -> torch.device:
    return next(module.parameters()).device


class RefinerStream:
    """Refine one clip's stage-1 latents (1, C, T, h, w) as they arrive, in DiT-normalised space.

        stream = RefinerStream(refiner, text, fps=16, generator=torch.Generator().manual_seed(42))
        for segment in stage_one:            # consecutive latent frames, any split
            emit(stream.push(segment))       # refined frames now final (possibly 0 of them)
            stream.settle()                  # optional: the block's history pass now (else the next push runs it)
        emit(stream.finish())                # the last (possibly shorter) block

    The concatenated outputs equal `SanaWMLTX2Refiner.__call__(clip, prompt, fps=fps,
    generator=generator, output_type="latent")` for the same generator: frame 0 (the sink) is the
    stage-1 frame, every block is refined once all its frames (or the clip's end) have arrived.

    Args:
        refiner: a `SanaWMLTX2Refiner` (only its transformer and scheduler are used here).
        text: `encode_refiner_prompt`'s result.
        fps: video frame rate (LTX-2's temporal RoPE is in seconds).
        generator: noise of the block endpoints, drawn in block order as diffusers does
            (a CPU generator keeps renders repeatable across devices).
        device: where the transformer runs (default: its parameters' device).
        sigmas: the Euler sigma list ending in 0 (default: diffusers' 3-step distilled list).
        kernels: "fused" (default): the blocks run `camrender.model.refiner.block`'s fused path and a
            `WindowKVCache` (no per-pass concatenation); "torch": diffusers' block forward and processor.
            Either way the setting stays on the transformer until another stream changes it.
        kernel_backend: the fused path's kernels: "auto" (Triton on CUDA or under TRITON_INTERPRET=1),
            "triton" or "torch" (their PyTorch references).
    """

    def __init__(self, refiner, text: RefinerText, *, fps: float, generator: Optional[torch.Generator] = None,
                 device=None, sink_frames: int = SINK_FRAMES, block_frames: int = BLOCK_FRAMES,
                 kv_max_frames: int = KV_MAX_FRAMES, sigmas=None,
                 kernels: str = "fused", kernel_backend: str = "auto"):
        self.transformer = refiner.transformer
        self.text = text
        self.fps = float(fps)
        self.device = torch.device(device) if device is not None else _device_of(self.transformer)
        self.dtype = next(self.transformer.parameters()).dtype
        self.generator = generator
        self.sink_frames, self.block_frames = int(sink_frames), int(block_frames)
        self.max_history = int(kv_max_frames) - self.sink_frames
        sigmas = STAGE_2_DISTILLED_SIGMA_VALUES if sigmas is None else sigmas
        # The scheduler's own sigma list (it may shift what it is given), read once: Python numbers
        # from here on, so no step waits for the GPU.
        refiner.scheduler.set_timesteps(sigmas=[float(s) for s in sigmas[:-1]], device="cpu")
        self.sigmas = [float(s) for s in refiner.scheduler.sigmas]
        # A prompt mask that keeps every token (LTX-2's connectors fill the padding with learned
        # registers) is an additive zero: leaving it out lets cross-attention use the fused SDPA kernels.
        self.text_mask = None if text.mask is None or bool(text.mask.all()) else text.mask
        self.text_memo = _TextMemo(self.transformer)
        self.text_memo.park()  # a no-op after the loader's `park_prompt_projections`
        self.call = _TransformerCall(self.transformer, self.text_memo, self.device)
        fused = use_refiner_kernels(self.transformer, kernels, kernel_backend)
        scale = float(self.transformer.config.timestep_scale_multiplier)
        # One (1, 1) timestep per sigma, made once: the model broadcasts its modulation over the tokens.
        self.timesteps = {s: torch.full((1, 1), s * scale, dtype=torch.float32, device=self.device)
                          for s in self.sigmas[:-1] + [0.0]}
        layers = len(self.transformer.transformer_blocks)
        if fused and self.max_history > 0:  # K/V written in place, no per-pass copies
            self.cache = WindowKVCache(layers, history_frames=self.max_history, block_frames=self.block_frames,
                                       sink_frames=self.sink_frames)
        else:  # diffusers' own cache: the stock blocks, or a window of the sink alone (no history to place)
            self.cache = SanaWMRefinerKVCache(layers)
        self.pending = None  # stage-1 frames received and not yet refined, (1, C, t, h, w)
        self.next_frame = 0  # absolute index of pending's first frame
        self.history_frames = 0
        self.blocks_done = 0
        self.unsettled = None  # (refined latents, their RoPE) of the last block, its history pass still to run

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def push(self, latents: torch.Tensor) -> torch.Tensor:
        """Take the next stage-1 frames; return the refined frames that are now final (1, C, t', h, w)."""
        latents = latents.to(device=self.device, dtype=self.dtype)
        self.pending = latents if self.pending is None else torch.cat([self.pending, latents], dim=2)
        out = []
        if self.next_frame == 0:
            if self.pending.shape[2] < self.sink_frames:
                return self.pending[:, :, :0]
            out.append(self._take(self.sink_frames))
            self._capture_sink(out[0])
        while self.pending.shape[2] >= self.block_frames:
            out.append(self._refine_block(self._take(self.block_frames)))
        return torch.cat(out, dim=2) if out else self.pending[:, :, :0]

    @torch.no_grad()
    def finish(self) -> torch.Tensor:
        """Refine the frames still pending (the clip's last block, shorter than `block_frames`). The clip's
        last history pass is left out: nothing reads the window after it."""
        if self.pending is None or self.next_frame < self.sink_frames:
            raise ValueError(f"the refiner needs more than {self.sink_frames} latent frame(s)")
        if self.pending.shape[2] == 0:
            return self.pending
        return self._refine_block(self._take(self.pending.shape[2]))

    @torch.no_grad()
    def settle(self) -> None:
        """Run the last refined block's history pass (sigma 0: its post-RoPE K/V into the window), if it
        has not run yet. The next block's refinement runs it first; a caller that wants a block's frames
        sooner (`refined_frames` in low-latency order) queues their decode and then calls this, so the
        pass runs on the GPU while the frames are copied out and shown. The results are the same."""
        if self.unsettled is None:
            return
        latents, rope = self.unsettled
        self.unsettled = None
        self._forward(latents, 0.0, rope, "inject_and_capture_post_rope")  # appends to the history
        self.history_frames += latents.shape[2]
        if self.max_history > 0:
            self.history_frames = min(self.history_frames, self.max_history)

    # ------------------------------------------------------------------ internals
    def _take(self, frames: int) -> torch.Tensor:
        taken, self.pending = self.pending[:, :, :frames], self.pending[:, :, frames:]
        self.next_frame += frames
        return taken

    def _rope(self, start: int, frames: int, height: int, width: int):
        """The video RoPE (cos, sin) of latent frames [start, start + frames):
        `build_rotary_emb_for_absolute_positions` with the same operations, its coordinates made with
        `arange` on the device rather than copied from Python lists (each such copy waits for the GPU)."""
        rope = self.transformer.rope
        step_t, step = int(rope.patch_size_t), int(rope.patch_size)
        axes = [torch.arange(start, start + frames, dtype=torch.float32, device=self.device)[::step_t],
                torch.arange(0, height, step, dtype=torch.float32, device=self.device),
                torch.arange(0, width, step, dtype=torch.float32, device=self.device)]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)
        ends = torch.stack([grid[0] + step_t, grid[1] + step, grid[2] + step])
        coords = torch.stack([grid, ends], dim=-1).flatten(1, 3).unsqueeze(0)  # (1, 3, tokens, 2)
        scales = rope.scale_factors
        pixels = torch.stack([coords[:, axis] * scales[axis] for axis in range(3)], dim=1)
        pixels[:, 0] = (pixels[:, 0] + rope.causal_offset - scales[0]).clamp(min=0) / self.fps
        return rope(pixels, device=self.device)

    def _forward(self, block: torch.Tensor, sigma: float, rope, mode: str) -> torch.Tensor:
        """The transformer on one block (1, C, t, h, w) at one sigma: the velocity tokens (1, t*h*w, C)."""
        config = self.transformer.config
        tokens = _pack_latents(block, patch_size=config.patch_size, patch_size_t=config.patch_size_t)
        timestep = self.timesteps[sigma]
        velocity = self.call(tokens, timestep, rope, self.text.embeds, self.text_mask, self.cache, mode)
        if mode == "inject_and_capture_post_rope":
            self._append_history(block.shape[2])
        return velocity

    def _capture_sink(self, sink: torch.Tensor) -> None:
        """Pre-RoPE K/V of the raw sink frames at sigma 0, stored in every layer's cache."""
        _, _, frames, height, width = sink.shape
        self._forward(sink, 0.0, self._rope(0, frames, height, width), "capture_pre_rope")
        for layer in self.cache.layer_caches:
            layer.store_sink(*layer.get_captured_pre_rope())

    def _refine_block(self, clean: torch.Tensor) -> torch.Tensor:
        """3-step Euler on one block from its re-noised stage-1 latents (after the previous block's history
        pass, `settle`); this block's history pass is left for `settle`."""
        self.settle()
        _, _, frames, height, width = clean.shape
        start = self.next_frame - frames
        # the sink slides to sit just before the kept history, as in diffusers' loop
        sink_start = start - self.history_frames - self.sink_frames
        self.cache.sink_pe = self._rope(sink_start, self.sink_frames, height, width)
        rope = self._rope(start, frames, height, width)

        sigma_max = self.sigmas[0]
        noise = self._noise(clean.shape)
        latents = ((1.0 - sigma_max) * clean.float() + sigma_max * noise.float()).to(self.dtype)
        config = self.transformer.config
        for sigma, sigma_next in zip(self.sigmas[:-1], self.sigmas[1:]):
            velocity = self._forward(latents, sigma, rope, "inject")
            tokens = _pack_latents(latents, patch_size=config.patch_size, patch_size_t=config.patch_size_t)
            denoised = _unpack_latents((tokens.float() - velocity.float() * sigma).to(self.dtype), num_frames=frames,
                                       height=height, width=width, patch_size=config.patch_size,
                                       patch_size_t=config.patch_size_t)
            if sigma <= 1.0e-6:
                latents = denoised
            else:  # the scheduler's Euler step on the velocity implied by the x0 prediction
                flow = (latents.float() - denoised.float()) / sigma
                latents = (latents.float() + (sigma_next - sigma) * flow).to(self.dtype)

        self.unsettled = (latents, rope)
        self.blocks_done += 1
        return latents

    def _noise(self, shape) -> torch.Tensor:
        """`randn_tensor(shape, generator, device, dtype)`, the same numbers; a CPU generator's draw for a GPU
        goes to it without making the host wait for the GPU's queue (`to_device`)."""
        cpu_draw = self.generator is not None and self.generator.device.type == "cpu" and self.device.type == "cuda"
        if not cpu_draw:
            return randn_tensor(shape, generator=self.generator, device=self.device, dtype=self.dtype)
        return to_device(torch.randn(shape, generator=self.generator, dtype=self.dtype), self.device)

    def _append_history(self, frames: int) -> None:
        """Append the block's post-RoPE K/V to every layer's history; keep the last `max_history` frames."""
        if isinstance(self.cache, WindowKVCache):
            for layer in self.cache.layer_caches:
                layer.commit(frames)
            return
        trims = 0 < self.max_history < self.history_frames + frames
        for layer in self.cache.layer_caches:
            key, value = layer.get_captured_post_rope()
            history = layer.get_history()
            keep = self.max_history * (key.shape[1] // frames) if trims else None
            if history is not None:
                old_key, old_value = history
                if keep is not None:  # drop what the trim would drop before concatenating: no oversize copy
                    drop = max(0, old_key.shape[1] + key.shape[1] - keep)
                    old_key, old_value = old_key[:, drop:], old_value[:, drop:]
                key, value = torch.cat([old_key, key], dim=1), torch.cat([old_value, value], dim=1)
            if keep is not None:
                key, value = key[:, -keep:], value[:, -keep:]
            layer.store_history(key, value)


def park_prompt_projections(transformer) -> None:
    """Send the weights of the refiner's prompt-only projections (`_TextMemo`'s) to CPU memory where they lie
    on a GPU (`camrender.model.parking`). Idempotent; the stream does it too, a loader does it first so that
    the copy to page-locked memory is part of loading, not of the first render."""
    _TextMemo(transformer).park()


class _TransformerCall:
    """The refiner transformer on one block under the prompt memo and camrender's SDPA backends."""

    def __init__(self, transformer, text_memo, device):
        self.transformer, self.text_memo, self.device = transformer, text_memo, device

    def __call__(self, tokens, timestep, rope, embeds, mask, cache, mode) -> torch.Tensor:
        with self.text_memo, _attention_backends(self.device):
            return self.transformer(hidden_states=tokens, encoder_hidden_states=embeds, timestep=timestep,
                                    video_rotary_emb=rope, encoder_attention_mask=mask,
                                    kv_cache=cache, kv_cache_mode=mode, return_dict=False)[0]


def _attention_backends(device):
    """On CUDA, SDPA under camrender's backend priority (cuDNN attention first: at head dim 128 it is
    faster than flash on the H200, see `camrender.model.stage1.softmax_attention.SDPA_BACKENDS`)."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()

    return sdpa_kernel([getattr(SDPBackend, name) for name in SDPA_BACKENDS], set_priority=True)


class _TextMemo:
    """While active, the modules that see only the prompt (the caption projection and every cross-attention's
    key and value projections and key RMSNorm) return their previous output when called again on the same,
    unmodified input: the prompt is fixed for a render, so its keys and values are computed once instead of
    on every forward (about 3.7% of the refiner's FLOPs at the release shape). Outside their first calls
    those modules' weights wait in CPU memory (`camrender.model.parking`: 3.0 GiB of the bf16 refiner).

    An input is "the same" when it has the same storage, layout and version counter as the one remembered;
    the memo holds a reference to that input, so its memory cannot be reused meanwhile. The key projection's
    output is only ever its RMSNorm's input: the memo runs the two together, remembers only the normed keys
    (0.375 GiB less at the release shape), and the norm passes those through. The modules' own forwards
    compute every value (nothing is re-implemented); the patch is removed on exit, so the transformer is
    untouched outside the refiner's calls.
    """

    def __init__(self, transformer):
        self.transformer = transformer
        self.modules = [transformer.caption_projection]  # remembered on their own
        self.modules += [block.attn2.to_v for block in transformer.transformer_blocks]
        self.keys = [(block.attn2.to_k, block.attn2.norm_k) for block in transformer.transformer_blocks]
        self.remembered = {}  # id(module) -> (input, its key, output)

    def park(self) -> None:
        """Send the weights of the memo's projections to CPU memory while they are not running (their
        first call in a render brings them back for that call); not under group offloading, which places them."""
        if not is_layer_streamed(self.transformer):
            park_all(self.modules + [key for key, _ in self.keys])

    @staticmethod
    def _key(tensor):
        return (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor._version)

    def _call(self, module, forward, tensor, norm=None):
        """module(tensor) remembered; a key projection's (norm: its RMSNorm's forward) normed at once."""
        hit = self.remembered.get(id(module))
        if hit is not None and hit[1] == self._key(tensor):
            return hit[2]
        output = forward(tensor) if norm is None else norm(forward(tensor))
        self.remembered[id(module)] = (tensor, self._key(tensor), output)
        return output

    def _norm(self, key, forward, tensor):
        """A key RMSNorm: the keys its projection `key` has just handed over are normed already."""
        hit = self.remembered.get(id(key))
        return tensor if hit is not None and hit[2] is tensor else forward(tensor)

    def _patched(self) -> list:
        return self.modules + [module for pair in self.keys for module in pair]

    def __enter__(self):
        self.saved = [module.__dict__.get("forward") for module in self._patched()]  # e.g. an offload hook's
        for module in self.modules:
            module.forward = functools.partial(self._call, module, module.forward)
        for key, norm in self.keys:
            key.forward = functools.partial(self._call, key, key.forward, norm=norm.forward)
            norm.forward = functools.partial(self._norm, key, norm.forward)
        return self

    def __exit__(self, *exc):
        for module, saved in zip(self._patched(), self.saved):
            if saved is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = saved
