"""Launch-parameter sweep of the fused camera branch at the release shape (or a segment's, --shape stream), with
errors.

Times the stage (encode) kernel alone for each launch setting, and the whole branch for each
scan/output configuration; checks every configuration's output against the fp32 ieee
reference; prints a table and writes JSON to --out.

    python bench/tune_cam_branch.py --out tune.json
    python bench/tune_cam_branch.py --shape stream --out tune_stream.json   # a segment: B=1, 3 frames, a state
"""
import argparse
import importlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cam_branch as bcb  # noqa: E402

from camrender.kernels.camera_branch_reference import camera_branch_ref  # noqa: E402

cam_prep = importlib.import_module("camrender.kernels.cam_prep")

# (tokens, warps, register cap); a segment's 2640 tokens give 165 programs of 16 tokens on 132 SMs: smaller tiles
# fill the GPU there
STAGE = [(16, 4, None), (16, 8, None), (8, 4, None), (8, 4, 168), (4, 4, None)]
# Per-kernel alternatives to kernels.camera_branch's defaults: (name, kernel, settings); kernel 0 =
# transition, 1 = recurrence, 2 = output (index into num_warps / num_stages), None = stage.
SCAN = [  # most promising first (--budget cuts the tail)
    # the transitions in column blocks (whole programs are the default), and the stage's whole-clip tile against
    # the default that fills the GPU on a segment (equal on a whole clip)
    ("trans_cols2", 0, dict(col_split=2)),
    ("trans_cols4", 0, dict(col_split=4)),
    ("stage_bs16", None, dict(stage_block_s=16)),
    ("rec_tf32", 1, dict(rec_f16=False)),
    ("rec_tf32_w32", 1, dict(rec_f16=False, w_f16=False)),
    ("out_split2", 2, dict(s_split=2)),
    ("rec_w8", 1, dict(warps=8)),
    ("rec_bv64_w8_st1", 1, dict(warps=8, stages=1, block_v=64)),
    ("trans_nosplit", 0, dict(split=False)),
    ("trans_st4", 0, dict(stages=4)),
    ("out_st2", 2, dict(stages=2)),
]
DEFAULT_WARPS, DEFAULT_STAGES = (8, 4, 4), (3, 3, 3)  # kernels.camera_branch's defaults


MAX_REL_L2 = 3e-3  # the camera branch's bound on its error vs the ieee reference


