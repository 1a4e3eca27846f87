#!/usr/bin/env bash
# Issue 24's GPU measurements on one H200 in one go (about 6-8 minutes): the target rows (steady video fps and
# peak of bf16, fp8 and two 24 GB candidates under a 22 GiB cap, each with its memory breakdown) and FP8's
# quality at the release size. Each setting runs in its own process (a memory cap stays with a process).
#   OUT=/some/folder bash bench/run_issue24.sh
# OFFICIAL=1 adds the refiner alone: camrender's blocks (bf16, FP8) beside diffusers' under torch.compile
# (max-autotune-no-cudagraphs, as NVlabs' script) - the compile and autotuning take minutes of their own.
set -u
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
step() {  # step SECONDS NAME COMMAND...
  local limit=$1 name=$2
  shift 2
  local began=$SECONDS
  timeout "$limit" "$@" > "$OUT/issue24_$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - began)) s"
  tail -n 3 "$OUT/issue24_$name.log" | cut -c1-300
}
step 180 bf16 python3 bench/bench_refiner.py --setting bf16 --segments 8 --out "$OUT/issue24_bf16.json"
step 100 fp8 python3 bench/bench_refiner.py --setting fp8 --segments 8 --out "$OUT/issue24_fp8.json"
step 80 fp8_quality python3 bench/bench_fp8.py --out "$OUT/issue24_fp8_quality.json"
step 60 fp8_22gib_window2 python3 bench/bench_refiner.py --setting fp8-22gib-window2 --segments 6 \
  --out "$OUT/issue24_fp8_22gib_window2.json"
step 55 fp8_22gib_layers python3 bench/bench_refiner.py --setting fp8-22gib-layers --segments 4 \
  --out "$OUT/issue24_fp8_22gib_layers.json"
if [ "${OFFICIAL:-0}" = 1 ]; then
  step 420 official_stage2 python3 bench/bench_official_stage2.py --out "$OUT/issue24_official_stage2.json"
fi
