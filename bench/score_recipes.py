"""Score the three bidirectional recipes and the streaming checkpoint on SANA-WM-Bench, with real weights.

    python3 bench/score_recipes.py data/SANA-WM-Bench --results results/recipes \\
        --bidirectional Efficient-Large-Model/SANA-WM_bidirectional-diffusers --streaming SANA-WM_streaming \\
        [--refiner SANA-WM_streaming/refiner_diffusers] [--split simple_60s] [--gpus 8] [--scenes 8] \\
        [--methods bidirectional,streaming] [--backend pi3] [--dry-run]

For each method (docs/recipes.md, "Which recipe follows the camera best"): every scene of the split as a camrender
path (`RESULTS/inputs/<split>/<scene>.traj.json`: the benchmark's camera with its image and prompt), one
`camrender batch` jobs file rendering them with the benchmark's settings into
`RESULTS/<method>/<split>/<scene>_generated.mp4` (a re-run skips the videos already there),
`RESULTS/<method>/method_info.json`, then `camrender eval` of that folder against the split's manifest. At the
end `RESULTS/<split>.md` sets the methods' tables side by side. --dry-run prints the commands (after writing the
paths and jobs files they read).

The benchmark renders with 60 steps, guidance 5, flow shift 8.0 (the recipes' own is NVlabs' 9.8), seed 42 and
the refiner; the streaming checkpoint keeps its own 4-step sampler.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camrender.trajectory import save  # noqa: E402
from camrender.trajectory.formats.sana_wm_bench import read_bench  # noqa: E402

SPLITS = {"simple_60s": "benchmark_v2_smooth_60s", "hard_60s": "benchmark_v2_hard_60s"}
BIDIRECTIONAL_SETTINGS = ["--steps", "60", "--guidance", "5"]
BENCH_SEED, BENCH_FLOW_SHIFT = "42", "8.0"


def methods(args) -> dict:
    """{method: camrender render options choosing its weights and recipe}."""
    bidirectional = ["--model", args.bidirectional]
    streaming = Path(args.streaming) if args.streaming else None
    table = {name: bidirectional + ["--recipe", name] + BIDIRECTIONAL_SETTINGS
             for name in ("bidirectional", "bidirectional-nvlabs-latest", "bidirectional-diffusers")}
    if streaming is not None:
        table["streaming"] = bidirectional + ["--transformer-weights", str(streaming / "sana_dit" / "model.pt"),
                                              "--vae", str(streaming / "ltx2_causal_vae")]
    chosen = args.methods.split(",") if args.methods else list(table)
    unknown = [name for name in chosen if name not in table]
    if unknown:
        sys.exit(f"score_recipes: unknown or unavailable methods {unknown} (have {list(table)}; streaming needs "
                 "--streaming)")
    return {name: table[name] for name in chosen}


def run(command: list, dry_run: bool, ok_codes=(0,)) -> int:
    print("+ " + shlex.join(str(part) for part in command), flush=True)
    if dry_run:
        return 0
    code = subprocess.call([str(part) for part in command], cwd=ROOT)
    if code not in ok_codes:
        sys.exit(f"score_recipes: exit code {code} from the command above")
    return code


def write_inputs(bench: Path, split: str, folder: Path, limit: int | None) -> tuple[Path, list]:
    """The split's manifest and its scenes (the first `limit`) as camrender paths in `folder`: [(scene, path)]."""
    manifest = bench / SPLITS[split] / "sanawm_export_v2" / "run_manifest.jsonl"
    scenes = read_bench(manifest)[:limit]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for scene in scenes:
        path = folder / f"{scene.scene_id}.traj.json"
        if not path.exists():
            save(scene.traj, path)
        paths.append((scene, path))
    return manifest, paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", type=Path, help="the SANA-WM-Bench release folder (images/, benchmark_v2_*/)")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "recipes")
    parser.add_argument("--split", choices=sorted(SPLITS), default="simple_60s")
    parser.add_argument("--bidirectional", default="Efficient-Large-Model/SANA-WM_bidirectional-diffusers",
                        help="the bidirectional diffusers folder or hub id (every method's pipeline)")
    parser.add_argument("--streaming", default=None, help="the SANA-WM_streaming folder (sana_dit/, ltx2_causal_vae/)")
    parser.add_argument("--refiner", default=None, help="stage 2 for every method, as the benchmark renders")
    parser.add_argument("--methods", default=None, help="comma-separated subset of the methods")
    parser.add_argument("--scenes", type=int, default=None, help="only the first N scenes (a quick comparison)")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--backend", default="colmap", help="camrender eval's pose estimator (the benchmark's: pi3)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()

    chosen = methods(args)
    camrender = [sys.executable, "-m", "camrender"]
    shift = ["--flow-shift", BENCH_FLOW_SHIFT]
    results = args.results.resolve()
    manifest, paths = write_inputs(args.bench.resolve(), args.split, results / "inputs" / args.split, args.scenes)
    tables = []
    for method, options in chosen.items():
        videos = results / method / args.split
        videos.mkdir(parents=True, exist_ok=True)
        jobs = results / method / f"{args.split}.jobs.jsonl"
        jobs.write_text("".join(json.dumps({"trajectory": str(path), "output": str(videos / scene.output_name)}) + "\n"
                                for scene, path in paths))
        info = {"model": args.bidirectional, "variant": method, "fps": 16, "resolution": "704x1280",
                "camrender_options": options}
        if args.refiner:
            info["refiner"] = args.refiner
        (results / method / "method_info.json").write_text(json.dumps(info, indent=1) + "\n")
        render = options + (shift if method != "streaming" else []) + ["--seed", BENCH_SEED]
        render += ["--refiner", args.refiner] if args.refiner else []
        run(camrender + ["batch", jobs, "--gpus", args.gpus, "--progress", "lines", *render], args.dry_run)
        run(camrender + ["eval", videos, "--manifest", manifest, "--backend", args.backend, "--progress", "lines"],
            args.dry_run, ok_codes=(0, 3))  # 3: some estimate failed, the table says which
        tables.append(videos / "eval_aggregate.json")
    if args.dry_run:
        return
    from camrender.eval.aggregate import markdown

    records = [record for table in tables for record in json.loads(table.read_text())["records"]]
    out = results / f"{args.split}.md"
    out.write_text(markdown(records))
    print(f"score_recipes: wrote {out}")
    print(out.read_text())


if __name__ == "__main__":
    main()
