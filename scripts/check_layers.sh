#!/bin/sh
# check_layers.sh [ROOT] — fail when a source file of the library includes a header of a layer
# it may not see. The layers, each seeing only itself and those before it (README "Layout"):
#
#   core            status, dtypes, tensors, files, devices; declares the GPU runtime it calls
#   gpu             the CUDA runtime (implements core/gpu_runtime.h)             sees core
#   linear          the dense products and kernels shared by experts and decoder  sees core
#   experts         the experts front end: layers, registry, context, routers     sees core, linear
#   backends        the dispatch table and the implementations                    sees core, gpu, linear, experts
#                   (backends/cpu and backends/cuda see backends/impl.h but not each other; the table sees both)
#   decoder         the decoder's ops on the CPU and (decoder/cuda) the GPU       sees core, gpu, linear
#   text            the tokenizer (tokenizer.json, PCRE2, utf8proc)               sees core
#   model           checkpoints, config, loader, the step, generation             sees core, gpu, linear, experts, decoder
#   tools           the command line                                              sees the public headers only
#
# Public headers (include/moex.h, include/moex/*.h) may be included from anywhere. Besides the
# layer rule, no file of core includes a CUDA toolkit header. Prints one line per forbidden
# include (file:line: what) and exits 1 if there is any, else prints a summary and exits 0.
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2
[ -d src ] || { echo "check_layers: $root has no src/ folder" >&2; exit 2; }

# may_see LAYER TARGET -> 0 when a file of LAYER may include a header of TARGET
may_see() {
    case "$1:$2" in
    core:core) return 0 ;;
    gpu:core|gpu:gpu) return 0 ;;
    linear:core|linear:linear) return 0 ;;
    experts:core|experts:linear|experts:experts) return 0 ;;
    backends:core|backends:gpu|backends:linear|backends:experts|backends:backends*) return 0 ;;
    backends/cpu:core|backends/cpu:linear|backends/cpu:experts|backends/cpu:backends|backends/cpu:backends/cpu) return 0 ;;
    backends/cuda:core|backends/cuda:gpu|backends/cuda:linear|backends/cuda:experts|backends/cuda:backends|backends/cuda:backends/cuda) return 0 ;;
    decoder:core|decoder:gpu|decoder:linear|decoder:decoder*) return 0 ;;
    decoder/cuda:core|decoder/cuda:gpu|decoder/cuda:linear|decoder/cuda:decoder*) return 0 ;;
    text:core|text:text) return 0 ;;
    model:core|model:gpu|model:linear|model:experts|model:decoder*|model:model) return 0 ;;
    esac
    return 1
}

# layer of a path under src/ ("backends/cpu/eager.c" -> backends/cpu), or of an include target
layer_of() {
    case "$1" in
    backends/cpu/*) echo backends/cpu ;;
    backends/cuda/*) echo backends/cuda ;;
    decoder/cuda/*) echo decoder/cuda ;;
    */*) echo "${1%%/*}" ;;
    *) echo "" ;;
    esac
}

bad=0
checked=0
files=$(cd src && find . -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sed 's|^\./||' | sort)
for f in $files; do
    from=$(layer_of "$f")
    [ -n "$from" ] || { echo "src/$f: a source file outside every layer folder"; bad=1; continue; }
    checked=$((checked + 1))
    # quoted includes: the layer rule
    out=$(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "src/$f" | sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1 \2/')
    while read -r line target; do
        [ -n "$target" ] || continue
        case "$target" in moex.h|moex/*) continue ;; esac
        to=$(layer_of "$target")
        # a bare name is a header of the including file's own folder
        [ -n "$to" ] || to=$from
        if ! may_see "$from" "$to"; then
            echo "src/$f:$line: the $from layer may not include \"$target\" (layer $to)"
            bad=1
        fi
    done <<INCLUDES
$out
INCLUDES
    # core: no CUDA toolkit header
    if [ "$from" = core ] && grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(cuda\|cublas\|nvrtc\|nccl\)' "src/$f" >/dev/null; then
        grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(cuda\|cublas\|nvrtc\|nccl\)' "src/$f" |
            sed "s|^\([0-9]*\):.*|src/$f:\1: core includes a CUDA toolkit header|"
        bad=1
    fi
done
# the command line: public headers and its own only
for f in $(cd tools 2>/dev/null && ls *.c *.h *.cu 2>/dev/null); do
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "tools/$f" | sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1 \2/' |
        while read -r line target; do
            case "$target" in moex.h|moex/*) continue ;; */*) echo "tools/$f:$line: the command line may include only public headers, not \"$target\"" ;; esac
        done | grep . && bad=1
done
if [ $bad -ne 0 ]; then
    echo "check_layers: forbidden includes found (rules: scripts/check_layers.sh)"
    exit 1
fi
echo "check_layers: $checked files of src/ and the command line follow the layer rules"
exit 0
