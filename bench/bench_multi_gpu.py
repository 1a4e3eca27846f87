"""One host, 1 and 2 GPUs side by side: the full-mode step (CFG parallel, head split), segment mode (head split)
and `camrender batch` throughput.

Starts its measurements as torchrun workers of this same script (NCCL, NVLS and multicast off)
and prints one JSON object (also written to --out):

- full_mode_step: one guided denoising step of the release-size transformer (random weights, bf16,
  161 frames at 704x1280, patched, fixed inputs prepared once, replayed as a CUDA graph: the step
  as rendered), on 1 GPU (B=2) and on 2 GPUs (`camrender.parallel.cfg`: one guidance row per GPU,
  the predictions all-gathered and mixed on both); ms per step (median), peak memory per GPU,
  agreement of the 2-GPU guided prediction with the 1-GPU one (cosine, max |a-b| / max |b|); then the
  same guided step (B=2) with every block's heads split over the 2 GPUs (`camrender.parallel.heads`);
- segment_mode: the streaming recipe (4 steps, no CFG, segments of 3 latent frames) on a 31-segment
  path (--segments) at 704x1280 with the release-size DiT and LTX-2 VAE (random weights): on 1 GPU,
  then with the heads split over 2 GPUs (the leader decodes each segment, as a render does); video
  frames per second (stage 1 + decode), stage-1 seconds, peak memory per GPU, agreement of the
  latents with the 1-GPU ones;
- batch: `camrender.batch` on 4 short paths (41 frames at 704x1280, full mode, guidance 5,
  --batch-steps steps) with the release-size pipeline in random weights (a one-layer text encoder:
  no Gemma weights on the machine), on 1 GPU, 2 GPUs with a video each, and 2 GPUs per video;
  videos per minute after one warm-up video per rank, and the model load seconds.

    python3 bench/bench_multi_gpu.py --out $OUT/bench_multi_gpu.json   # 2 H200s: about 4 minutes
    python3 bench/bench_multi_gpu.py --tiny                              # CPU (gloo), tiny models: checks the script
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import PIL.Image
import torch
import torch.distributed as dist
from diffusers import AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, SanaWMPipeline

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from camrender.api.pipeline import CamrenderPipeline  # noqa: E402
from camrender.batch.executors import JobRunner, TorchrunExecutor  # noqa: E402
from camrender.batch.jobs import read_jobs  # noqa: E402
from camrender.batch.plan import plan_jobs  # noqa: E402
from camrender.batch.summary import summarize  # noqa: E402
from camrender.cli.batch import job_keys, resolver  # noqa: E402
from camrender.model.stage1.block import fixed_plucker  # noqa: E402
from camrender.model.stage1.patch import patch_transformer  # noqa: E402
from camrender.model.stage1.recipes import get_recipe  # noqa: E402
from camrender.model.stage1.segments import segment_bounds, SegmentOptions  # noqa: E402
from camrender.model.stage1.tiny import build_tiny_tokenizer  # noqa: E402
from camrender.parallel import distributed  # noqa: E402
from camrender.parallel.cfg import CfgSplit  # noqa: E402
from camrender.parallel.distributed import NCCL_ENV  # noqa: E402
from camrender.parallel.heads import HeadSplit, split_transformer  # noqa: E402
from camrender.render.decode import CausalStreamDecoder, to_uint8_frames  # noqa: E402
from camrender.render.pipeline import prepare_pipeline  # noqa: E402
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments  # noqa: E402

import bench_segments  # noqa: E402
from bench_transformer import (  # noqa: E402
    agreement,
    bench_setup,
    build_model,
    graphed_render_step,
    make_inputs,
    RELEASE_CONFIG,
    time_calls,
)
from common import emit  # noqa: E402

TARGETS = {"full_mode_step_ms_2gpu": 250.0, "segment_fps_speedup_2gpu": 1.7, "batch_speedup_2gpu": 1.9}
TRAJECTORIES = ("orbit.json", "pan.json", "dolly.json", "spiral.json")


def log(message):
    print(f"bench_multi_gpu: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- driver
def run_workers(nproc: int, args: list, tiny: bool, timeout: int) -> dict:
    """Run this script's worker on `nproc` processes under torchrun; rank 0's JSON result."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        env = dict(os.environ, **NCCL_ENV, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        if tiny:
            env.update(TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   __file__, "--worker", *args, "--result", str(out), "--scratch", scratch] + (["--tiny"] if tiny else [])
        started = time.perf_counter()
        done = subprocess.run(command, env=env, timeout=timeout)
        if done.returncode != 0 or not out.exists():
            return {"error": f"workers exited with code {done.returncode} (see stderr)"}
        result = json.loads(out.read_text())
        result["launch_s"] = round(time.perf_counter() - started, 1)
        return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU (gloo) with tiny models: checks the script")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per layout")
    parser.add_argument("--batch-steps", type=int, default=20, help="denoising steps of each batch video")
    parser.add_argument("--skip-batch", action="store_true")
    parser.add_argument("--skip-segments", action="store_true")
    parser.add_argument("--segments", type=int, default=31, help="segments of the segment-mode path")
    parser.add_argument("--timeout", type=int, default=400, help="seconds per torchrun launch")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gpus-per-video", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "step":
        return step_worker(args)
    if args.worker == "batch":
        return batch_worker(args)
    if args.worker == "segments":
        return segment_worker(args)

    result = {"torch": torch.__version__, "targets": TARGETS}
    log("full-mode step on 1 and 2 GPUs")
    result["full_mode_step"] = run_workers(2, ["step", "--repeats", str(args.repeats)], args.tiny, args.timeout)
    if not args.skip_segments:
        log("segment mode on 1 and 2 GPUs")
        result["segment_mode"] = run_workers(2, ["segments", "--segments", str(args.segments)], args.tiny,
                                             args.timeout)
    if not args.skip_batch:
        result["batch"] = {}
        for name, nproc, per_video in (("1_gpu", 1, 1), ("2_gpus", 2, 1), ("2_gpus_per_video", 2, 2)):
            log(f"batch: {name}")
            result["batch"][name] = run_workers(
                nproc, ["batch", "--batch-steps", str(args.batch_steps), "--gpus-per-video", str(per_video)],
                args.tiny, args.timeout)
        one, two = (result["batch"][name].get("videos_per_minute") for name in ("1_gpu", "2_gpus"))
        if one and two:
            result["batch"]["speedup_2_gpus"] = round(two / one, 3)
    step = result["full_mode_step"]
    if not args.tiny and "2_gpus" in step:
        result["meets_targets"] = {
            "full_mode_step_2gpu": step["2_gpus"]["ms_per_step"] <= TARGETS["full_mode_step_ms_2gpu"],
            "segment_fps_2gpu": result.get("segment_mode", {}).get("fps_speedup_2_gpus", 0)
            >= TARGETS["segment_fps_speedup_2gpu"],
            "batch_2gpu": result.get("batch", {}).get("speedup_2_gpus", 0) >= TARGETS["batch_speedup_2gpu"],
        }
    emit(result, args.out)
    return result


