#!/usr/bin/env bash
# The main job: install, build, and run `moex bench` on a small layer shape on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
./build/moex bench --shape qwen3-30b-a3b --max-experts 16 --tokens 1,8,64 --backends eager,batched_mm,grouped_mm "$@"
