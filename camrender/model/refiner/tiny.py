"""The built-in offline refiner (`--refiner tiny`): a small random-weight SANA-WM stage 2 built in code.

It has the architecture of the released refiner (`diffusers.SanaWMLTX2Refiner`), shrunk: an
LTX-2 refiner transformer (`SanaWMLTX2RefinerTransformer3DModel`), LTX-2 text connectors, a
one-layer Gemma-3 text encoder behind the character-level tokenizer of `camrender.model.stage1.tiny`, and the
flow-match Euler scheduler with shift 1 (the distilled sigmas pass through unchanged). Weights are
random (seeded): the point is to exercise stage 2 with no download, on a CPU, in seconds.
"""
from __future__ import annotations

from camrender import vocabulary
from camrender.model.stage1.tiny import TINY_TRANSFORMER_CONFIG, build_tiny_tokenizer

TINY_REFINER = vocabulary.TINY

# The tiny refiner transformer; `build_tiny_refiner(**overrides)` replaces any entry. Its latent
# channels are the tiny stage-1 model's (the tiny VAE's).
TINY_REFINER_TRANSFORMER_CONFIG = dict(
    in_channels=TINY_TRANSFORMER_CONFIG["in_channels"],
    out_channels=TINY_TRANSFORMER_CONFIG["in_channels"],
    num_attention_heads=2,
    attention_head_dim=8,
    cross_attention_dim=16,
    num_layers=2,
    caption_channels=16,
    audio_in_channels=4,
    audio_out_channels=4,
    audio_num_attention_heads=2,
    audio_attention_head_dim=4,
    audio_cross_attention_dim=8,
    pos_embed_max_pos=20,
    base_height=256,
    base_width=256,
    vae_scale_factors=(8, 8, 8),
)

TINY_GEMMA3_TEXT_CONFIG = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    max_position_embeddings=256,
    sliding_window=64,
)

TINY_TEXT_MAX_SEQUENCE_LENGTH = 32  # prompt tokens (the release refiner: 1024)


def build_tiny_gemma3(vocab_size: int, seed: int = 0):
    """One-layer `Gemma3ForConditionalGeneration` (text hidden 16, a one-layer vision tower it never uses)."""
    # lazy: keeps `camrender --help` free of torch, transformers
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config=dict(vocab_size=vocab_size, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                         **TINY_GEMMA3_TEXT_CONFIG),
        vision_config=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
                           image_size=16, patch_size=8),
        mm_tokens_per_image=4,
        boi_token_index=vocab_size - 3, eoi_token_index=vocab_size - 2, image_token_index=vocab_size - 1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Gemma3ForConditionalGeneration(config)
    return model.eval()


def _redraw(module, generator) -> None:
    """Re-draw every parameter (unit-gain fan-in weights, norms near 1, small biases) so that the
    zero-initialised gates and projections of the fresh model are live."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.ndim > 1 and "scale_shift_table" not in name and "registers" not in name:
                param.copy_(noise / (param[0].numel() ** 0.5))
            elif "norm" in name:
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(0.1 * noise)


def build_tiny_refiner(seed: int = 0, text_encoder: bool = True, **overrides):
    """The whole tiny `SanaWMLTX2Refiner` (fp32, CPU, no VAE). `overrides` go to the transformer config.
    text_encoder=False: built without its Gemma-3 (renders whose prompt is cached)."""
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaWMLTX2Refiner
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2RefinerTransformer3DModel
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    config = {**TINY_REFINER_TRANSFORMER_CONFIG, **overrides}
    tokenizer = build_tiny_tokenizer()
    text_encoder = build_tiny_gemma3(len(tokenizer), seed=seed) if text_encoder else None
    text_layers = TINY_GEMMA3_TEXT_CONFIG["num_hidden_layers"] + 1  # + the embedding output
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        connectors = LTX2TextConnectors(
            caption_channels=TINY_GEMMA3_TEXT_CONFIG["hidden_size"],
            text_proj_in_factor=text_layers,
            video_connector_num_attention_heads=2, video_connector_attention_head_dim=8,
            video_connector_num_layers=1, video_connector_num_learnable_registers=8,
            audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
            audio_connector_num_layers=1, audio_connector_num_learnable_registers=8,
            connector_rope_base_seq_len=64,
        )
        transformer = SanaWMLTX2RefinerTransformer3DModel(**config)
        generator = torch.Generator().manual_seed(seed + 1)
        _redraw(transformer, generator)
        _redraw(connectors, generator)
    if config["caption_channels"] != connectors.config.caption_channels:
        raise ValueError("caption_channels must equal the tiny Gemma-3's hidden size (16)")
    return SanaWMLTX2Refiner(
        transformer=transformer.eval(),
        connectors=connectors.eval(),
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
        vae=None,
        text_max_sequence_length=TINY_TEXT_MAX_SEQUENCE_LENGTH,
    )