# ----------------------------------------------------------------------------- worker: the step
def step_worker(args) -> dict:
    """Rank 0 times the B=2 step alone, then both ranks time the CFG-parallel step."""

    ranks = distributed.start("cpu" if args.tiny else None)
    device, dtype, config, frames, height, width = bench_setup(tiny=args.tiny)
    device = ranks.device
    model = build_model(config, device, dtype)  # same seed on every rank: the same weights
    patch_transformer(model, kernels="fused")
    inputs = make_inputs(config, frames, height, width, device, dtype)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "shape": {"frames": frames, "height": height, "width": width,
                        "tokens": int(np.prod(inputs["hidden_states"].shape[2:]))}}
    if ranks.is_main:
        times, peak, guided = time_step(model, inputs, None, args.repeats, time_calls)
        result["1_gpu"] = {"ms_per_step": round(float(np.median(times)), 2), "peak_memory_gib": peak_figure(peak)}
        reference = guided.float().cpu()
        log(f"1 GPU: {result['1_gpu']}")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dist.barrier(group=ranks.control_group)
    split = CfgSplit(ranks.video_group, ranks.group_rank)
    times, peak, guided = time_step(model, inputs, split, args.repeats, time_calls)
    peaks = distributed.gather_objects(peak_figure(peak), ranks)
    if ranks.is_main:
        result["2_gpus"] = {"ms_per_step": round(float(np.median(times)), 2), "peak_memory_gib_per_gpu": peaks,
                            "agreement_vs_1_gpu": agreement(guided.float().cpu(), reference)}
        log(f"2 GPUs: {result['2_gpus']}")
    # the same guided step (B=2 on both GPUs) with every block's heads split over the two
    split_transformer(model, HeadSplit(ranks.video_group, ranks.group_rank, ranks.per_video))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    times, peak, guided = time_step(model, inputs, None, args.repeats, time_calls)
    peaks = distributed.gather_objects(peak_figure(peak), ranks)
    if ranks.is_main:
        result["2_gpus_head_split"] = {"ms_per_step": round(float(np.median(times)), 2),
                                       "peak_memory_gib_per_gpu": peaks,
                                       "agreement_vs_1_gpu": agreement(guided.float().cpu(), reference)}
        log(f"2 GPUs, head split: {result['2_gpus_head_split']}")
        args.result.write_text(json.dumps(result))
    distributed.stop()
    return result


