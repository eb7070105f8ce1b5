#!/usr/bin/env bash
# The main job: install, build, and run `moex demo`: generation with the bundled tiny
# model (tests/fixtures/qwen3_moe, written by transformers) through every experts
# backend available on this machine, showing that they agree, with timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
./build/moex demo "$@"
