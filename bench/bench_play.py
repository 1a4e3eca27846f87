"""Benchmark of `camrender play` (camrender.play.server): the live server driven by scripted key presses over a
WebSocket client, as a page would drive it.

The server runs in this process (the same `PlayServer` the CLI serves, on 127.0.0.1, random port) and a
WebSocket client in the same event loop connects, presses and releases keys on a schedule (w, d, w, a,
ArrowUp, ... one change every --key-every seconds), receives the JPEG frames and stops after --segments
segments. Two flights:

- paced (the CLI's default: the render stays one segment ahead of real-time playback): key-to-frame
  latency, median and p95, two ways: `arrival` (the press sent -> the JPEG of the first frame reflecting
  it received) and `playback` (-> that frame's turn on a page that plays frames at 16 fps as they arrive),
  in seconds and in segments (1.5 s of video each); the real-time video rate; and after the warm-up, how
  long that page ran out of frames (`stall_s`, over `late_frames` frames that arrived after their turn);
- unpaced (`--no-pace`): the sustained video rate the GPU makes, frames per second of wall time after the
  first two segments (warm-up, CUDA-graph capture), the JPEG encoding and sending included.

Peak memory: torch.cuda.max_memory_allocated on a GPU, the process's peak RSS on a CPU.

    python3 bench/bench_play.py --out $OUT/bench_play.json                 # release size, random weights, one H200
    python3 bench/bench_play.py --refiner --out $OUT/bench_play_refiner.json   # + the release-size refiner (random)
    python3 bench/bench_play.py --refiner --precision fp8 --out $OUT/p.json     # both stages' block linears in FP8
    python3 bench/bench_play.py --tiny                                      # the script's logic on a CPU (tiny model)
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import resource
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import torch
from aiohttp import ClientSession, WSMsgType, web
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from bench_multi_gpu import load_release_random  # noqa: E402
from bench_refiner import as_refiner, build_refiner_transformer, refiner_text  # noqa: E402
from common import emit  # noqa: E402
from play_timeline import recording, summary  # noqa: E402

import camrender.render.stage_two as stage_two_module  # noqa: E402
from camrender.allocator import use_expandable_segments  # noqa: E402
from camrender.cli.play import longest_clip  # noqa: E402
from camrender.render.load_settings import LoadSettings  # noqa: E402
from camrender.model.precision import get_precision  # noqa: E402
from camrender.model.refiner.stream import park_prompt_projections  # noqa: E402
from camrender.play.server import PlayServer  # noqa: E402
from camrender.render.pipeline import load_patched_pipeline, prepare_pipeline  # noqa: E402
from camrender.render.prompt_cache import refiner_key  # noqa: E402
from camrender.render.request import RenderRequest  # noqa: E402
from camrender.trajectory.controls import make_scheme  # noqa: E402

KEYS = ("w", "d", "w", "a", "ArrowUp", "w", "ArrowDown", "ArrowRight", "s", "ArrowLeft")
WARMUP_SEGMENTS = 2


def log(message):
    print(f"bench_play: {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny model on the CPU (checks the script)")
    parser.add_argument("--refiner", action="store_true", help="with stage 2 (release size: random refiner DiT)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp8"),
                        help="both stages' block linears (--stage1-precision / --refiner-precision); fp8: CUDA only")
    parser.add_argument("--segments", type=int, default=24, help="segments per flight")
    parser.add_argument("--key-every", type=float, default=0.7, help="seconds between key changes")
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--timeline", action="store_true",
                        help="also the median seconds from a segment's decision to each stage's end (host and GPU)")
    parser.add_argument("--only", choices=("unpaced", "paced"), default=None, help="fly only this flight")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return parser.parse_args(argv)


def build(args):
    """(pipeline, template request) of the benchmark: tiny on the CPU, or the release size in random weights."""
    height, width = (args.height or 64, args.width or 112) if args.tiny else (args.height or 704, args.width or 1280)
    frames = longest_clip((args.segments + 2) * 1.5, 16.0, 3)
    refiner = ("tiny" if args.tiny else "release-random") if args.refiner else None
    settings = LoadSettings(model="tiny" if args.tiny else "release-random", device="cpu" if args.tiny else "cuda",
                            dtype="auto" if args.tiny else "bfloat16", refiner=refiner, recipe="streaming",
                            stage1_precision=args.precision, refiner_precision=args.precision)
    template = RenderRequest(traj=None, prompt="a city street", steps=None, guidance=None, seed=0, num_frames=frames,
                             height=height, width=width, mode="segments", recipe="streaming", settings=settings)
    if args.tiny:
        return load_patched_pipeline(settings), template

    # the release model needs a first frame (the tiny one renders without): a random image of the render size
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    image = Path(tempfile.mkdtemp(prefix="bench_play_")) / "first.png"  # a path: the saved session names it
    Image.fromarray(pixels.numpy()).save(image)
    template = dataclasses.replace(template, image=str(image))
    pipe = prepare_pipeline(load_release_random(settings, settings.device), settings)  # stage 1 in its precision
    if args.refiner:
        attach_random_refiner(pipe, template)
    return pipe, template


def attach_random_refiner(pipe, template):
    """The release-size refiner DiT in random weights, its prompt random embeddings (1024 tokens, as
    bench_refiner.py: the Gemma-3-12B text encoder is not built), handed over as the prompt encoded at load."""
    device = pipe._execution_device
    transformer = build_refiner_transformer(False, device, torch.bfloat16)
    refiner = as_refiner(transformer)
    text = refiner_text(transformer, 1024, device, torch.bfloat16)
    setattr(refiner, stage_two_module._PROMPT_MEMO, (refiner_key(template), text.embeds, text.mask))
    get_precision(template.settings.refiner_precision).prepare_blocks(refiner.transformer.transformer_blocks,
                                                                      device=device)
    park_prompt_projections(refiner.transformer)  # as load_stage_two
    stage_two_module.attach_refiner(pipe, refiner)


def quantiles(values):
    if not values:
        return {"median": None, "p95": None, "count": 0}
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 4),
            "p95": round(ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))], 4),
            "count": len(ordered)}


async def fly(server: PlayServer, url: str, segments: int, key_every: float, fps: float) -> dict:
    """One flight driven by the key script: frame arrivals, press times, reflected frames -> the figures."""
    arrivals, presses, reflected, segment_times = {}, {}, {}, []
    async with ClientSession() as session, session.ws_connect(url) as ws:
        async def script():
            held, press_id = None, 0
            while True:
                await asyncio.sleep(key_every)
                key = KEYS[press_id % len(KEYS)]
                if held is not None:
                    await ws.send_str(json.dumps({"type": "key", "key": held, "down": False}))
                press_id += 1
                presses[press_id] = time.perf_counter()
                await ws.send_str(json.dumps({"type": "key", "key": key, "down": True, "id": press_id}))
                held = key

        driver = asyncio.create_task(script())
        try:
            async for message in ws:
                if message.type == WSMsgType.BINARY:
                    _, index = struct.unpack("<II", message.data[:8])
                    arrivals[index] = time.perf_counter()
                    continue
                data = json.loads(message.data)
                if data["type"] == "segment":
                    segment_times.append((time.perf_counter(), data["first"], data["count"]))
                    reflected.update({int(k): v for k, v in data["reflected"].items()})
                    if len(segment_times) == segments:
                        driver.cancel()
                        await ws.send_str(json.dumps({"type": "stop"}))
                elif data["type"] == "ended":
                    ended = data
                    break
        finally:
            driver.cancel()
    if not segment_times:
        return {"segments": 0, "error": ended["error"]}
    # playback on a page: each frame shown at 1/fps after the one before, or when it arrives if later
    shown, last = {}, None
    for index in sorted(arrivals):
        last = arrivals[index] if last is None else max(arrivals[index], last + 1.0 / fps)
        shown[index] = last
    arrival_latency = [arrivals[f] - presses[p] for p, f in reflected.items() if p in presses and f in arrivals]
    playback_latency = [shown[f] - presses[p] for p, f in reflected.items() if p in presses and f in shown]
    warm = segment_times[WARMUP_SEGMENTS - 1] if len(segment_times) > WARMUP_SEGMENTS else segment_times[0]
    # each press's playback latency by the video frame that reflects it: which segments the slow ones fall in
    per_press = sorted((f, round(shown[f] - presses[p], 3)) for p, f in reflected.items()
                       if p in presses and f in shown)
    after = [index for index in arrivals if index >= warm[1] + warm[2]]
    span = max(arrivals[i] for i in after) - warm[0] if after else float("nan")
    segment_seconds = 24 / fps
    # after the warm-up: how long the page waited for frames that were due (it had run out of frames)
    stall_s, late, previous = 0.0, 0, None
    for index in sorted(arrivals):
        if previous is not None and index >= warm[1] + warm[2] and arrivals[index] > previous + 1.0 / fps:
            stall_s, late = stall_s + arrivals[index] - (previous + 1.0 / fps), late + 1
        previous = shown[index]
    return {
        "segments": len(segment_times), "frames": ended["frames"], "error": ended["error"],
        "video_fps": round(len(after) / span, 2) if after else None,
        "latency_arrival_s": quantiles(arrival_latency), "latency_playback_s": quantiles(playback_latency),
        "latency_playback_segments": {k: (None if v is None or k == "count" else round(v / segment_seconds, 2))
                                      for k, v in quantiles(playback_latency).items()},
        "presses": len(presses), "stall_s": round(stall_s, 3), "late_frames": late,
        "playback_latency_by_frame": per_press,
    }


async def run(args, pipe, template) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        server = PlayServer(pipe, template, make_scheme("sana-wm"), Path(folder) / "bench", log=log)
        runner = web.AppRunner(server.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"ws://127.0.0.1:{runner.addresses[0][1]}/ws"
        result = {}
        try:
            for name, pace in (("unpaced", False), ("paced", True)):
                if args.only not in (None, name):
                    continue
                server.pace = pace
                log(f"{name} flight of {args.segments} segments")
                with recording() if args.timeline else contextlib.nullcontext() as marks:
                    result[name] = await fly(server, url, args.segments, args.key_every, template.fps)
                    if marks is not None:
                        rows = marks.resolved()
                        result[name]["timeline_s"] = summary(rows, server.flight.path.decided_at, WARMUP_SEGMENTS)
                        result[name]["timeline_rows"] = [{k: round(v - rows[0]["host_ask"], 4) for k, v in row.items()}
                                                         for row in rows]
                log(f"{name}: {result[name]}")
            result["dropped_messages"] = sum(server.dropped.values())
        finally:
            await runner.cleanup()
        return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    use_expandable_segments()  # as the CLI's `camrender play` runs (camrender.allocator)
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("bench_play: no GPU (use --tiny to check the script on a CPU)")
    pipe, template = build(args)
    if torch.cuda.is_available() and not args.tiny:
        torch.cuda.reset_peak_memory_stats()
    result = {"model": template.model, "device": torch.cuda.get_device_name() if not args.tiny else "cpu",
              "size": f"{template.width}x{template.height}", "refiner": template.settings.refiner, "precision": args.precision,
              "segments": args.segments, "key_every_s": args.key_every, "torch": torch.__version__,
              **asyncio.run(run(args, pipe, template))}
    if args.tiny:
        result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    else:
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
