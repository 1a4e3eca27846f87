"""A render's inputs, built once per render for both modes: the first frame and its latent, the prompt
embeddings, the cameras (a feed the segment loop pulls, `camrender.render.camera_feed`) and the initial
noise (`prepare_inputs`).

PIL, torch and diffusers are imported inside the functions: the CLI's checks read `open_image` before
any model loads, and a bad image must fail in a fraction of a second, not after importing diffusers."""
from __future__ import annotations

import contextlib
import os
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from camrender.errors import CamrenderError
from camrender.files import open_regular
from camrender.limits import check_latent_frames
from camrender.render.prompt_cache import cached_pair, stage_one_key
from camrender.render.request import MAX_SEQUENCE_LENGTH, RenderRequest, latent_shape
from camrender.vocabulary import TINY

def open_image(image):
    """The first-frame image as an RGB PIL image; `image` is a path or a PIL image.

    Raises CamrenderError (naming the file, field "image") when it is missing or unreadable.
    """
    # lazy: keeps `camrender --help` free of PIL
    import PIL.Image

    if isinstance(image, PIL.Image.Image):
        return image.convert("RGB")
    path = Path(image)
    if not path.exists():
        raise CamrenderError("first-frame image not found", path=path, field="image")
    if path.is_dir():
        raise CamrenderError("first-frame image is a directory", path=path, field="image")
    open_regular(path, "first-frame image").close()  # a FIFO or a device: refused before PIL waits on it
    try:
        with PIL.Image.open(path) as handle:
            handle.load()
            return handle.convert("RGB")
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as error:
        raise CamrenderError(f"cannot read the image ({error})", path=path, field="image") from None


def image_size_of(path) -> tuple:
    """(width, height) of an image file (its header only); CamrenderError naming it otherwise."""
    # lazy: keeps `camrender --help` free of PIL
    import PIL.Image

    if not os.path.isfile(path):
        raise CamrenderError("first-frame image not found" if not os.path.exists(path) else "is not a file",
                             path=os.fspath(path), field="image")
    try:
        with PIL.Image.open(path) as handle:
            return handle.size
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as error:
        raise CamrenderError(f"cannot read the image ({error})", path=os.fspath(path), field="image") from None


def first_frame_pixels(image, height: int, width: int):
    """Resize (aspect kept, cover) and center-crop to height x width; (1, 3, H, W) float32 in [-1, 1].

    The same resize+crop rule maps the trajectory's intrinsics (`camrender.render.camera`).
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch
    from diffusers.pipelines.sana_wm.cam_utils import resize_and_center_crop

    cropped = resize_and_center_crop(open_image(image), height, width)[0]
    pixels = torch.from_numpy(np.asarray(cropped, dtype=np.float32) / 255.0)
    return (pixels.permute(2, 0, 1)[None] * 2.0 - 1.0).contiguous()



def neutral_first_frame(height: int, width: int):
    """Mid-gray (1, 3, H, W) frame: the stand-in first frame of the tiny offline model."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    return torch.zeros(1, 3, height, width)



def request_first_frame(request: RenderRequest):
    """The request's first frame as (1, 3, H, W) float32 in [-1, 1]: its image, or (tiny model only)
    a mid-gray frame. Raises CamrenderError when a real model has no image."""
    if request.image is not None:
        return first_frame_pixels(request.image, request.height, request.width)
    if request.settings.model == TINY:
        return neutral_first_frame(request.height, request.width)
    raise CamrenderError("SANA-WM needs a first-frame image: pass --image or set \"image\" in the trajectory",
                         field="image")



