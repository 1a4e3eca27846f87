"""Streaming causal decode with the LTX-2 video VAE: latent frames in, video frames out, chunk by chunk.

In a causal decode (`vae.decode(z, causal=True)`) every temporal convolution pads on the left
by repeating the first frame, and every temporal upsampler drops the first `stride - 1` frames
it produces. The decoder has no other coupling across time (its norms are per position), so a
decode can be split anywhere: each causal conv keeps its last `k - 1` input frames as the left
context of the next chunk, and the upsamplers drop frames on the first chunk only. The frames
of `CausalStreamDecoder` therefore equal those of a whole-clip causal decode, while each chunk
costs only its own frames (latent frame 0 gives 1 video frame, every later one
`temporal_compression_ratio`).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_ltx2 import (LTX2VideoCausalConv3d, LTX2VideoResnetBlock3d,
                                                               LTX2VideoUpsampler3d, PerChannelRMSNorm)

from camrender.kernels.bias_residual import bias_residual
from camrender.kernels.rms_silu import rms_silu

# Latent frames per VAE call of segment mode's streaming decode with a refiner. The decode's workspace grows
# with the frames of a call (the decoder's last stages hold several full-resolution activations of 8 video
# frames per latent frame): one latent frame per call bounds it where memory is short, beside the refiner,
# at the cost of 3x as many (3x smaller) calls per segment. Without a refiner a segment goes in one call
# (at the release shape 1.3 GiB more and 5 % more video fps on an H200:
# bench/results/2026-12-01_segments_decode_whole_segment_h200.json).
REFINED_DECODE_MAX_FRAMES = 1
# `CausalStreamDecoder(channels_last=None)` on CUDA: the decoder's convs on channels-last activations
CHANNELS_LAST_ON_CUDA = True

__all__ = ["CausalStreamDecoder", "decode_max_frames", "REFINED_DECODE_MAX_FRAMES", "video_frames_for_latents", "to_uint8_frames", "to_uint8_frames_async",
           "decode_latents", "denormalize_latents"]


def decode_max_frames(refined: bool) -> Optional[int]:
    """`CausalStreamDecoder`'s max_frames in segment mode: `REFINED_DECODE_MAX_FRAMES` with a refiner, else
    None (a segment per VAE call)."""
    return REFINED_DECODE_MAX_FRAMES if refined else None


def denormalize_latents(vae, latents):
    """Undo `encode_first_frame`'s normalisation: DiT-space latents -> the VAE's latent space."""
    mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents)
    std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents)
    return latents / vae.config.scaling_factor * std + mean



def decode_latents(vae, latents):
    """Latents (1, C_lat, T, h, w) -> decoded video (1, 3, F, H, W) in [-1, 1], on the VAE's device."""
    return vae.decode(denormalize_latents(vae, latents.to(dtype=vae.dtype)), return_dict=False)[0]


def video_frames_for_latents(start: int, stop: int, temporal_ratio: int = 8) -> int:
    """Video frames a causal decode produces for latent frames [start, stop) of a clip."""
    return (stop - start) * temporal_ratio - (temporal_ratio - 1 if start == 0 else 0)


def to_uint8_frames(video: torch.Tensor):
    """(B=1, 3, F, H, W) decoded video in [-1, 1] -> numpy uint8 (F, H, W, 3)."""
    frames, ready = to_uint8_frames_async(video)
    if ready is not None:
        ready.synchronize()
    return frames.numpy()


def to_uint8_frames_async(video: torch.Tensor):
    """`to_uint8_frames` without waiting: (uint8 (F, H, W, 3) host tensor, CUDA event or None). On CUDA the
    copy into the host tensor is queued on the current stream; read it after `event.synchronize()`."""
    frames = (video[0].float() / 2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8)
    # Transpose on the device (a strided copy would leave the transpose to numpy) and copy into
    # page-locked memory (several times the bandwidth of a pageable copy; torch caches the buffers).
    frames = frames.permute(1, 2, 3, 0).contiguous()
    if not frames.is_cuda:
        return frames, None
    host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
    host.copy_(frames, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(frames.device))
    return host, ready


def reflect_borders(padded: torch.Tensor, pad_h: int, pad_w: int) -> torch.Tensor:
    """Fill the border of padded (B, C, T, H + 2 pad_h, W + 2 pad_w), in place, with the reflection of its
    interior (what `F.pad(mode="reflect")` would put there); returns it."""
    height, width = padded.shape[3] - 2 * pad_h, padded.shape[4] - 2 * pad_w
    columns = slice(pad_w, pad_w + width)
    for i in range(1, pad_h + 1):  # rows first (inside the interior columns), then whole columns
        padded[:, :, :, pad_h - i, columns] = padded[:, :, :, pad_h + i, columns]
        padded[:, :, :, pad_h + height - 1 + i, columns] = padded[:, :, :, pad_h + height - 1 - i, columns]
    for j in range(1, pad_w + 1):
        padded[..., pad_w - j] = padded[..., pad_w + j]
        padded[..., pad_w + width - 1 + j] = padded[..., pad_w + width - 1 - j]
    return padded


