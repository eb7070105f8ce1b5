#!/usr/bin/env bash
# Install what building and testing moex needs on Debian 12 (run as root).
# Skips apt-get when everything is already there. PCRE2 and utf8proc give the tokenizer,
# OpenMPI `moex generate --ep-mpi` (and its test, skipped without it), clang 14 with its fuzzer
# runtime and libomp the fuzz targets (the test suite checks that they build); without them moex
# builds all the same (each says what to install), so a failure to install only those is a warning.
set -euo pipefail
required=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libcmocka-dev)
optional=(libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin clang-14 libclang-rt-14-dev libomp-14-dev)
missing_of() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
missing=($(missing_of "${required[@]}") $(missing_of "${optional[@]}"))
if [ ${#missing[@]} -gt 0 ]; then
  echo "moex setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    still=($(missing_of "${required[@]}"))
    if [ ${#still[@]} -gt 0 ]; then
      apt-get install -y -qq --no-install-recommends "${still[@]}" >/dev/null
    fi
    echo "moex setup: warning: $(missing_of "${optional[@]}" | tr '\n' ' ')not installed: the tokenizer (PCRE2, utf8proc), --ep-mpi (OpenMPI) or the fuzz targets' build check (clang) is left out" >&2
  fi
fi
