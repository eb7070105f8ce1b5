#!/usr/bin/env bash
# Install what building and testing moex needs on Debian 12 (run as root).
# Skips apt-get when everything is already there.
set -euo pipefail
packages=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libcmocka-dev libpcre2-dev libutf8proc-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "moex setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
