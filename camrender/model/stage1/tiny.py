"""The built-in offline model (`--model tiny`): a small random-weight SANA-WM pipeline built in code.

Every component has the architecture of the released model, shrunk: a character-level
tokenizer, a one-layer Gemma-2 text encoder, a SANA-WM transformer with GDN and softmax
blocks, an LTX-2 video VAE with 8x spatial and 8x temporal compression and a flow-match
Euler scheduler. Weights are random (seeded), so rendered frames are noise; the point is
to exercise the whole render path with no download, on CPU, in seconds.
"""
from __future__ import annotations

import string

from camrender.vocabulary import TINY

TINY_MODEL = TINY

# Characters the tokenizer knows; anything else maps to <unk>.
_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n\t"
_SPECIAL = ("<pad>", "<eos>", "<bos>", "<unk>")

# Defaults of the tiny transformer; `build_tiny_pipeline(**overrides)` replaces any of them.
TINY_TRANSFORMER_CONFIG = dict(
    in_channels=8,
    num_layers=2,
    hidden_size=32,
    num_attention_heads=2,
    linear_head_dim=16,
    softmax_every_n=2,  # block 1 is softmax, block 0 GDN
    patch_size=(1, 1, 1),
    caption_channels=32,
    mlp_ratio=2.0,
    chunk_plucker_post_attn_blocks=20,
)

TINY_TEXT_ENCODER_CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=4096,
)


def build_tiny_tokenizer():
    """Character-level `PreTrainedTokenizerFast`: one token per character, <bos> prepended."""
    # lazy: keeps `camrender --help` free of transformers, huggingface_hub
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(_SPECIAL)}
    for char in _ALPHABET:
        vocab.setdefault(char, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"[\s\S]"), behavior="isolated")  # every character
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="right",
        model_max_length=8192,
    )


def build_tiny_text_encoder(vocab_size: int, seed: int = 0):
    """One-layer `Gemma2ForCausalLM` with random weights drawn from `seed`."""
    # lazy: keeps `camrender --help` free of torch, transformers
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=vocab_size, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                          **TINY_TEXT_ENCODER_CONFIG)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Gemma2ForCausalLM(config)
    return model.eval()


def build_tiny_vae(latent_channels: int = 8, seed: int = 0):
    """LTX-2 video VAE shaped like diffusers' test config, 8x spatial and 8x temporal compression.

    The config's own compression formula does not match what these blocks compute, so both
    ratios are passed explicitly.
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch
    from diffusers import AutoencoderKLLTX2Video

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLLTX2Video(
            in_channels=3,
            out_channels=3,
            latent_channels=latent_channels,
            block_out_channels=(8, 8, 8, 8),
            down_block_types=("LTX2VideoDownBlock3D",) * 4,
            decoder_block_out_channels=(16, 32, 64),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1),
            spatio_temporal_scaling=(True, True, True, False),
            decoder_spatio_temporal_scaling=(True, True, True),
            decoder_inject_noise=(False, False, False, False),
            downsample_type=("spatiotemporal",) * 4,
            upsample_type=("spatiotemporal",) * 3,
            upsample_residual=(True, True, True),
            upsample_factor=(2, 2, 2),
            patch_size=1,
            patch_size_t=1,
            spatial_compression_ratio=8,
            temporal_compression_ratio=8,
        )
    return vae.eval()


def build_tiny_transformer(seed: int = 0, **overrides):
    """Tiny `SanaWMTransformer3DModel` (>= 1 GDN and >= 1 softmax block) with seeded random weights.

    Every parameter is re-drawn (small normal values) so that the zero-initialised camera and
    Plucker projections are live and the camera branch actually contributes to the output.
    `overrides` replace entries of `TINY_TRANSFORMER_CONFIG` (e.g. `linear_head_dim=24`).
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch
    from diffusers import SanaWMTransformer3DModel

    config = {**TINY_TRANSFORMER_CONFIG, **overrides}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SanaWMTransformer3DModel(**config)
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("A_log") or name.endswith("dt_bias"):
                    continue  # keep the gate initialisation: decays stay in (0, 1)
                noise = torch.randn(param.shape, generator=generator)
                if param.ndim > 1:  # weights: unit-gain fan-in scaling keeps activations O(1)
                    param.copy_(noise / (param[0].numel() ** 0.5))
                elif "norm" in name:
                    param.copy_(1.0 + 0.1 * noise)
                else:
                    param.copy_(0.1 * noise)
    return model.eval()


def build_tiny_scheduler():
    """Flow-match Euler scheduler (diffusers defaults)."""
    # lazy: keeps `camrender --help` free of torch, diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler()


def build_tiny_pipeline(seed: int = 0, text_encoder: bool = True, **overrides):
    """The whole tiny `SanaWMPipeline` (fp32, CPU). `overrides` go to the transformer config.
    text_encoder=False: built without it (renders whose prompt is cached).

    Text encoder hidden size follows `caption_channels` and the VAE's latent channels follow
    `in_channels`, so overriding either keeps the pipeline consistent.
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    from diffusers import SanaWMPipeline

    config = {**TINY_TRANSFORMER_CONFIG, **overrides}
    tokenizer = build_tiny_tokenizer()
    text_encoder = build_tiny_text_encoder(len(tokenizer), seed=seed) if text_encoder else None
    if text_encoder is not None and text_encoder.config.hidden_size != config["caption_channels"]:
        raise ValueError("caption_channels must equal the tiny text encoder's hidden size (32)")
    return SanaWMPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=build_tiny_vae(latent_channels=config["in_channels"], seed=seed),
        transformer=build_tiny_transformer(seed=seed, **overrides),
        scheduler=build_tiny_scheduler(),
    )
