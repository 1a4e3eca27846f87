#!/usr/bin/env python
"""Golden outputs of the SANA-WM chunk-causal *teacher* (original NVlabs model class, CPU, tiny random config).

The counterpart of the NVlabs reference kit's `make_golden.py` (streaming student) for the checkpoint
`SANA-WM_chunk_causal/dit/sana_wm_chunk_causal_1600m_720p.safetensors`:

* model: the kit's unmodified `SanaMSVideoCamCtrl` (`src/diffusion/model/nets/sana_multi_scale_video_camctrl.py`)
  built through the official `build_model` with the kwargs of the released chunk-causal YAML
  (`configs/sana_wm/sana_wm_chunk_causal_1600m_720p.yaml`: camctrl_type
  ChunkCausalGDNUCPESinglePathLiteLABothTriton, attn_type ChunkCausalGDNTriton, ffn_type ChunkGLUMBConvTemp,
  pos_embed_type wan_rope, chunk_size 3, chunk_split_strategy first_chunk_plus_one); everything else is
  the kit's streaming YAML, which shares every other model field. Only the sizes are tiny.
* sampler: `ChunkFlowEuler.sample` of NVlabs/Sana `diffusion/scheduler/flow_euler_sampler.py` (not in the
  kit), as `inference_sana_wm.py:_dispatch_solver` calls it (interval_k = 1 / number of chunks, guidance
  5, 60 steps by default, flow shift 9.8 = the YAML's `inference_flow_shift`). `chunk_flow_euler` below
  is our own re-statement of that loop with the same arithmetic; docs/recipes.md lists its rules.
* camera: the kit's `prepare_camera` (compiled from the unmodified `inference_sana_wm.py`).

Nothing of NVlabs is copied here: the kit is imported from `$SANA_WM_KIT` (default
`../shared/reference/nvlabs-sana-wm` next to the repository) with its packages from `$SANA_WM_SITE`.

    export SANA_WM_SITE=/work/sana-wm-site
    OMP_NUM_THREADS=1 python3 tools/make_golden_chunk_causal.py --seed 1 --latent-frames 7 --steps 6 \
        --fp32-softmax --out tests/golden/chunk_causal_seed1.safetensors

Layout (safetensors; see tests/golden/README.md): `generator.<key>` weights in original checkpoint
format, `inputs/*` as the kit's streaming goldens plus the negative prompt, `outputs/latents`, and per
global sampler step g: `step{g}/x_in` (1, C, T_g, h, w) latents of the active prefix, `step{g}/timestep`
(T_g,) per-frame model timestep, `step{g}/chunk_index` (K_g,) chunk starts given to the model,
`step{g}/pred` (2, C, T_g, h, w) raw model output (negative prompt first, then the prompt).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIT = os.environ.get("SANA_WM_KIT", os.path.join(os.path.dirname(REPO), "shared", "reference", "nvlabs-sana-wm"))
if not os.path.isfile(os.path.join(KIT, "make_golden.py")):
    sys.exit(f"NVlabs reference kit not found at {KIT} (set SANA_WM_KIT)")
sys.path.insert(0, KIT)
sys.path.insert(0, os.path.join(KIT, "cpu"))
# The bidirectional fused GDN scan of a call with no chunk boundary (fused_bigdn_func without *_bwd
# arguments) takes the chunkwise kernels, which ignore FUSED_GDN_PRECISION and run bf16 dots: the Triton
# interpreter returns garbage for those (as the kit README says of phase_a). The legacy path (forward +
# reverse `fused_gdn_func`, what every multi-chunk call takes anyway) is the same math with fp32 dots.
os.environ.setdefault("FUSED_GDN_FORCE_LEGACY", "1")


def _install_fp32_gdn_stores(src):
    """Rounding-only patch (like the kit's --fp32-softmax): `_fused_gdn_kernel` stores its per-direction
    output, numerator and denominator rounded to bf16 even in an fp32 run (fused_gdn.py:370-372); the
    patched module keeps them fp32. The kit's file is compiled from its own text with those three casts
    changed (the text is registered in linecache under its own name so Triton's jit reads the patched
    source); nothing is written anywhere."""
    import importlib.util
    import linecache

    path = os.path.join(src, "diffusion", "model", "ops", "fused_gdn.py")
    text = open(path, encoding="utf-8").read()
    for name, mask in (("result", "mask_sd"), ("num", "mask_sd"), ("den", "mask_s")):
        old = f"{name}.to(tl.bfloat16), mask={mask})"
        if text.count(old) != 1:
            raise SystemExit(f"{path}: expected one '{old}'; the kit changed, update the fp32 patch")
        text = text.replace(old, f"{name}.to(tl.float32), mask={mask})")
    patched = path + ":fp32-stores"
    linecache.cache[patched] = (len(text), None, text.splitlines(True), patched)
    spec = importlib.util.spec_from_loader("diffusion.model.ops.fused_gdn", loader=None, origin=patched)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = patched
    sys.modules[spec.name] = module
    exec(compile(text, patched, "exec"), module.__dict__)


if "--fp32-gdn" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (as the kit does)
    os.environ.setdefault("FUSED_GDN_PRECISION", "0")
    import orig_import  # noqa: E402

    _src = os.environ.get("SANA_WM_SRC", os.path.join(KIT, "src"))
    orig_import.setup(_src, os.environ.get("SANA_WM_SITE", os.path.join(KIT, ".site")))
    _install_fp32_gdn_stores(_src)
# The kit module sets the CPU / Triton-interpreter environment, installs its import stand-ins and
# (with --fp32-softmax in argv) keeps the softmax blocks' q/k/v in fp32, exactly as for its own goldens.
import make_golden as kit  # noqa: E402

import torch  # noqa: E402
from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from diffusion.model.builder import MODELS, build_model  # noqa: E402
from diffusion.utils.chunk_utils import get_chunk_index_from_config  # noqa: E402

camctrl_mod = kit.camctrl_mod

# configs/sana_wm/sana_wm_chunk_causal_1600m_720p.yaml: the model fields that differ from the streaming YAML.
CHUNK_CAUSAL_MODEL_FIELDS = dict(
    camctrl_type="ChunkCausalGDNUCPESinglePathLiteLABothTriton",
    attn_type="ChunkCausalGDNTriton",
    ffn_type="ChunkGLUMBConvTemp",
    pos_embed_type="wan_rope",
    chunk_size=3,
    chunk_split_strategy="first_chunk_plus_one",
)
INFERENCE_FLOW_SHIFT = 9.8  # the chunk-causal YAML's scheduler.inference_flow_shift
CFG_SCALE = 5.0  # inference_sana_wm.py --cfg_scale default
STEPS = 60  # inference_sana_wm.py --step default


def teacher_config(args):
    cfg = kit.official_config(args)
    for name, value in CHUNK_CAUSAL_MODEL_FIELDS.items():
        setattr(cfg.model, name, value)
    cfg.scheduler.inference_flow_shift = INFERENCE_FLOW_SHIFT
    cfg.scheduler.vis_sampler = "chunk_flow_euler"
    return cfg


def randomize_short_convs_(model, seed):
    """The GDN blocks' K short convs (`attn.conv_k`, `attn.conv_k_cam`, (C, 1, K)) start as the identity
    (1 on the last tap), which would hide every rule about their context; add N(0, 0.3^2) to every tap
    (from Generator().manual_seed(seed * 1000 + 7), after the kit's own randomisation). Returns the names."""
    generator = torch.Generator().manual_seed(seed * 1000 + 7)
    names = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("attn.conv_k.weight", "attn.conv_k_cam.weight")):
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
                names.append(name)
    return names


def tiny_teacher_factory(depth, hidden, heads):
    """Register SanaMSVideoCamCtrl_1600M_P1_D20 with tiny depth / width / heads."""
    def _factory(**kwargs):
        return camctrl_mod.SanaMSVideoCamCtrl(depth=depth, hidden_size=hidden, patch_size=(1, 1, 1), num_heads=heads,
                                              **kwargs)

    name = f"SanaMSVideoCamCtrl_tiny_D{depth}_C{hidden}_H{heads}"
    MODELS.register_module(name=name, module=_factory)
    return name


# ----------------------------------------------------------------------------- sampler (own words)
def temporal_chunks(num_frames, chunk_index):
    """(start, stop) latent-frame ranges from chunk starts: sorted, deduplicated, 0 added, empty dropped."""
    starts = sorted({int(i) for i in chunk_index if 0 <= int(i) < num_frames})
    if not starts or starts[0] != 0:
        starts = [0] + starts
    return [(a, b) for a, b in zip(starts, starts[1:] + [num_frames]) if b > a]


def staggered_schedule(timesteps, num_chunks, interval_k):
    """Per-chunk timestep rows over the global steps: -1 before a chunk starts, its own schedule from
    step int(i * interval_k * steps), 0 once done. Returns (rows as lists of floats, start steps)."""
    steps = len(timesteps)
    starts = [int(i * float(interval_k) * steps) for i in range(num_chunks)]
    total = starts[-1] + steps
    rows = []
    for start in starts:
        row = [-1.0] * start + [float(t) for t in timesteps] + [0.0] * (total - start - steps)
        rows.append(row)
    return rows, starts


def per_token_euler(latents, pred, frame_timesteps, sigmas):
    """One per-token flow-match Euler step (the diffusers scheduler's per_token_timesteps rule).

    latents, pred (1, C, T, h, w) fp32; frame_timesteps (T,) fp32 in [0, 1000]; sigmas (S+1,) fp32, the
    schedule ending in 0. sigma = t / 1000, next = the largest schedule sigma below sigma - 1e-6 (0 if
    none); x <- x + (sigma - next) * (-pred). Frames at t = 0 do not move.
    """
    sigma = frame_timesteps / 1000.0
    below = sigmas[:, None] < sigma[None] - 1e-6
    next_sigma = (below * sigmas[:, None]).max(dim=0).values
    dt = (sigma - next_sigma).view(1, 1, -1, 1, 1)
    return latents.float() + dt * (-pred)


def chunk_flow_euler(model, latents, cond, neg, model_kwargs, *, steps, flow_shift, cfg_scale, chunk_index,
                     interval_k, record):
    """ChunkFlowEuler.sample with classifier-free guidance: every global step runs the model once on the
    prefix of started chunks (finished ones at timestep 0), the condition frames at timestep 0.
    record(step, x_in, timestep, chunk_index, raw_pred) is called after each model call."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=flow_shift)
    scheduler.set_timesteps(steps, device="cpu")
    timesteps = scheduler.timesteps
    sigmas = scheduler.sigmas.to(torch.float32)
    num_frames = latents.shape[2]
    chunks = temporal_chunks(num_frames, chunk_index or [0])
    rows, _ = staggered_schedule(timesteps.tolist(), len(chunks), interval_k)
    condition = torch.zeros(num_frames)
    for frame in model_kwargs["data_info"].get("condition_frame_info", {}):
        condition[int(frame)] = 1.0
    prompts = torch.cat([neg, cond]) if cfg_scale > 1 else cond
    pieces = [latents[:, :, a:b].clone() for a, b in chunks]
    for step in range(len(rows[0])):
        active = [i for i in range(len(chunks)) if rows[i][step] >= 0]
        end = chunks[active[-1]][1]
        x = torch.cat([pieces[i] for i in active], dim=2)
        frame_t = torch.cat([torch.full((chunks[i][1] - chunks[i][0],), rows[i][step]) for i in active])
        frame_t = (1 - condition[:end]) * frame_t
        kwargs = dict(model_kwargs)
        kwargs["camera_conditions"] = model_kwargs["camera_conditions"][:, :end]
        kwargs["chunk_plucker"] = model_kwargs["chunk_plucker"][:, :, :end]
        kwargs["chunk_index"] = [chunks[i][0] for i in active]
        kwargs["data_info"] = {**model_kwargs["data_info"], "condition_frame_info": {}}
        batch = prompts.shape[0]
        out = model(x.expand(batch, -1, -1, -1, -1), frame_t.view(1, 1, -1).expand(batch, 1, -1), prompts, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        record(step, x, frame_t, kwargs["chunk_index"], out)
        pred = out[:1] + cfg_scale * (out[1:] - out[:1]) if batch == 2 else out
        x = per_token_euler(x, pred, frame_t, sigmas)
        offset = 0
        for i in active:
            size = chunks[i][1] - chunks[i][0]
            pieces[i] = x[:, :, offset:offset + size]
            offset += size
    for (a, b), piece in zip(chunks, pieces):
        latents[:, :, a:b] = piece
    return latents, dict(timesteps=timesteps, sigmas=sigmas, chunks=chunks, rows=rows)


# ----------------------------------------------------------------------------- main
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=112)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--latent-frames", type=int, default=7)
    p.add_argument("--height", type=int, default=3, help="latent height (pixel height = 32 * this)")
    p.add_argument("--width", type=int, default=5, help="latent width (pixel width = 32 * this)")
    p.add_argument("--latent-channels", type=int, default=128)
    p.add_argument("--caption-channels", type=int, default=64)
    p.add_argument("--text-len", type=int, default=16)
    p.add_argument("--text-valid", type=int, default=11)
    p.add_argument("--steps", type=int, default=STEPS, help=f"sampling steps (official default {STEPS})")
    p.add_argument("--cfg-scale", type=float, default=CFG_SCALE)
    p.add_argument("--flow-shift", type=float, default=INFERENCE_FLOW_SHIFT)
    p.add_argument("--interval-k", type=float, default=None, help="default 1 / number of chunks (official)")
    p.add_argument("--no-record", action="store_true", help="store no per-step tensors (schedule-shape runs)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fp32-softmax", action="store_true",
                   help="keep the softmax blocks' q/k/v in fp32 (the official code casts them to bf16)")
    p.add_argument("--fp32-gdn", action="store_true",
                   help="keep the fused GDN scan's outputs in fp32 (the official kernel rounds them to bf16)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.time()

    frames, h, w = args.latent_frames, args.height, args.width
    stride = kit.VAE_STRIDE
    H_pix, W_pix = h * stride[1], w * stride[2]
    pixel_frames = (frames - 1) * stride[0] + 1

    cfg = teacher_config(args)
    kwargs = kit.model_video_camctrl_init_config(cfg, latent_size=cfg.model.image_size // cfg.vae.vae_stride[-1])
    name = tiny_teacher_factory(args.layers, args.hidden, args.heads)
    with contextlib.redirect_stdout(io.StringIO()):
        torch.manual_seed(args.seed * 1000)
        model = build_model(name, use_fp32_attention=cfg.model.get("fp32_attention", False), **kwargs)
    randomized = kit.randomize_(model, torch.Generator().manual_seed(args.seed * 1000 + 1))
    randomized["ones"] += [f"{name} (identity + noise)" for name in randomize_short_convs_(model, args.seed)]
    model = model.eval().to(torch.float32)
    state = model.state_dict()

    from diffusion.utils.cam_utils import compute_raymap, get_pose_inverse

    import numpy as np

    fns = kit.load_official_functions(
        kit.WM_SCRIPT, ["_pack_camera_conditions", "prepare_camera"],
        {"torch": torch, "np": np, "compute_raymap": compute_raymap, "get_pose_inverse": get_pose_inverse},
    )
    c2w, intr = kit.orbit_path(pixel_frames, H_pix, W_pix, args.seed)
    camera = fns["prepare_camera"](c2w, intr, target_size=(H_pix, W_pix), vae_stride=stride)
    raymap = camera["raymap"].unsqueeze(0).float()
    chunk_plucker = camera["chunk_plucker"].unsqueeze(0).float()

    gen_in = torch.Generator().manual_seed(args.seed * 1000 + 2)
    cond = torch.randn(1, 1, args.text_len, args.caption_channels, generator=gen_in)
    cond_mask = torch.zeros(1, args.text_len, dtype=torch.int64)
    cond_mask[:, : args.text_valid] = 1
    neg = torch.randn(1, 1, args.text_len, args.caption_channels, generator=gen_in)
    neg_mask = torch.zeros(1, args.text_len, dtype=torch.int64)
    neg_mask[:, : max(1, args.text_valid // 2)] = 1
    first_latent = torch.randn(1, args.latent_channels, 1, h, w, generator=gen_in)

    # SanaWMPipeline.generate (inference_sana_wm.py:1515-1536)
    generator = torch.Generator().manual_seed(args.seed)
    z = torch.randn(1, args.latent_channels, frames, h, w, generator=generator)
    noise = z.clone()
    z[:, :, :1] = first_latent
    latents_init = z.clone()
    guided = args.cfg_scale > 1.0
    chunk_index = get_chunk_index_from_config(cfg, num_frames=frames)
    model_kwargs = dict(
        data_info={"img_hw": torch.tensor([[H_pix, W_pix]], dtype=torch.float), "condition_frame_info": {0: 0.0}},
        mask=torch.cat([neg_mask, cond_mask]) if guided else cond_mask,
        camera_conditions=torch.cat([raymap, raymap]) if guided else raymap,
        chunk_plucker=torch.cat([chunk_plucker, chunk_plucker]) if guided else chunk_plucker,
        chunk_index=chunk_index,
    )
    chunks = temporal_chunks(frames, chunk_index)
    interval_k = args.interval_k if args.interval_k is not None else 1.0 / len(chunks)

    T = {}
    started = time.time()

    def record(step, x, frame_t, index, out):
        print(f"step {step}: frames {x.shape[2]}, chunk starts {index}, {time.time() - started:.0f}s", flush=True)
        if args.no_record:
            return
        T[f"step{step}/x_in"] = x.detach().clone().contiguous()
        T[f"step{step}/timestep"] = frame_t.detach().clone().to(torch.float32).contiguous()
        T[f"step{step}/chunk_index"] = torch.tensor(index, dtype=torch.int64)
        T[f"step{step}/pred"] = out.detach().clone().contiguous()

    with torch.no_grad():
        z, schedule = chunk_flow_euler(model, z, cond, neg, model_kwargs, steps=args.steps, flow_shift=args.flow_shift,
                                       cfg_scale=args.cfg_scale, chunk_index=chunk_index, interval_k=interval_k,
                                       record=record)
    sample_seconds = time.time() - started
    if not torch.isfinite(z).all():
        raise RuntimeError("non-finite latents")

    for key, value in state.items():
        T[f"generator.{key}"] = value.detach().contiguous()
    T["inputs/first_latent"] = first_latent
    T["inputs/noise"] = noise
    T["inputs/latents_init"] = latents_init
    T["inputs/text_embeds"] = cond
    T["inputs/text_mask"] = cond_mask
    T["inputs/negative_embeds"] = neg
    T["inputs/negative_mask"] = neg_mask
    T["inputs/c2w"] = torch.from_numpy(c2w).contiguous()
    T["inputs/intrinsics"] = torch.from_numpy(intr).contiguous()
    T["inputs/camera_conditions"] = raymap.contiguous()
    T["inputs/chunk_plucker"] = chunk_plucker.contiguous()
    T["inputs/chunk_bounds"] = torch.tensor([a for a, _ in chunks] + [frames], dtype=torch.int64)
    T["inputs/timesteps"] = schedule["timesteps"].to(torch.float32).contiguous()
    T["inputs/sigmas"] = schedule["sigmas"].contiguous()
    T["inputs/timestep_matrix"] = torch.tensor(schedule["rows"], dtype=torch.float32)
    T["outputs/latents"] = z.contiguous()

    model_cfg = dict(
        class_name="SanaMSVideoCamCtrl",
        official_factory="SanaMSVideoCamCtrl_1600M_P1_D20 (depth/hidden_size/num_heads overridden)",
        depth=args.layers, hidden_size=args.hidden, num_heads=args.heads, patch_size=[1, 1, 1],
        build_model_kwargs={k: v for k, v in kwargs.items() if k != "config"},
        use_fp32_attention=bool(cfg.model.get("fp32_attention", False)),
        softmax_blocks=[i for i, b in enumerate(model.blocks) if "Softmax" in type(b.attn).__name__],
        attn_classes=[type(b.attn).__name__ for b in model.blocks],
        ffn_classes=[type(b.mlp).__name__ for b in model.blocks],
        yaml="configs/sana_wm/sana_wm_chunk_causal_1600m_720p.yaml (fields differing from the kit's streaming YAML "
             "set in tools/make_golden_chunk_causal.py)",
        yaml_overrides=dict(vae_latent_dim=args.latent_channels, caption_channels=args.caption_channels,
                            model_max_length=args.text_len, linear_head_dim=args.hidden // args.heads,
                            chunk_plucker_post_attn_blocks=args.layers),
    )
    sampler_cfg = dict(
        class_name="ChunkFlowEuler", method="sample (re-stated in tools/make_golden_chunk_causal.py)",
        recipe="chunk-causal", steps=args.steps, flow_shift=args.flow_shift, cfg_scale=args.cfg_scale,
        interval_k=interval_k, chunk_bounds=[a for a, _ in chunks] + [frames], chunk_index_model_kwarg=chunk_index,
        total_steps=len(schedule["rows"][0]), condition_frame_info={"0": 0.0},
    )
    meta = {
        "format": "sana-wm-chunk-causal-golden/1",
        "recipe": "chunk-causal",
        "seed": str(args.seed),
        "model_config": json.dumps(model_cfg),
        "sampler_config": json.dumps(sampler_cfg),
        "shapes": json.dumps(dict(latent_frames=frames, latent_h=h, latent_w=w, latent_channels=args.latent_channels,
                                  pixel_frames=pixel_frames, pixel_h=H_pix, pixel_w=W_pix, vae_stride=stride,
                                  text_len=args.text_len, text_valid=args.text_valid,
                                  caption_channels=args.caption_channels)),
        "camera_path": json.dumps([dict(c2w=[[float(v) for v in row] for row in c2w[i]], fx=float(intr[i, 0]),
                                        fy=float(intr[i, 1]), cx=float(intr[i, 2]), cy=float(intr[i, 3]))
                                   for i in range(pixel_frames)]),
        "camera_path_source": "synthetic_orbit",
        "camera_conventions": "as the kit's streaming goldens (c2w OpenCV, pixel intrinsics, one entry per pixel frame)",
        "checkpoint_format": "weights stored as 'generator.<state_dict key>' (model.state_dict() of SanaMSVideoCamCtrl)",
        "randomized_zero_init_params": json.dumps(randomized["zero"]),
        "randomized_ones_init_params": json.dumps(randomized["ones"]),
        "dtype": "float32; CPU; Triton kernels in TRITON_INTERPRET mode; GDN scans with fp32 dots (FUSED_GDN_PRECISION="
                 + os.environ.get("FUSED_GDN_PRECISION", "") + "); softmax q/k/v "
                 + ("kept in fp32 (--fp32-softmax)" if os.environ.get("KIT_FP32_SOFTMAX") == "1" else "cast to bf16")
                 + "; GDN scan outputs " + ("kept in fp32 (--fp32-gdn)" if args.fp32_gdn else "rounded to bf16")
                 + "; FUSED_GDN_FORCE_LEGACY=" + os.environ.get("FUSED_GDN_FORCE_LEGACY", ""),
        "sample_seconds": f"{sample_seconds:.1f}",
        "torch_version": torch.__version__,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(T, args.out, metadata=meta)
    print(f"wrote {args.out}: {os.path.getsize(args.out) / 1e6:.2f} MB, {len(T)} tensors; "
          f"sampling {sample_seconds:.1f}s, total {time.time() - t_start:.1f}s")


if __name__ == "__main__":
    main()