class CausalStreamDecoder:
    """Decode consecutive latent chunks of one clip; the concatenated frames equal the whole-clip
    causal decode of the concatenated latents.

    Latents are in the DiT's normalised space (as the SANA-WM pipeline produces them); the
    normalisation is undone before decoding.

    Args:
        vae: `AutoencoderKLLTX2Video`.
        device: where the decoder runs (the pipeline's execution device under model CPU offload,
            where the VAE's parameters are in CPU memory between calls); default: where the VAE's decoder
            is (not `vae.device`, which reads the encoder's, in CPU memory once a render has encoded its
            first frame, `camrender.render.inputs.encoding_on`).
        max_frames: decode at most this many latent frames per VAE call (a chunk goes in pieces; the
            frames are the same): bounds the decode's workspace, which grows with the frames of a call
            (None: a chunk per call).
        channels_last: run the decoder's convolutions on channels-last (N, T, H, W, C) activations, its
            conv kernels laid out channels-last once here (the same parameter objects and values). cuDNN's
            3-d convs are channels-last kernels: on NCDHW activations each conv transposes its input and
            output. None: `CHANNELS_LAST_ON_CUDA` where the decoder runs on CUDA, else off. Channels-last
            also fuses each RMS norm over channels with the SiLU after it (`kernels.rms_silu`: one pass in
            place of six, rounded where stock rounds); in the resnets the norm writes into its conv's padded
            input and takes the conv bias before it, and the residual add takes the last conv's bias.
    """

    def __init__(self, vae, *, device=None, max_frames=None, channels_last: Optional[bool] = None):
        self.vae = vae
        self.device = device
        self.max_frames = max_frames
        decoder = vae.decoder
        if channels_last is None:
            channels_last = CHANNELS_LAST_ON_CUDA and self._device().type == "cuda"
        self.memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
        if channels_last:
            for conv in decoder.modules():
                if isinstance(conv, torch.nn.Conv3d) and not conv.weight.is_contiguous(
                        memory_format=torch.channels_last_3d):
                    conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last_3d)
        self._convs = [m for m in decoder.modules() if isinstance(m, LTX2VideoCausalConv3d)]
        self._upsamplers = [m for m in decoder.modules() if isinstance(m, LTX2VideoUpsampler3d)]
        # resnets whose norm -> SiLU pairs can run fused: no timestep conditioning or noise injection between
        self._fusable = [m for m in decoder.modules() if isinstance(m, LTX2VideoResnetBlock3d) and channels_last
                         and m.scale_shift_table is None and m.per_channel_scale1 is None
                         and m.per_channel_scale2 is None and isinstance(m.nonlinearity, torch.nn.SiLU)]
        self._fuse_head = (channels_last and getattr(decoder, "time_embedder", None) is None
                           and isinstance(getattr(decoder, "norm_out", None), PerChannelRMSNorm)
                           and isinstance(getattr(decoder, "conv_act", None), torch.nn.SiLU))
        for conv in self._convs:
            if conv.conv.stride[0] != 1 or conv.conv.dilation[0] != 1:
                raise NotImplementedError("streaming decode needs temporal stride and dilation 1")
        # id(conv) -> its last k - 1 input frames, as whole frames of its padded input: with the reflected border
        # (`_border`), a channels-last tail is one contiguous block, copied out and back at the memory's pace
        self._tails: dict[int, torch.Tensor] = {}
        self.latent_frames = 0  # latent frames decoded so far

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode the next chunk of latents (1, C, t, h, w) -> video (1, 3, F, H, W) in [-1, 1],
        F = 1 + 8 (t - 1) for the first chunk and 8 t after it (for 8x temporal compression)."""
        if latents.shape[0] != 1:
            raise ValueError("streaming decode works on one video at a time (batch 1)")
        if self.max_frames is not None and latents.shape[2] > self.max_frames:
            return torch.cat([self.decode(latents[:, :, start:start + self.max_frames])
                              for start in range(0, latents.shape[2], self.max_frames)], dim=2)

        vae = self.vae
        z = denormalize_latents(vae, latents.to(device=self._device(), dtype=vae.dtype))
        with self._streaming():
            video = vae.decode(z, causal=True, return_dict=False)[0]
        self.latent_frames += latents.shape[2]
        return video

    def state(self) -> dict:
        """What the next chunk depends on: {"latent_frames": int, "tails": per causal conv (in module
        order) its last k - 1 input frames (1, C, k - 1, h, w), or None before the first chunk}."""
        return {"latent_frames": self.latent_frames, "tails": [_interior(self._tails.get(id(conv)), conv)
                                                               for conv in self._convs]}

    def load_state(self, state: dict) -> None:
        """Continue from `state()` of a decoder over the same VAE (e.g. after a resume)."""
        tails = state["tails"]
        if len(tails) != len(self._convs):
            raise ValueError(f"decoder state has {len(tails)} convolution tails, this VAE {len(self._convs)}")
        device = self._device()
        self._tails = {id(conv): self._bordered(tail.to(device), conv) for conv, tail in zip(self._convs, tails)
                       if tail is not None}
        self.latent_frames = int(state["latent_frames"])

    def _bordered(self, tail: torch.Tensor, conv) -> torch.Tensor:
        """A tail of `state()` (frames alone) as the decoder keeps it: in a zero border of `conv`'s input's padding
        (a streamed call reflects the border anew once the tail is in place) and the decoder's memory format."""
        pad_h, pad_w = _border(conv)
        return F.pad(tail, (pad_w, pad_w, pad_h, pad_h)).contiguous(memory_format=self.memory_format)

    def _device(self) -> torch.device:
        return torch.device(self.device) if self.device is not None else next(self.vae.decoder.parameters()).device

    @contextlib.contextmanager
    def _streaming(self):
        """Route the decoder's temporal convs and upsamplers through the chunk-aware forwards (and its
        resnets through the fused norms, channels-last) and turn off tiling / slicing (they would split the
        clip in ways the caches do not follow)."""
        vae = self.vae
        flags = {name: getattr(vae, name) for name in ("use_tiling", "use_framewise_decoding", "use_slicing")
                 if hasattr(vae, name)}
        first = self.latent_frames == 0
        head = [vae.decoder.norm_out, vae.decoder.conv_act] if self._fuse_head else []
        fused = [m for m in self._fusable if not (m.dropout.training and m.dropout.p)]  # no dropout between
        try:
            for name in flags:
                setattr(vae, name, False)
            for conv in self._convs:
                conv.forward = functools.partial(self._conv_forward, conv)
            for upsampler in self._upsamplers:
                upsampler.forward = functools.partial(self._upsampler_forward, upsampler, first)
            for resnet in fused:
                resnet.forward = functools.partial(self._resnet_forward, resnet)
            if head:  # the decoder's last norm -> SiLU: the norm's call does both, the SiLU's passes through
                head[0].forward = functools.partial(_rms_silu_forward, head[0])
                head[1].forward = _pass_through
            yield
        finally:
            for module in self._convs + self._upsamplers + fused + head:
                module.__dict__.pop("forward", None)
            for name, value in flags.items():
                setattr(vae, name, value)

    def _conv_forward(self, conv, hidden_states: torch.Tensor, causal: bool = True) -> torch.Tensor:
        """`LTX2VideoCausalConv3d.forward` (causal) with the previous chunk's frames as left padding."""
        if not causal:
            raise ValueError("streaming decode is causal only")
        return self._causal_conv(conv, hidden_states, lambda frames: frames.copy_(hidden_states), conv.conv.bias)

    def _causal_conv(self, conv, x: torch.Tensor, write, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """conv over a chunk of x's shape (B, C, t, H, W), streamed: its input is one new buffer (in the decoder's
        memory format) of the previous chunk's last k - 1 input frames (the first chunk's first frame repeated,
        as the whole-clip decode does), then the chunk's frames, which `write(view)` puts there, reflect-padded in
        place for a reflect-mode conv (no concatenation, no 3-d reflection-pad kernel). bias: the conv's own, or
        None where the caller adds it."""
        inner = conv.conv
        context = conv.kernel_size[0] - 1
        reflect = inner.padding_mode == "reflect"
        pad_h, pad_w = _border(conv)
        batch, channels, frames, height, width = x.shape
        padded = torch.empty(batch, channels, context + frames, height + 2 * pad_h, width + 2 * pad_w,
                             dtype=x.dtype, device=x.device, memory_format=self.memory_format)
        core = padded[:, :, :, pad_h:pad_h + height, pad_w:pad_w + width]
        write(core[:, :, context:])
        tail = self._tails.get(id(conv))
        if tail is None:
            core[:, :, :context] = core[:, :, context:context + 1]
        else:
            padded[:, :, :context] = tail
        if reflect:
            reflect_borders(padded, pad_h, pad_w)
        # a copy, not a view: a view would keep this call's whole input alive until the next chunk
        self._tails[id(conv)] = padded[:, :, padded.shape[2] - context:].clone(memory_format=self.memory_format)
        if reflect:
            return F.conv3d(padded, inner.weight, bias, inner.stride, 0, inner.dilation, inner.groups)
        return inner._conv_forward(padded, inner.weight, bias)  # its own spatial padding mode

    def _resnet_forward(self, resnet, inputs: torch.Tensor, temb=None, generator=None, causal: bool = True):
        """`LTX2VideoResnetBlock3d.forward` without timestep conditioning or noise (eval mode): each norm -> SiLU
        fused and written into its conv's padded input (`_norm_conv`); the convs run without their biases, which
        ride in the next norm and in the residual add (stock adds each in a pass of its own; the same roundings)."""
        if not causal:
            raise ValueError("streaming decode is causal only")
        conv1, conv2 = resnet.conv1, resnet.conv2
        hidden_states = self._norm_conv(conv1, resnet.norm1, inputs, None)
        hidden_states = self._norm_conv(conv2, resnet.norm2, hidden_states, conv1.conv.bias)
        if resnet.norm3 is not None:
            inputs = resnet.norm3(inputs.movedim(1, -1)).movedim(-1, 1)
        if resnet.conv_shortcut is not None:
            inputs = resnet.conv_shortcut(inputs)
        if conv2.conv.bias is None:
            return hidden_states.add_(inputs)
        return bias_residual(hidden_states, conv2.conv.bias, inputs)

    def _norm_conv(self, conv, norm: PerChannelRMSNorm, x: torch.Tensor, bias: Optional[torch.Tensor]):
        """conv(silu(norm(x + bias))) without the conv's own bias, streamed (`_causal_conv`): the fused norm writes
        straight into the conv's input buffer, where `_conv_forward` would copy its input."""
        if norm.channel_dim != 1:
            raise ValueError("the fused RMS norm + SiLU normalises over dim 1")
        return self._causal_conv(conv, x, lambda frames: rms_silu(x, norm.eps, bias=bias, out=frames), None)

    def _upsampler_forward(self, upsampler, first: bool, hidden_states: torch.Tensor, causal: bool = True):
        """`LTX2VideoUpsampler3d.forward` that drops its leading `stride_t - 1` frames on the first chunk only."""
        batch, _, frames, height, width = hidden_states.shape
        stride_t, stride_h, stride_w = upsampler.stride
        drop = stride_t - 1 if first else 0

        def depth_to_space(x):
            """(B, C s_t s_h s_w, T, H, W) -> (B, C, T s_t - drop, H s_h, W s_w) in the decoder's memory format."""
            x = x.unflatten(1, (-1, stride_t, stride_h, stride_w)).permute(0, 1, 5, 2, 6, 3, 7, 4)
            out = torch.empty(batch, x.shape[1], frames * stride_t, height * stride_h, width * stride_w,
                              dtype=x.dtype, device=x.device, memory_format=self.memory_format)
            # one copy, into the result seen as (B, C, T, s_t, H, s_h, W, s_w)
            out.unflatten(4, (width, stride_w)).unflatten(3, (height, stride_h)).unflatten(2, (frames, stride_t)).copy_(x)
            return out[:, :, drop:]

        out = depth_to_space(upsampler.conv(hidden_states, causal=causal))
        if upsampler.residual:
            # the input's depth-to-space repeated along channels, added without materialising the repeat
            repeats = (stride_t * stride_h * stride_w) // upsampler.upscale_factor
            out.unflatten(1, (repeats, -1)).add_(depth_to_space(hidden_states).unsqueeze(1))
        return out


def _border(conv) -> tuple:
    """(rows, columns) of reflected border around a frame of `conv`'s streamed input: its spatial padding for a
    reflect-mode conv; none otherwise (the conv pads itself)."""
    return tuple(conv.conv.padding[1:]) if conv.conv.padding_mode == "reflect" else (0, 0)


def _interior(tail: Optional[torch.Tensor], conv) -> Optional[torch.Tensor]:
    """A conv's tail as `state()` gives it, (1, C, k - 1, h, w): the decoder's, without the border (`_border`)."""
    pad_h, pad_w = _border(conv)
    if tail is None or (pad_h == 0 and pad_w == 0):
        return tail
    return tail[:, :, :, pad_h:tail.shape[3] - pad_h, pad_w:tail.shape[4] - pad_w].clone()  # in tail's layout


def _rms_silu_forward(norm: PerChannelRMSNorm, x: torch.Tensor, channel_dim=None) -> torch.Tensor:
    """`norm(x)` followed by SiLU, in one kernel (the norm is over dim 1, as the decoder's are)."""
    if (channel_dim or norm.channel_dim) != 1:
        raise ValueError("the fused RMS norm + SiLU normalises over dim 1")
    return rms_silu(x, norm.eps)


def _pass_through(x: torch.Tensor) -> torch.Tensor:
    return x