def peak_figure(peak: float):
    """Peak memory in GiB, rounded; None off the GPU (no figure)."""
    return None if np.isnan(peak) else round(peak, 3)


def time_step(model, inputs, split, repeats, time_calls):
    """(ms per step list, peak GiB, guided prediction) of the step as a render runs it
    (`bench_transformer.graphed_render_step`: the library's Denoiser with, under CFG parallel, the all-gather,
    then the guidance mix)."""
    step, _, plucker = graphed_render_step(model, inputs, split)
    with fixed_plucker(model, plucker):
        return time_calls(step, inputs["hidden_states"].device, repeats, warmup=2, peak_with_warmup=True)


# ----------------------------------------------------------------------------- worker: segment mode
def segment_worker(args) -> dict:
    """Rank 0 renders the segment path alone, then both ranks render it with the heads split."""

    ranks = distributed.start("cpu" if args.tiny else None)
    device = ranks.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.tiny:
        bench_segments.SPATIAL, height, width, segments = 8, 32, 32, 2
    else:
        height, width, segments = 704, 1280, args.segments
    build = argparse.Namespace(cpu_smoke=args.tiny, quick=False, kernels="fused")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with torch.device(device):
        transformer, vae = bench_segments.build_models(build, device, dtype)
    options = SegmentOptions.for_recipe(get_recipe("streaming"))
    latent_frames = 1 + 3 * segments
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "height": height, "width": width, "segments": segments, "latent_frames": latent_frames}
    if ranks.is_main:
        result["1_gpu"], reference = render_segment_path(transformer, vae, latent_frames, height, width, options,
                                                         device, dtype, leader=True)
        log(f"segment mode, 1 GPU: {result['1_gpu']}")
    dist.barrier(group=ranks.control_group)
    split_transformer(transformer, HeadSplit(ranks.video_group, ranks.group_rank, ranks.per_video))
    measured, latents = render_segment_path(transformer, vae, latent_frames, height, width, options, device, dtype,
                                            leader=ranks.is_leader)
    peaks = distributed.gather_objects(measured["peak_gib"], ranks)
    if ranks.is_main:
        measured.update(peak_gib_per_gpu=peaks, agreement_vs_1_gpu=agreement(latents, reference))
        result["2_gpus_head_split"] = measured
        result["fps_speedup_2_gpus"] = round(measured["video_fps"] / result["1_gpu"]["video_fps"], 3)
        # the leader decodes every segment while the other rank waits at the next forward's first
        # collective: the decode bounds the speedup (stage 1 alone shows what the split does)
        result["stage1_speedup_2_gpus"] = round(result["1_gpu"]["stage1_s"] / measured["stage1_s"], 3)
        log(f"segment mode, 2 GPUs: {measured}")
        args.result.write_text(json.dumps(result))
    distributed.stop()
    return result


def render_segment_path(transformer, vae, latent_frames, height, width, options, device, dtype, *, leader):
    """Stage 1 of a segment path (CUDA graphs on the GPU) with the leader decoding each segment as it
    comes, as a render does: (figures, the concatenated latents on the CPU)."""
    inputs = bench_segments.path_inputs(transformer, latent_frames, height, width, device, dtype)
    decoder = CausalStreamDecoder(vae) if leader else None
    bench_segments.reset_peak()
    frames, decode_s, kept = 0, 0.0, []
    with torch.no_grad():
        bench_segments.sync()
        started = time.perf_counter()
        for *_, latents in sample_segments(transformer, inputs, segment_bounds(latent_frames, 3),
                                           list(DEFAULT_SEGMENT_TIMESTEPS), options, device,
                                           cuda_graphs=device.type == "cuda"):
            kept.append(latents.float().cpu())
            if decoder is not None:
                bench_segments.sync()
                mid = time.perf_counter()
                frames += len(to_uint8_frames(decoder.decode(latents)))
                bench_segments.sync()
                decode_s += time.perf_counter() - mid
        bench_segments.sync()
        total = time.perf_counter() - started
    figures = {"video_frames": frames, "total_s": round(total, 3), "decode_s": round(decode_s, 3),
               "stage1_s": round(total - decode_s, 3), "video_fps": round(frames / total, 2) if frames else None,
               "peak_gib": round(bench_segments.peak_bytes() / bench_segments.GIB, 3)}
    return figures, torch.cat(kept, dim=2)


