"""Throughput of `camrender traj preview` on CPU: proxy-scene rendering and H.264 encoding, per frame.

    python bench/bench_preview.py [TRAJECTORY] [--frames N]

Prints JSON: rendering ms/frame (wall and process CPU, 1 thread and the default thread
count), x264 encoding ms/frame (wall and ffmpeg CPU) for the presets "medium" (x264's
default) and "veryfast" (what the preview asks VideoWriter for), the end-to-end wall time
of `write_preview` per frame, and the real-time budget 1000 / fps. CPU times are the robust figure on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import imageio_ffmpeg  # noqa: E402
import numpy as np  # noqa: E402

from camrender.views.preview import render_frames, write_preview  # noqa: E402
from camrender.trajectory import load  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_render(traj, threads):
    start, cpu = time.perf_counter(), time.process_time()
    frames = [frame for frame in render_frames(traj, threads=threads)]
    n = len(frames)
    return frames, {"wall_ms": 1e3 * (time.perf_counter() - start) / n, "cpu_ms": 1e3 * (time.process_time() - cpu) / n}


def bench_encode(frames, fps, preset, path):
    height, width = frames[0].shape[:2]
    cpu0, start = _children_cpu(), time.perf_counter()
    writer = imageio_ffmpeg.write_frames(
        path, (width, height), fps=fps, codec="libx264", pix_fmt_out="yuv420p", quality=None, macro_block_size=1,
        ffmpeg_log_level="error", output_params=["-crf", "18", "-preset", preset, "-f", "mp4"],
    )
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame))
    writer.close()
    n = len(frames)
    size = os.path.getsize(path)
    os.unlink(path)
    return {"wall_ms": 1e3 * (time.perf_counter() - start) / n, "ffmpeg_cpu_ms": 1e3 * (_children_cpu() - cpu0) / n,
            "bytes_per_frame": size // n}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trajectory", nargs="?", default=os.path.join(ROOT, "trajectories", "orbit.json"))
    parser.add_argument("--frames", type=int, default=49, help="first N frames of the path")
    args = parser.parse_args()
    traj = load(args.trajectory)
    n = min(args.frames, traj.num_frames)
    traj = traj.replace(c2w=traj.c2w[:n], intrinsics=traj.intrinsics[:n])
    frames, one = bench_render(traj, threads=1)
    _, default = bench_render(traj, threads=None)
    encode = {p: bench_encode(frames, traj.fps, p, f"/tmp/bench_preview_{os.getpid()}.mp4") for p in ("medium", "veryfast")}
    out = f"/tmp/bench_preview_{os.getpid()}_e2e.mp4"
    start = time.perf_counter()
    write_preview(traj, out)  # what `camrender traj preview` does, with today's VideoWriter
    end_to_end = 1e3 * (time.perf_counter() - start) / n
    os.unlink(out)
    print(json.dumps({
        "trajectory": os.path.basename(args.trajectory), "frames": n, "size": [traj.width, traj.height],
        "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
        "realtime_budget_ms": 1e3 / traj.fps,
        "render_1_thread": one, "render_default_threads": default, "encode": encode,
        "write_preview_wall_ms": end_to_end,
    }, indent=1))


if __name__ == "__main__":
    main()