def encode_text(pipe, request: RenderRequest, device, guidance: bool):
    """Gemma-2 prompt embeddings as the released pipeline builds them (chi prefix, right padding),
    without the padding columns no row attends to (`drop_text_padding`).

    Returns (embeds (B, 1, L, D), mask (B, L)) with B = 2 ([negative, prompt]) under guidance, else 1.
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch
    from diffusers.pipelines.sana_wm.pipeline_sana_wm import DEFAULT_CHI_PROMPT

    if pipe.text_encoder is None:
        raise CamrenderError("the prompt is not in the prompt cache any more and the text encoder was not loaded: "
                             "render again", field="prompt-cache")
    with visiting(pipe.text_encoder, device, request.settings.offload):
        cond, cond_mask, neg, neg_mask = pipe.encode_prompt(
            request.prompt or "",
            request.negative_prompt or "",
            device=device,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            chi_prompt=DEFAULT_CHI_PROMPT,
        )
    if not guidance:
        return drop_text_padding(cond, cond_mask)
    return drop_text_padding(torch.cat([neg, cond]), torch.cat([neg_mask, cond_mask]))



@contextlib.contextmanager
def visiting(module, device, offload: bool):
    """`module` on `device` for the block and back where it lives after (the text encoder stays in CPU
    memory between renders: `camrender.render.pipeline`); nothing moves under model CPU offload."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    home = next(module.parameters()).device
    if offload or home == torch.device(device):
        yield module
        return
    module.to(device)
    try:
        yield module
    finally:
        module.to(home)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


def drop_text_padding(embeds, mask):
    """Drop the trailing token columns that every row masks out: embeds (B, 1, L, D) and mask (B, L)
    -> (B, 1, L', D), (B, L'), L' = 1 + the last column any row attends to (at least 1).

    The pipeline pads prompts to 300 tokens; text tokens reach the transformer only as the keys and
    values of its cross-attention (after per-token projections), where masked keys get zero weight,
    so the dropped columns change nothing but the time spent on them.
    """
    used = mask.bool().any(dim=0).nonzero()
    length = int(used.max()) + 1 if used.numel() else 1
    return embeds[:, :, :length].contiguous(), mask[:, :length].contiguous()



# Where the VAE's encoder waits between renders: it runs once per render (the first frame), the decoder
# runs on every chunk, so only the decoder stays on the GPU (LTX-2's encoder: about half the VAE's weights).
ENCODER_HOME = "cpu"


def encoder_modules(vae) -> list:
    """The VAE's modules only encoding uses (LTX-2: its `encoder`; `quant_conv` where a VAE has one)."""
    return [module for module in (getattr(vae, "encoder", None), getattr(vae, "quant_conv", None))
            if module is not None]