# ----------------------------------------------------------------------------- worker: batch
def batch_worker(args) -> dict:
    """`camrender.batch` on 4 short paths: one warm-up video per rank, then the timed batch."""

    ranks = distributed.start("cpu" if args.tiny else None, per_video=args.gpus_per_video)
    model = "tiny" if args.tiny else "release-random"
    defaults = {"model": model, "steps": args.batch_steps, "guidance": 5.0, "frames": 17 if args.tiny else 41,
                "cuda_graphs": True}
    if not args.tiny:
        image = args.scratch / "first.png"
        if ranks.is_main:
            PIL.Image.new("RGB", (1280, 704), (120, 110, 100)).save(image)
        defaults.update(image=str(image), height=704, width=1280)
    dist.barrier(group=ranks.control_group)
    lines = [{"trajectory": str(REPO / "trajectories" / name), "output": str(args.scratch / f"{index}.mp4")}
             for index, name in enumerate(("orbit.json",) * ranks.num_videos + TRAJECTORIES)]
    jobs_file = args.scratch / f"jobs{ranks.rank}.jsonl"
    jobs_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    jobs = read_jobs(jobs_file, job_keys())
    warmup, timed = jobs[:ranks.num_videos], jobs[ranks.num_videos:]

    def load(settings):
        if args.tiny:
            return CamrenderPipeline.from_pretrained(settings=settings, ranks=ranks)
        return CamrenderPipeline(prepare_pipeline(load_release_random(settings, ranks.device), settings, ranks=ranks),
                                 settings, ranks=ranks)

    runner = JobRunner(load, lambda pipe, job: pipe.write(job.request).frames, strict=ranks.per_video > 1)
    executor = TorchrunExecutor(ranks, log)

    def run(job_list):
        planned = plan_jobs(job_list, resolver(defaults)) if ranks.is_main else None
        planned = distributed.broadcast_object(planned, ranks)
        dist.barrier(group=ranks.control_group)
        started = time.perf_counter()
        ran = executor.run([job for job in planned if job.status == "render"], lambda: runner)
        dist.barrier(group=ranks.control_group)
        return planned, ran, time.perf_counter() - started

    load_started = time.perf_counter()
    run(warmup)  # loads the model, compiles the kernels: one video per group
    warm_s = time.perf_counter() - load_started
    planned, ran, seconds = run(timed)
    if ranks.is_main:
        summary = summarize(planned, ran[0], seconds, executor.workers, executor.per_video, ran[1])
        result = {key: summary[key] for key in ("done", "failed", "seconds", "seconds_per_video", "videos_per_minute",
                                                "ranks", "gpus_per_video")}
        result.update(warmup_video_and_load_s=round(warm_s, 1), failures=summary["failures"], steps=args.batch_steps,
                      frames=defaults["frames"])
        args.result.write_text(json.dumps(result))
    distributed.stop()
    return {}


def load_release_random(settings, device):
    """The release-size SANA-WM pipeline with random weights on the rank's GPU, patched as a render
    patches it: the 1.6B DiT and the LTX-2 VAE of the release configs, a tiny tokenizer and a
    one-layer Gemma-2 of the release caption width (its text is noise either way)."""
    # lazy: transformers' Gemma classes are optional here (a transformers without them still runs the other benches)
    from transformers import Gemma2Config, Gemma2ForCausalLM

    device, dtype = torch.device(device), torch.bfloat16
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    with torch.device(device):
        text_encoder = Gemma2ForCausalLM(Gemma2Config(
            vocab_size=len(tokenizer), pad_token_id=0, eos_token_id=1, bos_token_id=2, hidden_size=2304,
            intermediate_size=512, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=64))
        vae = AutoencoderKLLTX2Video(spatial_compression_ratio=32, temporal_compression_ratio=8)
    pipe = SanaWMPipeline(tokenizer=tokenizer, text_encoder=text_encoder.to(dtype).eval(), vae=vae.to(dtype).eval(),
                          transformer=build_model(RELEASE_CONFIG, device, dtype),
                          scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    patch_transformer(pipe.transformer, kernels=settings.kernels)
    return pipe


if __name__ == "__main__":
    main()
