"""The one model step every sampler takes: `Denoiser`.

A sampler (the full-clip one in `camrender.render.full`, self-forcing in `camrender.render.segments`,
the chunk-causal teacher's in `camrender.render.chunk_causal`) decides which latent frames to denoise
at which timesteps and how to step them; the `Denoiser` runs the model on them: camrender's
transformer-level forward (`camrender.model.stage1.segments.segment_forward`) on the call's conditioning
(`condition`), the guidance rows (both in one batch, or one per GPU of a video group and gathered,
`camrender.parallel.cfg`), classifier-free guidance, CUDA-graph replay of the denoising passes and of the
steady-state cache passes, the render's text keys computed once (`prepared_text`), the call's Plucker
projections computed once for its passes (`SegmentOptions.plucker_once`), and an offloaded model brought to
the GPU before each call. Frame-0 pinning is `pinned_frames` /
`pin`: the image latent stays clean at timestep 0.

Shapes: latents (1, C, t, h, w) of the call's latent frames, frame timesteps (t,) float32 in
[0, 1000]; predictions (1, C, t, h, w) (the flow prediction, guidance mixed). No autograd.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from camrender.model.graphs import GraphedForward, storage_layout
from camrender.model.stage1.block import park_text_projections, prepared_text
from camrender.model.stage1.segments import (SegmentCache, SegmentConditioning, plucker_projections,
                                             prepare_conditioning, segment_forward)
from camrender.model.stage1.state import SegmentOptions


def bring_to_device(module) -> None:
    """With model CPU offload, run the module's offload hook (as its forward would) so it sits on the GPU:
    camrender's forward calls the submodules, never the module whose hook waits for a call."""
    hook = getattr(module, "_hf_hook", None)
    if hook is not None and hasattr(hook, "pre_forward"):
        hook.pre_forward(module)


