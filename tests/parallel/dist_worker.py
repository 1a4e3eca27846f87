"""Worker script of tests/parallel/test_distributed.py, run under torchrun (2 processes, gloo, tiny model).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/parallel/dist_worker.py latents OUT.pt \
            float32,float64 [camrender-args...]
        every rank samples a guided full-mode clip with the guidance rows split over the ranks;
        rank 0 also samples it alone (one process, B = 2) and saves all of them to OUT.pt;
        then, with arguments, `camrender` runs them on the same processes
    ... tests/parallel/dist_worker.py fail-rank-1 camrender-args...
        `camrender` with those arguments, where rank 1 raises at its second guidance gather
"""
import contextlib
import os
import sys

import numpy as np
import torch

from camrender.parallel import distributed


def orbit_request():
    from camrender.render.load_settings import LoadSettings
    from camrender.render.request import RenderRequest
    from camrender.trajectory import Trajectory

    frames = 17
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 0.5, frames)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([90.0, 90.0, 56.0, 32.0], (frames, 1)), width=112, height=64, fps=8)
    return RenderRequest(traj=traj, prompt="a room", negative_prompt="blur", steps=3, guidance=4.0, seed=3,
                         num_frames=frames, height=64, width=112,
                         settings=LoadSettings(model="tiny", dtype="float32", device="cpu", kernels="fused",
                                               cuda_graphs=False))


@contextlib.contextmanager
def precision_model(dtype):
    """The tiny model as the agreement checks at `dtype` ("float32" or "float64") use it.

    float32: GDN blocks only. The stock softmax block rounds fp32 q, k and v to bf16 before its
    SDPA (diffusers' SanaWMSoftmaxAttention, which ours follows), so two fp32 renders that differ
    in the last bit anywhere upstream (an all-reduce's summation order, a B=1 against a B=2
    matmul) differ there by bf16 rounding: the one-process segment render moves by 5e-5 under a
    one-ulp change of its noise. float64 (no cast) keeps the softmax block.
    """
    from camrender.model.stage1 import tiny

    saved = tiny.TINY_TRANSFORMER_CONFIG["softmax_every_n"]
    if str(dtype).endswith("float32"):
        tiny.TINY_TRANSFORMER_CONFIG["softmax_every_n"] = 0
    try:
        yield
    finally:
        tiny.TINY_TRANSFORMER_CONFIG["softmax_every_n"] = saved


def latents(out, dtypes):
    from camrender.model.settings import RenderSettings, model_settings
    from camrender.model.stage1.loading import load_pipeline
    from camrender.model.stage1.patch import patch_transformer
    from camrender.render.full import sample_latents

    def sampled(pipe, request, ranks):
        """The clip's latents on the video group of `ranks` (None: this process alone)."""
        settings = RenderSettings.decide(request.settings, stage_one=model_settings(pipe.transformer), ranks=ranks)
        return sample_latents(pipe, request, settings=settings)

    torch.set_num_threads(1)
    ranks = distributed.start("cpu")
    results = {}
    for dtype in dtypes.split(","):
        with precision_model(dtype):
            pipe = load_pipeline("tiny", dtype="float32", device="cpu")
        pipe.to(getattr(torch, dtype))
        patch_transformer(pipe.transformer, kernels="fused")
        gathered = distributed.gather_objects(sampled(pipe, orbit_request(), ranks), ranks)
        if ranks.is_main:  # the same render on this process alone
            results[dtype] = {"ranks": gathered, "alone": sampled(pipe, orbit_request(), None)}
    if ranks.is_main:
        torch.save(results, out)


def fail_rank_1(args):
    from camrender.cli.main import main
    from camrender.parallel import cfg as cfg_parallel

    if os.environ["RANK"] == "1":
        gather, calls = cfg_parallel.CfgSplit.gather, []

        def failing_gather(self, prediction):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("rank 1 fails on purpose")
            return gather(self, prediction)

        cfg_parallel.CfgSplit.gather = failing_gather
    main(args)


if __name__ == "__main__":
    if sys.argv[1] == "latents":
        latents(sys.argv[2], sys.argv[3])
        if sys.argv[4:]:
            from camrender.cli.main import main

            main(sys.argv[4:])
    elif sys.argv[1] == "fail-rank-1":
        fail_rank_1(sys.argv[2:])
    else:
        sys.exit(f"unknown worker task {sys.argv[1]!r}")
