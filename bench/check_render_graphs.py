"""Render the same path with and without CUDA-graph replay and compare the frames (GPU).

Runs the render paths the CLI runs (`camrender.render.full.render_frames`: full mode and segment
mode) on a pipeline (default: the built-in tiny model), patched with the fused kernels, once with
`cuda_graphs=True` and once with False, and prints JSON: per mode the number of frames and the max
|difference| of the uint8 frames (0 expected: replay runs the same kernels on the same inputs).
The seconds are informative only: the eager render runs first and includes compiling the
kernels, the graphed one is timed on its second run. No video file is written.

    python3 bench/check_render_graphs.py --traj trajectories/orbit.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import emit  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traj", default="trajectories/orbit.json")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cuda", help="cuda (cpu only checks this script: no graphs there)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from camrender import trajectory
    from camrender.model.loading import load_pipeline
    from camrender.model.patch import patch_transformer
    from camrender.render.request import RenderRequest
    from camrender.render.full import render_frames

    cuda = args.device.startswith("cuda")
    pipe = load_pipeline(args.model, device=args.device)
    patch_transformer(pipe.transformer, kernels="fused")
    pipe.set_progress_bar_config(disable=True)
    traj = trajectory.to_model_frames(trajectory.load(args.traj), None)
    base = RenderRequest(traj=traj, steps=10, guidance=5.0, num_frames=traj.num_frames, height=64, width=112,
                         model=args.model, device=args.device)
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "model": args.model,
              "frames": traj.num_frames}
    for mode in ("full", "segments"):
        videos, seconds = {}, {}
        for graphs in (False, True, True):  # the second graphed render runs on warm kernels
            request = dataclasses.replace(base, mode=mode, cuda_graphs=graphs,
                                          steps=None if mode == "segments" else base.steps)
            began = time.perf_counter()
            videos[graphs] = np.concatenate(list(render_frames(pipe, request)))  # frames are on the host: synced
            seconds[graphs] = round(time.perf_counter() - began, 3)
        difference = int(np.abs(videos[True].astype(int) - videos[False].astype(int)).max())
        result[mode] = {"frames": len(videos[True]), "max_abs_diff_uint8": difference,
                        "seconds_eager": seconds[False], "seconds_graphs": seconds[True]}
        print(json.dumps({mode: result[mode]}), flush=True)
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