class Denoiser:
    """The model step of one render.

    Args:
        model: the patched `SanaWMTransformer3DModel`.
        inputs: the render's `camrender.render.inputs.RenderInputs` (text rows [negative, prompt] under
            guidance; `inputs.camera(start, stop)` gives the cameras of a call).
        options: the `SegmentOptions` the forward computes with (`FULL_MODE` for the full clip).
        device: where the model runs.
        split: a `camrender.parallel.cfg.CfgSplit` (this rank runs one guidance row; gathered) or None.
        cuda_graphs: replay the denoising passes as CUDA graphs, and the cache-writing ones once they write
            the cache in place (`_cache_pass`); ignored under model CPU offload (the weights move). Off CUDA
            the replay runs on static copies.
        upcast: mix the guidance in float32 (the streaming samplers, as the official streaming code);
            False: in the model's dtype (the full clip, as diffusers' pipeline).
    """

    def __init__(self, model, inputs, options: SegmentOptions, device, *, split=None, cuda_graphs: bool = False,
                 upcast: bool = True):
        self.model, self.inputs, self.options, self.device = model, inputs, options, torch.device(device)
        self.split = split
        self.rows = split.rows if split is not None else (lambda batch_tensor: batch_tensor)
        self.text, self.text_mask = self.rows(inputs.text), self.rows(inputs.text_mask)
        self.batch = self.text.shape[0]  # rows this rank runs
        self.guided = inputs.text.shape[0] == 2
        self.upcast = upcast
        self.offloaded = getattr(model, "_hf_hook", None) is not None
        # A partial over the model and options, not a bound method: the graphs must not refer back to the
        # denoiser, or the two form a reference cycle and the graphs' static copies (and captured memory)
        # outlive the render until the garbage collector happens to run.
        self._forward = functools.partial(_model_forward, model, options)
        self.text_keys = None  # each block's cross-attention keys of the text (`prepared_text`), at the first call
        # with options.plucker_once: each block's Plucker projection of the latest `condition` call's frames
        # (`plucker_projections`), kept in the same tensors from call to call while their shape holds
        self.projected_plucker, self._projected_for = None, None
        self.graphs = self.write_graphs = None
        self._in_place_writes = set()  # storage layouts of caches a cache pass wrote in place
        if cuda_graphs and not self.offloaded:
            capture = self.device.type == "cuda"
            # the cache (argument 3) is read in place, not copied: the cache pass writes it in place; the text
            # keys (argument 4) are the render's and the Plucker projections (argument 5) the denoiser's, read in
            # place too. Only the first layout warms up eagerly: segment mode's next ones (segments 1 and 2, whose
            # softmax context grows, and a longer last segment) capture at once.
            self.graphs = GraphedForward(self._forward, capture=capture, resident=(3, 4, 5),
                                         capture_new_layouts=True)
            # the cache passes replay between the denoising passes: either graph captures into the other's pool
            self.write_graphs = GraphedForward(functools.partial(_model_forward, model, options, write=True),
                                               capture=capture, resident=(3, 4, 5), share_pool_with=self.graphs)
            self.graphs.share_pool_with = self.write_graphs

    @torch.no_grad()
    def condition(self, start: int, stop: int) -> SegmentConditioning:
        """The conditioning of latent frames [start, stop), fixed over their denoising steps: RoPE rows,
        ray tables and embedded text / Plucker maps (`prepare_conditioning`). Pulls a camera stream. The first
        call also computes the text keys of every block (`prepared_text`): under the head split their norm is
        a collective, so every rank of a video group makes its first call at the same point. With
        `SegmentOptions.plucker_once` it projects the Plucker maps for every block too, for the passes on this
        conditioning until the next call (passes on an earlier one project them in every block)."""
        bring_to_device(self.model)
        camera, plucker = self.inputs.camera(start, stop)
        p_t, p_h, p_w = self.model.patch_size
        noise = self.inputs.noise
        grid = ((stop - start) // p_t, noise.shape[3] // p_h, noise.shape[4] // p_w)
        conditioning = prepare_conditioning(self.model, grid, self.text, self.text_mask,
                                            camera_conditions=None if camera is None else self.rows(camera),
                                            chunk_plucker=plucker, frame_start=start)
        if self.text_keys is None:  # the text is the render's: its keys are computed once
            self.text_keys = prepared_text(self.model, conditioning.text, conditioning.text_mask)
            if not self.offloaded:  # CPU offload moves the whole model itself
                park_text_projections(self.model, self.device)
        if self.options.plucker_once and not self.offloaded:  # under CPU offload, memory comes first
            self.projected_plucker = plucker_projections(self.model, conditioning.plucker, out=self.projected_plucker)
            self._projected_for = conditioning
        return conditioning

    @torch.no_grad()
    def predict(self, latents: torch.Tensor, frame_timesteps: torch.Tensor, conditioning: SegmentConditioning, *,
                cache: Optional[SegmentCache] = None, segments: Optional[Sequence[tuple]] = None,
                write: bool = False) -> torch.Tensor:
        """The guided flow prediction (1, C, t, h, w) for latents (1, C, t, h, w) at frame timesteps (t,).

        cache: the render's `SegmentCache` (read; written with `write`, the timestep-0 pass of a finished
        segment); segments: the call's (start, stop) ranges relative to it (several chunks in flight).
        """
        if self.offloaded:
            bring_to_device(self.model)
        x = latents.expand(self.batch, -1, -1, -1, -1)
        timestep = frame_timesteps.to(self.device).view(1, 1, -1).expand(self.batch, 1, -1)
        keys = self.text_keys
        projected = self.projected_plucker if self._projected_for is conditioning else None
        if self.graphs is not None and not write and segments is None:
            prediction = self.graphs(x, timestep, conditioning, cache, keys, projected)
        elif self.write_graphs is not None and write and segments is None:
            prediction = self._cache_pass(x, timestep, conditioning, cache, projected)
        else:
            prediction = self._forward(x, timestep, conditioning, cache, keys, projected, segments, write)
        if self.split is not None:
            prediction = self.split.gather(prediction)
        if self.upcast:
            prediction = prediction.float()
        if self.guided:
            uncond, cond = prediction.chunk(2)
            prediction = uncond + self.inputs.guidance * (cond - uncond)
        return prediction

    def _cache_pass(self, x, timestep, conditioning, cache, projected) -> torch.Tensor:
        """The cache-writing forward, replayed as a CUDA graph once a cache pass on a cache of this storage
        layout, on a call of these shapes, has written it in place (the steady state: a graph only replays
        in-place writes); eager until then. A replay runs no Python, so the cache's next frame is set here."""
        # whether a write is in place depends on the cache and on the call's shapes (its tokens against the slot)
        shapes = storage_layout((x, timestep, conditioning, self.text_keys, projected), addresses=False)
        layout = storage_layout(cache)
        if (shapes, layout) in self._in_place_writes:
            prediction = self.write_graphs(x, timestep, conditioning, cache, self.text_keys, projected)
            cache.next_frame = conditioning.frame_start + conditioning.num_frames
            return prediction
        prediction = self._forward(x, timestep, conditioning, cache, self.text_keys, projected, segments=None,
                                   write=True)
        if storage_layout(cache) == layout:
            self._in_place_writes.add((shapes, layout))
            # this pass warmed the kernels for the next one: the write graph captures at its first call
            self.write_graphs.warmed(x, timestep, conditioning, cache, self.text_keys, projected)
        return prediction


def _model_forward(model, options, x, timestep, conditioning, cache, text_keys=None, projected=None, segments=None,
                   write=False):
    """One unguided forward of the model on prepared conditioning, text keys and Plucker projections
    (`segment_forward`)."""
    return segment_forward(model, x, timestep, frame_start=conditioning.frame_start, cache=cache,
                           write_cache=write, segments=segments, options=options, conditioning=conditioning,
                           text_keys=text_keys, projected_plucker=projected)


def pinned_frames(inputs, start: int, stop: int, device) -> torch.Tensor:
    """Bool (stop - start,): the frames of [start, stop) held clean at timestep 0 (latent frame 0, the
    encoded first image, when there is one)."""
    pinned = torch.zeros(stop - start, dtype=torch.bool, device=device)
    if start == 0 and inputs.first_latent is not None:
        pinned[0] = True
    return pinned


def pin(pinned: torch.Tensor, timestep) -> torch.Tensor:
    """(t,) float32 frame timesteps: `timestep` everywhere, 0 on the pinned frames. torch.where, not
    boolean indexing: indexing would wait for the GPU at every step."""
    return torch.where(pinned, 0.0, timestep if isinstance(timestep, torch.Tensor) else float(timestep))
