#!/usr/bin/env bash
# This tree against another, side by side in one run on one GPU (about 7 minutes on an H100): the full-clip step as
# rendered (bench_transformer.py, stage 1 in FP8, CUDA graph; stock diffusers beside it), segment mode (bench_segments:
# stage 1 alone and the render loop, FP8, SEGMENTS segments) and segment mode with the refiner (bench_refiner.py
# --setting fp8, REFINER_SEGMENTS segments). The two trees take turns step by step, each running its own bench
# scripts in its own process, so drift on the card falls on both. The results go into one document,
# $OUT/tree_comparison.json (rewritten after every step, with the new/old ratios), the steps' stderr into
# $OUT/tree_comparison.log; a step that would start after DEADLINE seconds (default 560) is skipped.
#   OUT=/some/folder OLD=.gpu_old [SEGMENTS=12] [REFINER_SEGMENTS=10] [DEADLINE=560] bash bench/run_tree_comparison.sh
# OLD: a folder holding the other tree's camrender/, kernels/, bench/ and pyproject.toml (`git archive REV camrender
# kernels bench pyproject.toml | tar -x -C .gpu_old`). ARGS_TRANSFORMER / ARGS_SEGMENTS / ARGS_REFINER: more arguments
# of each script (the CPU check of this script: ARGS_TRANSFORMER=--tiny ARGS_SEGMENTS=--cpu-smoke ARGS_REFINER=--tiny).
set -u
source "$(dirname "$0")/steps.sh"
OUT=${OUT:-bench/results}
SEGMENTS=${SEGMENTS:-12}
REFINER_SEGMENTS=${REFINER_SEGMENTS:-10}
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
OLD=$(cd "${OLD:?give OLD, the other tree}" && pwd)
parts=$(mktemp -d)
merge() {  # every step's JSON so far, and the new/old ratios of the headline figures, into $OUT/tree_comparison.json
  python3 - "$parts" "$OUT/tree_comparison.json" <<'PY'
import json, pathlib, sys
parts = {path.stem: json.loads(path.read_text()) for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}

def figure(name, part):
    if name.startswith("step"):  # ms per graphed step: lower is better
        return part.get("patched", {}).get("cuda_graph", {}).get("ms_per_step")
    if name.startswith("segments"):  # the render loop's steady video fps
        return part.get("loop", {}).get("overlap", {}).get("video_fps_steady")
    return next((value.get("video_fps_steady") for value in part.values()  # bench_refiner's setting row
                 if isinstance(value, dict) and "video_fps_steady" in value), None)

ratios = {}
for kind in ("step", "segments", "refiner"):
    new, old = (figure(kind, parts.get(f"{kind}_{tree}", {})) for tree in ("new", "old"))
    if new and old:
        ratios[kind] = {"new": new, "old": old, "new_over_old": round(new / old, 4),
                        "better": "lower" if kind == "step" else "higher"}
pathlib.Path(sys.argv[2]).write_text(json.dumps({"ratios": ratios, **parts}, indent=1) + "\n")
print(json.dumps(ratios))
PY
}
step() {  # step NAME LIMIT DIR SCRIPT ARGS...: python3 SCRIPT in DIR, writing $parts/NAME.json
  local name=$1 limit=$2 dir=$3 script=$4
  shift 4
  timed_step "$OUT/tree_comparison.log" "$name" 30 "$limit" "$dir" python3 "$script" "$@" --out "$parts/$name.json"
}
for tree in new old; do
  dir=$PWD; [ "$tree" = old ] && dir=$OLD
  step "step_$tree" 150 "$dir" bench/bench_transformer.py --linear-precision fp8 --no-fp32-reference \
    ${ARGS_TRANSFORMER:-}
done
for tree in new old; do
  dir=$PWD; [ "$tree" = old ] && dir=$OLD
  step "segments_$tree" 150 "$dir" bench/bench_segments.py --skip-full --stage1-precision fp8 --segments "$SEGMENTS" \
    --loop-segments "$SEGMENTS" ${ARGS_SEGMENTS:-}
done
for tree in new old; do
  dir=$PWD; [ "$tree" = old ] && dir=$OLD
  step "refiner_$tree" 180 "$dir" bench/bench_refiner.py --setting fp8 --segments "$REFINER_SEGMENTS" --skip-layers \
    --refiner-kernels fused ${ARGS_REFINER:-}
done