@contextlib.contextmanager
def encoding_on(vae, device, offload: bool = False, home=None):
    """The VAE's encoder on `device` for the block (moved there from its home if it waits elsewhere), then
    at `home` (default ENCODER_HOME) until the next encode; the decoder stays where it is. Nothing moves
    under model CPU offload (its hooks place the whole VAE) or when `device` is the home itself."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    home = torch.device(ENCODER_HOME if home is None else home)
    modules = [] if offload or torch.device(device) == home else encoder_modules(vae)
    for module in modules:
        module.to(device)
    try:
        yield vae
    finally:
        for module in modules:
            module.to(home)


def encode_first_frame(vae, pixels, device, dtype, offload: bool = False):
    """VAE posterior mode of the first frame, normalised: (1, C_lat, 1, h, w) in `dtype`. The encoder visits
    `device` for this call (`encoding_on`)."""
    with encoding_on(vae, device, offload):
        z = vae.encode(pixels[:, :, None].to(device, dtype=vae.dtype)).latent_dist.mode()
    mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(z)
    std = vae.latents_std.view(1, -1, 1, 1, 1).to(z)
    return ((z - mean) * vae.config.scaling_factor / std).to(dtype)



def camera_feed(pipe, request: RenderRequest, device, dtype, batch: int):
    """The render's `camrender.render.camera_feed.CameraFeed`: `request.cameras` (an iterable of
    `SegmentCamera`, pulled as the render needs them) or the segments of `request.traj`.

    Its `take(start, stop)` gives camera_conditions (B, t, 20) and chunk_plucker (1, 48, t, h, w) in
    `dtype`: the Plucker maps are the same for every batch row (guidance only changes the text), and
    the transformer broadcasts them, so its Plucker projections run once instead of once per row.
    """
    # lazy: keeps `camrender --help` free of torch
    from camrender.render.camera_feed import CameraFeed, SegmentCamera  # imports torch: see the module docstring

    t_stride, s_stride = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
    cameras = request.cameras
    if cameras is None:  # the whole path at hand: one item
        traj = request.traj
        cameras = [SegmentCamera(traj.c2w, traj.intrinsics, traj.width, traj.height)]
    return CameraFeed(cameras, num_frames=request.num_frames, height=request.height, width=request.width,
                      vae_stride=(t_stride, s_stride, s_stride), device=device, dtype=dtype, batch=batch)



def initial_latents(first_latent, num_latent_frames: int, height: int, width: int, seed: int, device, dtype,
                    drawn_frames=None):
    """Gaussian noise (1, C, T, h, w) drawn on the CPU from `seed` (repeatable across devices), frame 0 = image latent.

    drawn_frames: draw (1, C, drawn_frames, h, w) and keep the first T frames (None: T); the noise of a
    frame depends on the shape drawn, so a clip cut short keeps the longer clip's noise this way.
    """
    # lazy: keeps `camrender --help` free of torch
    import torch

    drawn = num_latent_frames if drawn_frames is None else check_latent_frames(int(drawn_frames), "noise_frames")
    if drawn < num_latent_frames:
        raise CamrenderError(f"the noise draw of {drawn} latent frames is shorter than the clip's {num_latent_frames}",
                             field="noise_frames")
    generator = torch.Generator("cpu").manual_seed(int(seed))
    shape = (1, first_latent.shape[1], drawn, height, width)
    latents = torch.randn(shape, generator=generator, dtype=dtype)[:, :, :num_latent_frames].contiguous().to(device)
    latents[:, :, :1] = first_latent
    return latents



@dataclasses.dataclass
class RenderInputs:
    """Conditioning and noise of one render (segment mode takes the camera tensors per segment).

    text (B, 1, L, D) and text_mask (B, L) with B = 2 ([negative, prompt]) under guidance, else 1;
    camera_conditions (B, T, 20) and chunk_plucker (1, 48, T, h, w) of the whole path, or None: with a
    `cameras` feed (`camrender.render.camera_feed.CameraFeed`) they come from it, as `camera` asks;
    first_latent (1, C, 1, h, w) normalised image latent or None; noise (1, C, T, h, w) on the CPU,
    frame 0 = first_latent (float32 in segment mode, the transformer's dtype in full mode).
    """

    text: Any
    text_mask: Any
    camera_conditions: Any
    chunk_plucker: Any
    first_latent: Any
    noise: Any
    guidance: float = 1.0
    cameras: Any = None

    def camera(self, start: int, stop: int) -> tuple:
        """(camera_conditions (B, t, 20), chunk_plucker (1, 48, t, h, w)) of latent frames [start, stop),
        either None without a camera: taken from the feed (pulling the stream) or sliced from the tensors."""
        if self.cameras is not None:
            return self.cameras.take(start, stop)
        camera, plucker = self.camera_conditions, self.chunk_plucker
        return (None if camera is None else camera[:, start:stop],
                None if plucker is None else plucker[:, :, start:stop])



def prepare_inputs(pipe, request: RenderRequest, device) -> RenderInputs:
    """Text, first-image latent, cameras and noise of `request`, for both modes: full mode takes the
    whole path's camera tensors now; segment mode keeps the feed and takes them segment by segment."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    dtype = pipe.transformer.dtype
    guidance = request.guidance is not None and request.guidance > 1.0
    pixels = request_first_frame(request)
    with torch.no_grad():
        text, text_mask = cached_pair(request, stage_one_key(request, guidance),
                                      lambda: encode_text(pipe, request, device, guidance), device)
        first = encode_first_frame(pipe.vae, pixels, device, dtype, offload=request.settings.offload)
    frames, h, w = latent_shape(pipe, request)
    cameras = camera_feed(pipe, request, device, dtype, 2 if guidance else 1)
    camera = plucker = None
    if request.mode != "segments":
        camera, plucker = cameras.take(0, frames)
        cameras = None
    # segment mode draws and keeps its latents in float32, as the official streaming sampler does
    noise_dtype = torch.float32 if request.mode == "segments" else dtype
    noise = initial_latents(first.cpu(), frames, h, w, request.seed, "cpu", noise_dtype,
                            drawn_frames=request.noise_frames)
    return RenderInputs(text=text, text_mask=text_mask, camera_conditions=camera, chunk_plucker=plucker,
                        first_latent=first, noise=noise, guidance=float(request.guidance or 1.0), cameras=cameras)

