"""What the golden replays share (`bench/replay_golden.py`, `bench/replay_teacher.py`): the model of a
golden's config, its camera inputs through camrender's camera code, the error measure and its tolerance."""
from __future__ import annotations

import os
import sys

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
    return float((ours.float() - golden).abs().max() / golden.abs().max().clamp_min(1e-30))


def _camera(tensors: dict, shapes: dict):
    """camrender's camera_conditions (1, F, 20) and chunk_plucker (1, 48, F, h, w) of the golden's path."""
    height, width = shapes["latent_h"] * VAE_STRIDE[1], shapes["latent_w"] * VAE_STRIDE[2]
    traj = Trajectory(c2w=tensors["inputs/c2w"].double().numpy(),
                      intrinsics=tensors["inputs/intrinsics"].double().numpy(), width=width, height=height, fps=16.0)
    camera = build_camera_inputs(traj, height, width, VAE_STRIDE)
    return camera["camera_conditions"][None], camera["chunk_plucker"][None]
