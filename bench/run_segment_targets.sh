#!/usr/bin/env bash
# Segment mode's targets (stage 1 >= 150 fps, the render loop >= 120 video fps, flat memory) measured side by side
# in one run on one GPU (about 9 minutes on an H200): 30 segments (stage 1 alone, stage 1 then decode, the render
# loop with the decode overlapped), stage 1 in FP8 and in bf16, for this tree and, with OLD, the tree before the
# change; NVIDIA's released streaming sampler on the same path lengths (the reference kit's
# bench_official_stage1.py, in its own process) when the kit is beside the checkout (`bash bench/stage_device_kit.sh`
# here, then carry [".whl", ".kit"]). Each step runs in its own process; the results go into one document,
# $OUT/segment_targets.json, and the steps' stderr into $OUT/segment_targets.log.
#   OUT=/some/folder [OLD=.gpu_old] [KIT=.kit/nvlabs-sana-wm] [SEGMENTS=30] bash bench/run_segment_targets.sh
# OLD: a folder holding the old tree's camrender/ and kernels/ (e.g. `git archive REV | tar -x -C .gpu_old`); it runs
# this tree's bench scripts (copied over its own), so both trees are measured by the same code.
# ARGS: more bench_segments arguments for every step (ARGS=--cpu-smoke checks the script on the CPU; PROFILE_ARGS
# the same for profile_segment.py's step, which runs only if a minute is left before the deadline).
# FULL=1 adds the full-clip step as rendered (the <= 420 ms target; bench_transformer.py, FULL_ARGS for more of its
# arguments) for this tree, stage 1 in FP8, before the kernel profile.
# ROWS: the steps to run, by name (default all): e.g. ROWS="new_fp8 old_fp8 new_fp8_profile new_fp8_full_step".
# Order: the FP8 rows (the official sampler beside them), the host profile, the full-clip step (FULL=1), the kernel
# profile, then the bf16 rows.
# DEADLINE (seconds, default 540): a step that would start later is skipped, and each step's limit is cut to what
# is left, so a device call's time limit never takes the document: segment_targets.json is rewritten after every step.
set -u
source "$(dirname "$0")/steps.sh"
OUT=${OUT:-bench/results}
SEGMENTS=${SEGMENTS:-30}
KIT=${KIT:-.kit/nvlabs-sana-wm}
DEADLINE=${DEADLINE:-540}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the old tree's steps run from its folder
parts=$(mktemp -d)
here=$PWD
merge() {  # every step's JSON so far into $OUT/segment_targets.json; with "print", a line of figures per step
  python3 - "$parts" "$OUT/segment_targets.json" "${1:-}" <<'PY'
import json, pathlib, sys
parts = {path.stem: json.loads(path.read_text()) for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(parts, indent=1) + "\n")
for name, part in parts.items() if sys.argv[3] == "print" else ():
    if "stock" in part:  # bench_transformer's full-clip step
        print(name, json.dumps({"stock_ms": part["stock"].get("ms_per_step"),
                                "graphed_ms": part.get("patched", {}).get("cuda_graph", {}).get("ms_per_step")}))
        continue
    loop = part.get("loop", {}).get("overlap", {})
    alone = part.get("stage1_alone", {})
    print(name, json.dumps({"segments": {k: v.get("stage1_fps") for k, v in part.get("segments", {}).items()},
                            "stage1_alone": {k: v.get("stage1_fps") for k, v in alone.items()},
                            "loop": {k: loop.get(k) for k in ("video_fps", "video_fps_steady")},
                            "official": {k: v.get("stage1_fps") for k, v in part.get("official", {}).items()
                                         if isinstance(v, dict)},
                            "host_syncs": (part.get("host_syncs") or {}).get("syncs_per_segment")}))
PY
}
wanted() {  # wanted NAME: is the step in ROWS (or ROWS unset)?
  [ -z "${ROWS:-}" ] || [[ " $ROWS " == *" $1 "* ]]
}
run_script() {  # run_script NAME LEAST LIMIT DIR SCRIPT ARGS...: python3 SCRIPT in DIR, writing $parts/NAME.json,
  # if the step is wanted and LEAST seconds are left before the deadline; its limit is LIMIT seconds or what is left
  local name=$1 least=$2 limit=$3 dir=$4 script=$5
  shift 5
  if ! wanted "$name"; then return; fi
  timed_step "$OUT/segment_targets.log" "$name" "$least" "$limit" "$dir" python3 "$script" "$@" \
    --out "$parts/$name.json"
}
step() {  # step SECONDS NAME DIR ARGS...: bench_segments in DIR
  local limit=$1 name=$2 dir=$3
  shift 3
  run_script "$name" 30 "$limit" "$dir" bench/bench_segments.py --segments "$SEGMENTS" --loop-segments "$SEGMENTS" \
    "$@" ${ARGS:-}
}
if [ -n "${OLD:-}" ]; then mkdir -p "$OLD/bench" && cp bench/*.py "$OLD/bench/"; fi
official=()
if [ -f "$KIT/bench_official_stage1.py" ]; then official=(--official "$here/$KIT" --official-timeout 260); fi
step 390 new_fp8 . --skip-full --stage1-precision fp8 "${official[@]}"
if [ -n "${OLD:-}" ]; then step 120 old_fp8 "$OLD" --skip-full --stage1-precision fp8; fi
# where the warm-up's host time goes: 5 segments, their passes under cProfile (`warmup_host_profile`)
step 150 new_fp8_host_profile . --skip-full --stage1-precision fp8 --segments 5 --loop-segments 0 --host-profile
# the full-clip step as a full-mode render replays it (a CUDA graph; B=2, 161 frames), stage 1 in FP8, beside stock
# diffusers' step (bench_transformer.py, without its float32 reference)
if [ "${FULL:-0}" = 1 ]; then
  run_script new_fp8_full_step 90 200 . bench/bench_transformer.py --linear-precision fp8 --no-fp32-reference \
    ${FULL_ARGS:-}
fi
# one steady segment of this tree by kernel (profile_segment.py), if time is left: which kernels the changes moved
run_script new_fp8_profile 60 120 . bench/profile_segment.py --stage1-precision fp8 --ops 100 ${PROFILE_ARGS:-}
# stage 1 in bf16 last: the FP8 rows and the profiles are what the targets and the next changes need
step 120 new_bf16 . --skip-full
if [ -n "${OLD:-}" ]; then step 120 old_bf16 "$OLD" --skip-full; fi
merge print
rm -rf "$parts"
