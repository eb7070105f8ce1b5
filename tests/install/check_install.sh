#!/bin/sh
# check_install.sh BUILD_DIR CONSUMER_C [CFLAGS] — install BUILD_DIR into a temporary prefix, then build
# CONSUMER_C with the installed pkg-config file and run it against the installed shared library.
# Exits 77 (skipped) where there is no pkg-config.
set -eu
build=$1 src=$2 extra=${3:-}
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: no pkg-config on this machine"; exit 77; }
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name moex.pc | head -1)
[ -n "$pc" ] || { echo "no moex.pc installed under the prefix"; exit 1; }
for h in moex.h moex/base.h moex/experts.h moex/backend.h moex/model.h; do
    [ -f "$prefix/include/$h" ] || { echo "include/$h was not installed"; exit 1; }
done
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir moex)
cc -std=c11 -Wall -Werror $extra "$src" $(pkg-config --cflags --libs moex) -Wl,-rpath,"$libdir" -o "$prefix/consumer"
"$prefix/consumer"
