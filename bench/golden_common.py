"""What the golden replays share (`bench/replay_golden.py`, `bench/replay_teacher.py`): the model of a
golden's config, its camera inputs through camrender's camera code, the error measure and its tolerance."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

import torch
from diffusers.models.transformers.transformer_sana_wm import SanaWMTransformer3DModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from camrender.render.camera import build_camera_inputs  # noqa: E402
from camrender.trajectory.model import Trajectory  # noqa: E402

TOLERANCE = 1e-4
VAE_STRIDE = (8, 32, 32)  # the golden's pixel frames and pixel size per latent frame / token


def _model_from_config(config: dict):
    """A float32 `SanaWMTransformer3DModel` of the golden's `model_config` (random init)."""
    kwargs = config["build_model_kwargs"]
    return SanaWMTransformer3DModel(
        in_channels=kwargs["in_channels"], num_layers=config["depth"], hidden_size=config["hidden_size"],
        num_attention_heads=config["num_heads"], patch_size=tuple(config["patch_size"]),
        softmax_every_n=kwargs["softmax_every_n"], linear_head_dim=kwargs["linear_head_dim"],
        t_kernel_size=kwargs["t_kernel_size"], conv_kernel_size=kwargs["conv_kernel_size"],
        k_conv_only=kwargs["k_conv_only"], caption_channels=kwargs["caption_channels"],
        mlp_ratio=kwargs["mlp_ratio"], use_chunk_plucker_post_attn=kwargs["use_chunk_plucker_post_attn"],
        chunk_plucker_post_attn_blocks=kwargs["chunk_plucker_post_attn_blocks"],
    ).eval().float()


def _rel(ours, golden) -> float:
    ours = ours.float().to(golden.device)
    return float((ours - golden).abs().max() / golden.abs().max().clamp_min(1e-30))


def replay_device(kernels: str) -> torch.device:
    """Where a replay runs: the GPU for the fused kernels when there is one and the Triton interpreter is
    off (the kernels compiled for it), else the CPU (the references, or the kernels through the interpreter)."""
    compiled = os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available()
    return torch.device("cuda") if kernels == "fused" and compiled else torch.device("cpu")


@contextlib.contextmanager
def exact_float32():
    """TF32 off for matmuls and cuDNN convs (the FFN's temporal conv, the patch embedding) while a replay
    runs: the goldens are float32 arithmetic, and cuDNN's default TF32 convs are 1e-3 off it on a GPU."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def inputs_on(inputs, device: torch.device):
    """`inputs` (a `RenderInputs`) with its tensors on `device`."""
    return dataclasses.replace(inputs, **{field.name: getattr(inputs, field.name).to(device)
                                          for field in dataclasses.fields(inputs)
                                          if isinstance(getattr(inputs, field.name), torch.Tensor)})


def _camera(tensors: dict, shapes: dict):
    """camrender's camera_conditions (1, F, 20) and chunk_plucker (1, 48, F, h, w) of the golden's path."""
    height, width = shapes["latent_h"] * VAE_STRIDE[1], shapes["latent_w"] * VAE_STRIDE[2]
    traj = Trajectory(c2w=tensors["inputs/c2w"].double().numpy(),
                      intrinsics=tensors["inputs/intrinsics"].double().numpy(), width=width, height=height, fps=16.0)
    camera = build_camera_inputs(traj, height, width, VAE_STRIDE)
    return camera["camera_conditions"][None], camera["chunk_plucker"][None]
