#!/usr/bin/env bash
# The whole test suite: install, build (Release, then ASan+UBSan), run every
# test program in both builds and once more with the portable kernels forced.
# Ends with one line "N passed, S skipped, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
passed=0
skipped=0
failed=0
run_suite() { # name, build dir, env...
  local name=$1 dir=$2
  shift 2
  echo "== $name" >&2
  local log
  log=$(env "$@" ctest --test-dir "$dir" --output-on-failure 2>&1)
  echo "$log"
  local p f
  p=$(echo "$log" | sed -n 's/.* \([0-9]\+\) tests failed out of \([0-9]\+\).*/\2 \1/p')
  if [ -z "$p" ]; then failed=$((failed + 1)); return; fi
  set -- $p
  local s
  s=$(echo "$log" | grep -c '(Skipped)$' || true)  # e.g. the GPU programs on a machine without a GPU
  passed=$((passed + $1 - $2 - s))
  skipped=$((skipped + s))
  failed=$((failed + $2))
}
bash scripts/build.sh build || { echo "0 passed, 0 skipped, 1 failed"; exit 1; }
bash scripts/build.sh build-sanitize -DMOEX_SANITIZE=ON -DMOEX_CUDA=OFF || { echo "0 passed, 0 skipped, 1 failed"; exit 1; }
run_suite "release" build
run_suite "release, portable kernels" build MOEX_CPU_KERNELS=portable
run_suite "asan+ubsan" build-sanitize ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
# The libFuzzer targets of fuzz/ still build (the suite replays their corpora, not the targets
# themselves): one check, skipped without clang 14, its fuzzer runtime and libomp.
echo "== fuzz targets" >&2
if command -v clang-14 >/dev/null 2>&1 && ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
     >/dev/null 2>&1 && [ -e /usr/lib/llvm-14/lib/libomp.so ]; then
  mkdir -p build-fuzz
  if cmake -S . -B build-fuzz -DMOEX_FUZZ=ON -DMOEX_BUILD_TESTS=OFF -DMOEX_CUDA=OFF >build-fuzz/build.log 2>&1 &&
     cmake --build build-fuzz -j"$(nproc)" >>build-fuzz/build.log 2>&1; then
    echo "fuzz targets: built"
    passed=$((passed + 1))
  else
    tail -20 build-fuzz/build.log
    echo "fuzz targets: the build failed (build-fuzz/build.log)"
    failed=$((failed + 1))
  fi
else
  echo "fuzz targets: skipped (clang-14, libclang-rt-14-dev and libomp-14-dev are not all installed)"
  skipped=$((skipped + 1))
fi
echo
echo "$passed passed, $skipped skipped, $failed failed"
[ "$failed" -eq 0 ]
