#!/usr/bin/env bash
# Stages what the device machine needs beside the checkout for the official rows (run here, not there):
#   .kit/nvlabs-sana-wm   the reference kit's sources and scripts, without its golden files (about 2.5 MB)
#   .whl/                 the pure-Python wheels of the kit's gpu_wheels.txt (diffusers, fla-core, ... : 8.6 MB)
# Both folders are git-ignored: pass them to the device call with carry [".whl", ".kit"], then install there with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   bash bench/stage_device_kit.sh [KIT]      (KIT: default ../shared/reference/nvlabs-sana-wm)
set -euo pipefail
KIT=${1:-../shared/reference/nvlabs-sana-wm}
mkdir -p .kit .whl
rm -rf .kit/nvlabs-sana-wm
tar -C "$(dirname "$KIT")" --exclude=golden --exclude=.site --exclude=__pycache__ -cf - "$(basename "$KIT")" \
  | tar -C .kit -xf -
mv ".kit/$(basename "$KIT")" .kit/nvlabs-sana-wm 2>/dev/null || true
wheels=$(grep -v '^#' "$KIT/gpu_wheels.txt" | grep -v '^$')
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl $wheels
du -sh .kit .whl