def compose(choices):
    """[(kernel, settings), ...] -> a camera_branch `tuning` dict."""
    warps, stages, tuning = list(DEFAULT_WARPS), list(DEFAULT_STAGES), {}
    for kernel, settings in choices:
        for key, value in settings.items():
            if kernel is None:
                tuning[key] = value
            elif key == "warps":
                warps[kernel] = value
            elif key == "stages":
                stages[kernel] = value
            else:
                tuning[key] = value
    return dict(tuning, num_warps=tuple(warps), num_stages=tuple(stages))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--budget", type=float, default=200.0, help="stop starting new configs after this many s")
    parser.add_argument("--stage", default=None, help="comma list of indices into STAGE")
    parser.add_argument("--scan", default=None, help="comma list of SCAN names")
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU (TRITON_INTERPRET=1), one call each")
    parser.add_argument("--shape", default="release", choices=("release", "stream"), help="bench_cam_branch.SHAPES")
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        bcb.bench_ms = lambda fn, rep=0: (fn(), 0.0)[1]
    t0 = time.time()
    res = dict(shape=args.shape, stage_ms={}, branch={}, errors={})

    def save():
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(res, fh, indent=1)

    shape = bcb.SHAPES["tiny" if args.smoke else args.shape]
    x = bcb.make_inputs(shape, 0, device)
    xb = dict(x, **{k: x[k].to(torch.bfloat16).float() for k in ("q", "k", "v", "beta")})
    torch.backends.cuda.matmul.allow_tf32 = False
    ref, _ = camera_branch_ref(xb["q"], xb["k"], xb["v"], xb["beta"], xb["decay"], xb["rays"],
                                         q_norm_weight=x["qw"], k_norm_weight=x["kw"], initial_state=x["state"])
    xbf = dict(x, **{k: x[k].to(torch.bfloat16) for k in ("q", "k", "v", "beta")})
    out = bcb.ours(xb, torch.float32, "ieee")
    res["errors"]["ieee_fp32_in"] = bcb.rel_err(out, ref)
    print("ieee", res["errors"]["ieee_fp32_in"], flush=True)

    b, t, s, h, d = (shape[k] for k in "BTSHD")
    views = cam_prep.ray_views(x["rays"], b, t * s, d, device)
    stage_sel = STAGE if args.stage is None else [STAGE[int(i)] for i in args.stage.split(",")]
    for bs, nw, regs in stage_sel:
        if time.time() - t0 > args.budget:
            break
        name = f"tiles_bs{bs}_w{nw}" + (f"_r{regs}" if regs else "")
        fn = lambda: cam_prep.cam_stage(xbf["q"], xbf["k"], xbf["v"], views, num_frames=t,  # noqa: E731
                                        q_norm_weight=x["qw"], k_norm_weight=x["kw"], norm_eps=1e-5,
                                        downscale=True, beta=xbf["beta"], out_dtype=torch.float16,
                                        block_s=bs, num_warps=nw, maxnreg=regs)
        try:
            res["stage_ms"][name] = bcb.bench_ms(fn, rep=100)
        except Exception as exc:
            res["stage_ms"][name] = repr(exc)[:300]
        print(f"[{time.time() - t0:6.1f}s] stage {name}: {res['stage_ms'][name]}", flush=True)
        save()

    scan_sel = [("new_default", None, {})] + [c for c in SCAN if args.scan is None or c[0] in args.scan.split(",")]

    def run_config(name, tuning):
        try:
            out = bcb.ours(xbf, torch.bfloat16, "tf32", tuning)
            err = bcb.rel_err(out, ref)
            ms = bcb.bench_ms(lambda: bcb.ours(xbf, torch.bfloat16, "tf32", tuning), rep=100)
            res["branch"][name] = dict(ms=ms, **err, finite=bool(torch.isfinite(out).all().item()),
                                       tuning={k: list(v) if isinstance(v, tuple) else v for k, v in tuning.items()})
        except Exception as exc:
            res["branch"][name] = repr(exc)[:300]
        print(f"[{time.time() - t0:6.1f}s] branch {name}: {res['branch'][name]}", flush=True)
        save()

    def passes(got):
        return isinstance(got, dict) and got["finite"] and got["rel_l2"] <= MAX_REL_L2

    best = {}  # kernel -> (ms, settings)
    for name, kernel, settings in scan_sel:
        if time.time() - t0 > args.budget:
            break
        run_config(name, compose([(kernel, settings)]) if name != "new_default" else compose([]))
        got = res["branch"][name]
        if name != "new_default" and passes(got) and got["ms"] < best.get(kernel, (float("inf"),))[0]:
            best[kernel] = (got["ms"], settings)
    base = res["branch"].get("new_default")
    wins = [(k, v[1]) for k, v in best.items() if isinstance(base, dict) and v[0] < base["ms"] - 0.003]
    if len(wins) > 1:
        run_config("combo_best", compose(wins))
    # The fastest configuration passing the error check (bench_cam_branch.py --tuning-from).
    ok = {name: got for name, got in res["branch"].items() if passes(got)}
    if ok:
        name = min(ok, key=lambda n: ok[n]["ms"])
        res["best"] = dict(name=name, ms=ok[name]["ms"], rel_l2=ok[name]["rel_l2"], tuning=ok[name]["tuning"])
    print("best", json.dumps(res.get("best")), flush=True)
    try:
        if args.smoke:
            raise RuntimeError("no profile on CPU")
        res["breakdown_new_default"] = bcb.kernel_breakdown(lambda: bcb.ours(xbf, torch.bfloat16, "tf32"))
    except Exception as exc:
        res["breakdown_new_default"] = repr(exc)[:300]
    print(json.dumps(res["breakdown_new_default"]), flush=True)
    save()


if __name__ == "__main__":
    main()
