#!/usr/bin/env bash
# The refined pipeline's card-size settings measured side by side in one run on one GPU (about 5 minutes on an
# H200): segment mode with the refiner, 12 segments, for bf16, fp8 and the 24 GB setting (fp8-22gib-stream, under a
# 22 GiB cap; bench/refiner_targets.py holds the settings and their targets), then the refiner alone against the
# official script's stage 2 (diffusers' blocks under torch.compile, max-autotune-no-cudagraphs: the compile takes
# about a minute). Each step runs in its own process (a memory cap stays with a process). The results go into one
# document, $OUT/refiner_targets.json, and the steps' stderr into $OUT/refiner_targets.log: a device call returns at
# most eight files. The document is rewritten after every step, and a step that would start after DEADLINE seconds
# (default 580) is skipped, each step's limit cut to what is left: a device call's limit never takes the document.
#   OUT=/some/folder [DEADLINE=580] bash bench/run_refiner_targets.sh
# SETTINGS: the bench_refiner settings in place of those three; EXTRA_SETTINGS: more after them (e.g.
# fp8-22gib-stream-window11).
# SKIP_OFFICIAL=1 leaves out the official stage 2. QUALITY=1 adds FP8's quality at the release size (bench_fp8.py,
# about a minute).
set -u
source "$(dirname "$0")/steps.sh"
OUT=${OUT:-bench/results}
DEADLINE=${DEADLINE:-580}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
parts=$(mktemp -d)
merge() {  # every step's JSON so far into $OUT/refiner_targets.json; with "print", a line of figures per step
  python3 - "$parts" "$OUT/refiner_targets.json" "${1:-}" <<'PY'
import json, pathlib, sys
parts = {path.stem: json.loads(path.read_text()) for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(parts, indent=1) + "\n")
for name, part in parts.items() if sys.argv[3] == "print" else ():
    summary = part.get("summary") or {k: v.get("s_per_block") for k, v in part.items() if isinstance(v, dict)}
    print(name, json.dumps(summary))
PY
}
step() {  # step SECONDS NAME COMMAND... (the command writes its JSON to $parts/NAME.json)
  local limit=$1 name=$2
  shift 2
  timed_step "$OUT/refiner_targets.log" "$name" 30 "$limit" . "$@"
}
for setting in ${SETTINGS:-bf16 fp8 fp8-22gib-stream} ${EXTRA_SETTINGS:-}; do
  step 150 "$setting" python3 bench/bench_refiner.py --setting "$setting" --segments 12 --skip-layers \
    --out "$parts/$setting.json"
done
if [ "${SKIP_OFFICIAL:-0}" != 1 ]; then
  step 240 official_stage2 python3 bench/bench_official_stage2.py --blocks 2 --out "$parts/official_stage2.json"
fi
if [ "${QUALITY:-0}" = 1 ]; then
  step 120 fp8_quality python3 bench/bench_fp8.py --out "$parts/fp8_quality.json"
fi
merge print
rm -rf "$parts"
