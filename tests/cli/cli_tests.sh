#!/usr/bin/env bash
# tests/cli/cli_tests.sh GROUP MOEX FIXTURE_DIR: one group of checks of the command line
# (ctest runs each group as a test of its own; see CMakeLists.txt). Exit 0 when every check
# of the group passes, else 1 after naming each failed check.
set -u
group=$1 moex=$2 fx=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/moex_cli.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failed=0

# A tiny bench: about 2 s, most of it the ceilings.
bench=(bench --shape qwen3-30b-a3b --tokens 3 --backends grouped_mm --max-experts 4)

# check RC WANT_RC REGEX [NOT_REGEX]: the command just run exited WANT_RC and its stderr
# (in the file err) matches REGEX (grep -E) and not NOT_REGEX nor a sanitizer's report.
check() {
    local rc=$1 want=$2 re=$3 not=${4:-} where=${what:-line ${BASH_LINENO[0]}} bad=
    if grep -Eq 'Sanitizer|runtime error:' err; then
        bad="a sanitizer report"
    elif [ "$rc" != "$want" ]; then
        bad="exit status $rc, expected $want"
    elif [ -n "$re" ] && ! grep -Eq -- "$re" err; then
        bad="stderr does not match /$re/"
    elif [ -n "$not" ] && grep -Eq -- "$not" err; then
        bad="stderr matches /$not/"
    fi
    if [ -n "$bad" ]; then
        echo "FAIL ($where): $bad; stderr:"
        sed 's/^/  | /' err
        failed=1
    fi
}

# refused WANT_RC REGEX ARGS...: moex ARGS exits WANT_RC with REGEX on stderr.
refused() {
    local want=$1 re=$2
    shift 2
    "$moex" "$@" >out 2>err
    what="moex $*" check $? "$want" "$re"
}

# accepted ARGS...: moex ARGS exits 0.
accepted() {
    "$moex" "$@" >out 2>err
    what="moex $*" check $? 0 ''
}

case $group in
stdout_errors)
    # a full disk (/dev/full) or a closed stdout: exit 1 and say so, for every command
    full='moex: writing the output: No space left on device'
    closed='moex: writing the output: Bad file descriptor'
    "$moex" generate "$fx" --prompt-ids 1,2 --max-new-tokens 2 --json >/dev/full 2>err
    check $? 1 "$full"
    "$moex" generate "$fx" --prompt-ids 1,2 --max-new-tokens 2 --json >&- 2>err
    check $? 1 "$closed"
    "$moex" generate "$fx" --prompt-ids 1,2 --max-new-tokens 2 >/dev/full 2>err
    check $? 1 "$full"
    "$moex" info "$fx" >/dev/full 2>err
    check $? 1 "$full"
    "$moex" info "$fx" >&- 2>err
    check $? 1 "$closed"
    "$moex" backends >/dev/full 2>err
    check $? 1 "$full"
    "$moex" version >/dev/full 2>err
    check $? 1 "$full"
    "$moex" version >&- 2>err
    check $? 1 "$closed"
    "$moex" help >/dev/full 2>err
    check $? 1 "$full"
    "$moex" bench --help >/dev/full 2>err
    check $? 1 "$full"
    "$moex" demo "$fx" >/dev/full 2>err
    check $? 1 "$full"
    # the bench stops at its first line that cannot be written, before the ceilings are timed
    "$moex" "${bench[@]}" >/dev/full 2>err
    check $? 1 "$full" 'measuring ceilings'
    "$moex" "${bench[@]}" >&- 2>err
    check $? 1 "$closed" 'measuring ceilings'
    # and a good stdout is still fine
    "$moex" generate "$fx" --prompt-ids 1,2 --max-new-tokens 2 --json >out 2>err
    check $? 0 ''
    grep -q '^{"new_ids":\[\[' out || { echo "FAIL: no JSON on stdout"; failed=1; }
    ;;

bench_file_errors)
    # --csv to a device that is full, --plot to a regular file over the size limit: both
    # reported by flag and name, exit 1; the device stays a device, the old plot stays whole
    # and no temp file is left. (As root a private node is made here, never /dev/full itself:
    # a moex that renamed over its target would replace it.)
    if [ "$(id -u)" = 0 ] && mknod full c 1 7 2>/dev/null; then dev=full; else dev=/dev/full; fi
    echo old >plot.svg
    (trap '' XFSZ; ulimit -f 2; exec "$moex" "${bench[@]}" --csv "$dev" --plot plot.svg) >out 2>err
    rc=$?
    check $rc 1 "--csv: cannot write \"$dev\": No space left on device"
    check $rc 1 '--plot: cannot write "plot.svg": File too large'
    [ -c "$dev" ] || { echo "FAIL: $dev is no longer a character device"; failed=1; }
    [ "$(cat plot.svg)" = old ] || { echo "FAIL: plot.svg was changed"; failed=1; }
    if ls ./*.tmp.* >/dev/null 2>&1; then echo "FAIL: a temp file was left:" ./*.tmp.*; failed=1; fi
    ;;

bench_same_file)
    # --csv and --plot naming one file, by any spelling: refused before anything is timed
    mkdir sub
    same='--csv "[^"]*" and --plot "[^"]*" name the same file'
    "$moex" "${bench[@]}" --csv x --plot ./x >out 2>err
    check $? 2 "$same" 'measuring ceilings'
    "$moex" "${bench[@]}" --csv x --plot sub/../x >out 2>err
    check $? 2 "$same" 'measuring ceilings'
    "$moex" "${bench[@]}" --csv "$work/x" --plot x >out 2>err
    check $? 2 "$same" 'measuring ceilings'
    [ ! -e x ] || { echo "FAIL: x was written"; failed=1; }
    echo keep >y
    ln y z
    ln -s y link
    ln -s sub subdir
    echo keep >sub/w
    "$moex" "${bench[@]}" --csv y --plot z >out 2>err
    check $? 2 "$same" 'measuring ceilings'
    "$moex" "${bench[@]}" --csv link --plot y >out 2>err
    check $? 2 "$same" 'measuring ceilings'
    "$moex" "${bench[@]}" --csv sub/w --plot subdir/w >out 2>err
    check $? 2 "$same" 'measuring ceilings'
    [ "$(cat y)" = keep ] && [ "$(cat sub/w)" = keep ] || { echo "FAIL: a file was overwritten"; failed=1; }
    # the file that stdout writes to
    "$moex" "${bench[@]}" --csv y >y 2>err
    check $? 2 '--csv "y" is the file that stdout writes to' 'measuring ceilings'
    ;;

numbers_generate)
    # integers: digits only; lists: no empty items; floats: out of range is not "not a number"
    g=(generate "$fx" --max-new-tokens 2)
    refused 2 'moex generate: --prompt-ids: "1,2," has an empty item' "${g[@]}" --prompt-ids 1,2,
    refused 2 'moex generate: --prompt-ids: "1,,2" has an empty item' "${g[@]}" --prompt-ids 1,,2
    refused 2 'moex generate: --prompt-ids: ",1" has an empty item' "${g[@]}" --prompt-ids ,1
    refused 2 'moex generate: --prompt-ids: " 1": " 1" is not a token id' "${g[@]}" --prompt-ids " 1"
    refused 2 'moex generate: --prompt-ids: "1, 2": " 2" is not a token id' "${g[@]}" --prompt-ids "1, 2"
    refused 2 'moex generate: --prompt-ids: "\+1": "\+1" is not a token id' "${g[@]}" --prompt-ids +1
    refused 2 'moex generate: --prompt-ids: "2147483648": "2147483648" is not a token id' "${g[@]}" --prompt-ids 2147483648
    refused 2 'moex generate: --prompt-ids: "" is empty' "${g[@]}" --prompt-ids ""
    p=(generate "$fx" --prompt-ids 1,2)
    refused 2 'moex generate: --max-new-tokens: " 2" is not a non-negative integer' "${p[@]}" --max-new-tokens " 2"
    refused 2 'moex generate: --max-new-tokens: "2 " is not a non-negative integer' "${p[@]}" --max-new-tokens "2 "
    refused 2 'moex generate: --max-new-tokens: "\+2" is not a non-negative integer' "${p[@]}" --max-new-tokens +2
    refused 2 'moex generate: --max-new-tokens: "-1" is not a non-negative integer' "${p[@]}" --max-new-tokens -1
    refused 2 'moex generate: --max-new-tokens: "99999999999999999999" is too large' "${p[@]}" --max-new-tokens 99999999999999999999
    refused 2 'moex generate: --warmup: " 1" is not a non-negative integer' "${p[@]}" --warmup " 1"
    refused 2 'moex generate: --threads: "1," is not a non-negative integer' "${p[@]}" --threads 1,
    refused 2 'moex generate: --top-k: " 3" is not a non-negative integer' "${p[@]}" --temperature 1 --top-k " 3"
    refused 2 'moex generate: --seed: "-1" is not a non-negative integer' "${p[@]}" --temperature 1 --seed -1
    refused 2 'moex generate: --seed: "18446744073709551616" is too large' "${p[@]}" --temperature 1 --seed 18446744073709551616
    refused 2 'moex generate: --top-p: "1e39" is out of range' "${p[@]}" --temperature 1 --top-p 1e39
    refused 2 'moex generate: --temperature: "1e39" is out of range' "${p[@]}" --temperature 1e39
    refused 2 'moex generate: --temperature: "-1e39" is out of range' "${p[@]}" --temperature -1e39
    refused 2 'moex generate: --temperature: "abc" is not a number' "${p[@]}" --temperature abc
    refused 2 'moex generate: --temperature: "1x" is not a number' "${p[@]}" --temperature 1x
    refused 2 'moex generate: --temperature: " 1" is not a number' "${p[@]}" --temperature " 1"
    refused 2 'moex generate: --temperature: "" is not a number' "${p[@]}" --temperature ""
    refused 2 'moex generate: --temperature: "nan" is not a finite number' "${p[@]}" --temperature nan
    refused 2 'moex generate: --temperature: "inf" is not a finite number' "${p[@]}" --temperature inf
    refused 2 'moex generate: --top-p: "inf" is not a finite number' "${p[@]}" --temperature 1 --top-p inf
    refused 2 'moex generate: --top-p: "nan" is not a finite number' "${p[@]}" --temperature 1 --top-p nan
    refused 2 'moex generate: --temperature: "-0.5" is negative' "${p[@]}" --temperature -0.5
    refused 2 'moex generate: --top-p: "1.5" is not in \(0, 1\]' "${p[@]}" --temperature 1 --top-p 1.5
    refused 2 'moex generate: --top-p: "0" is not in \(0, 1\]' "${p[@]}" --temperature 1 --top-p 0
    # what is a number still is
    accepted generate "$fx" --prompt-ids 0,1,2 --max-new-tokens 2 --warmup 0 --threads 1
    accepted "${p[@]}" --max-new-tokens 2 --temperature 0.7 --top-k 3 --top-p 0.9 --seed 18446744073709551615
    accepted "${p[@]}" --max-new-tokens 2 --temperature 1e-3 --top-p 1
    ;;

numbers_bench)
    b=(bench --shape qwen3-30b-a3b)
    refused 2 'moex bench: --tokens: "1,2," has an empty item' "${b[@]}" --tokens 1,2,
    refused 2 'moex bench: --tokens: "1,,2" has an empty item' "${b[@]}" --tokens 1,,2
    refused 2 'moex bench: --tokens: ",1" has an empty item' "${b[@]}" --tokens ,1
    refused 2 'moex bench: --tokens: " 1" is not a positive integer' "${b[@]}" --tokens " 1"
    refused 2 'moex bench: --tokens: "\+1" is not a positive integer' "${b[@]}" --tokens +1
    refused 2 'moex bench: --tokens: "99999999999999999999" is too large \(at most 16777216\)' "${b[@]}" --tokens 99999999999999999999
    t=("${b[@]}" --tokens 1)
    refused 2 'moex bench: --max-experts: " 4" is not a positive integer' "${t[@]}" --max-experts " 4"
    refused 2 'moex bench: --max-experts: "99999999999999999999" is too large' "${t[@]}" --max-experts 99999999999999999999
    refused 2 'moex bench: --threads: "2," is not a positive integer' "${t[@]}" --threads 2,
    refused 2 'moex bench: --threads: "99999999999999999999" is too large \(at most 4096\)' "${t[@]}" --threads 99999999999999999999
    refused 2 'moex bench: --runs: " 10" is not a positive integer' "${t[@]}" --runs " 10"
    refused 2 'moex bench: --runs: "99999999999999999999" is too large \(at most 100000\)' "${t[@]}" --runs 99999999999999999999
    refused 2 'moex bench: --seed: " 1" is not an unsigned 64-bit integer' "${t[@]}" --seed " 1"
    refused 2 'moex bench: --seed: "18446744073709551616" is too large' "${t[@]}" --seed 18446744073709551616
    refused 2 'moex bench: --skew: "-1" is not a number from 0 to 8' "${t[@]}" --skew -1
    refused 2 'moex bench: --skew: "8.5" is not a number from 0 to 8' "${t[@]}" --skew 8.5
    refused 2 'moex bench: --skew: "nan" is not a number from 0 to 8' "${t[@]}" --skew nan
    refused 2 'moex bench: --skew: " 1" is not a number from 0 to 8' "${t[@]}" --skew " 1"
    c=("${t[@]}" --device cuda)
    refused 2 'moex bench: --backend-max-tokens: "eager=5," has an empty item' "${c[@]}" --backend-max-tokens eager=5,
    refused 2 'moex bench: --backend-max-tokens: " 5" is not a positive integer' "${c[@]}" --backend-max-tokens "eager= 5"
    refused 2 'moex bench: --backend-max-tokens: "99999999999999999999" is too large' "${c[@]}" --backend-max-tokens eager=99999999999999999999
    ;;

foreign_flags)
    # each command takes its own options only
    for f in --prompt-ids --max-new-tokens --temperature --top-k --top-p --seed --threads --warmup \
             --dtype --quantize; do
        refused 2 "moex info: option \"$f\" is not taken by this command" info "$fx" "$f" 1
    done
    for f in --json --logits --ignore-eos --no-decode-switch --cuda-graph --dequantize; do
        refused 2 "moex info: option \"$f\" is not taken by this command" info "$fx" "$f"
    done
    refused 2 'moex info: option "--prompt-ids" is not taken by this command' \
        info "$fx" --prompt-ids 1 --max-new-tokens 5 --json --temperature 2
    refused 2 'moex info: unknown option "--bogus"' info "$fx" --bogus
    accepted info "$fx" --experts eager --device cpu
    refused 2 'moex demo: option "--json" is not taken by this command' demo --json
    refused 2 'moex demo: option "--json" is not taken by this command' demo "$fx" --json
    refused 2 'moex demo: unexpected argument "extra"' demo "$fx" extra
    refused 2 'moex backends: argument "extra" is not taken by this command' backends extra
    refused 2 'moex backends: option "--json" is not taken by this command' backends --json
    refused 2 'moex version: argument "extra" is not taken by this command' version extra
    refused 2 'moex help: option "--all" is not taken by this command' help --all
    accepted backends
    accepted version
    # an option given twice: the first would be ignored
    g=(generate "$fx" --prompt-ids 1,2 --max-new-tokens 2)
    refused 2 'moex generate: --max-new-tokens is given more than once' "${g[@]}" --max-new-tokens 3
    refused 2 'moex generate: --json is given more than once' "${g[@]}" --json --json
    refused 2 'moex info: --device is given more than once' info "$fx" --device cpu --device cpu
    refused 2 'moex bench: --runs is given more than once' bench --shape qwen3-30b-a3b --tokens 1 --runs 10 --runs 20
    refused 2 'moex bench: --csv is given more than once' bench --shape qwen3-30b-a3b --tokens 1 --csv a --csv b
    accepted "${g[@]}" --prompt-ids 3,4
    # options that would have no effect together
    refused 2 'moex generate: --top-k has no effect without --temperature above 0' "${g[@]}" --top-k 5
    refused 2 'moex generate: --top-p has no effect without --temperature above 0' "${g[@]}" --top-p 0.5
    refused 2 'moex generate: --seed has no effect without --temperature above 0' "${g[@]}" --temperature 0 --seed 5
    refused 2 'moex generate: --logits needs --json' "${g[@]}" --logits
    refused 2 'moex generate: --cuda-graph needs --device cuda' "${g[@]}" --cuda-graph
    refused 2 'moex generate: --no-decode-switch applies to --device cuda only' "${g[@]}" --no-decode-switch
    refused 2 'moex generate: --dequantize and --quantize exclude each other' "${g[@]}" --quantize fp8 --dequantize
    refused 2 'moex generate: --experts needs a value' "${g[@]}" --experts --json
    accepted "${g[@]}" --json --logits
    ;;

text)
    # tokenize and text prompts, on the fixture's byte-level tokenizer.json (token b = byte b)
    "$moex" tokenize "$fx" "Hi there" >out 2>err
    if grep -q "has no tokenizer" err; then echo "text: skipped (this build has no tokenizer)"; exit 0; fi
    check $? 0 ''
    grep -qx '72,105,32,116,104,101,114,101' out || { echo "FAIL: tokenize \"Hi there\": $(cat out)"; failed=1; }
    "$moex" tokenize "$fx" --decode 72,105 >out 2>err
    check $? 0 ''
    grep -qx 'Hi' out || { echo "FAIL: tokenize --decode 72,105: $(cat out)"; failed=1; }
    printf 'a\tb\n' >prompt.txt
    "$moex" tokenize "$fx" --file prompt.txt --json >out 2>err
    check $? 0 ''
    grep -q '"ids":\[97,9,98,10\]' out || { echo "FAIL: tokenize --file: $(cat out)"; failed=1; }
    refused 2 'moex tokenize: no DIR' tokenize
    refused 2 'give exactly one of TEXT, --file F and --decode IDS' tokenize "$fx" "x" --decode 1
    refused 2 '--decode: "-3" is not a token id' tokenize "$fx" --decode 1,-3
    refused 2 'unknown option --frobnicate' tokenize "$fx" x --frobnicate
    refused 1 'no-such-dir: no such file or directory \(a tokenizer.json' tokenize "$work/no-such-dir" x
    refused 1 'ids\[0\] = 999 is not a token' tokenize "$fx" --decode 999
    # generate with text: the new text streamed to stdout, the report on stderr
    "$moex" generate "$fx" --prompt "Hello" --max-new-tokens 4 >out 2>err
    what="generate --prompt" check $? 0 'prompt 0 -> 4 new tokens'
    [ -s out ] || { echo "FAIL: generate --prompt printed no text"; failed=1; }
    "$moex" generate "$fx" --prompt "Hello" --prompt-file prompt.txt --max-new-tokens 2 --json >out 2>err
    what="generate --prompt --prompt-file --json" check $? 0 ''
    grep -q '"text":\[' out || { echo "FAIL: generate --json has no text: $(cat out)"; failed=1; }
    accepted generate "$fx" --prompt "Hello" --chat --max-new-tokens 2
    refused 2 '--chat needs a text prompt' generate "$fx" --prompt-ids 1,2 --chat
    refused 1 'prompt-file .*nope.txt' generate "$fx" --prompt-file nope.txt
    refused 1 '--prompt needs .*mixtral/tokenizer.json' generate "$fx/../mixtral" --prompt "Hello"
    # a family without a chat format (olmoe, given the byte-level tokenizer.json)
    mkdir olmoe && cp "$fx"/../olmoe/* olmoe/ && cp "$fx/tokenizer.json" olmoe/
    refused 2 'olmoe: no chat format is written for this family' generate olmoe --prompt "Hi" --chat
    ;;

expert_parallel)
    # --ep N: the ranks' tokens and text are one model's, in prompt order (the logits, within 1e-5:
    # tests/test_ep_model.c); the report names the ranks; a rank without prompts; refusals
    g=(generate "$fx" --prompt-ids 5,17,42,8,33,2 --prompt-ids 9,60,14 --prompt-ids 1,2,3,4,5,6,7,8,9,10,11
       --max-new-tokens 5 --ignore-eos --threads 2)
    "$moex" "${g[@]}" --json >one.json 2>err
    check $? 0 ''
    for n in 2 4; do
        "$moex" "${g[@]}" --json --ep $n >ep.json 2>err
        what="--ep $n --json" check $? 0 "over $n expert-parallel ranks"
        if [ "$(sed 's/,"experts_implementation".*//' one.json)" != "$(sed 's/,"experts_implementation".*//' ep.json)" ] ||
            ! grep -q '"new_ids":\[\[[0-9]' one.json; then
            echo "FAIL (--ep $n --json): the new ids or text differ from one model's"
            sed 's/^/  | /' one.json ep.json
            failed=1
        fi
    done
    "$moex" "${g[@]}" --ep 2 >out 2>err
    what="--ep 2 report" check $? 0 ''
    grep -q '^expert parallelism: 2 ranks in this process, 4 experts a rank$' out ||
        { echo "FAIL (--ep 2 report): no line naming the ranks"; sed 's/^/  | /' out; failed=1; }
    accepted generate "$fx" --prompt-ids 5,17 --max-new-tokens 2 --ep 4 --warmup 1
    refused 2 'moex generate: --ep: "0" is not 1 to 64 ranks' generate "$fx" --prompt-ids 1,2 --ep 0
    refused 2 'moex generate: --ep: "65" is not 1 to 64 ranks' generate "$fx" --prompt-ids 1,2 --ep 65
    refused 2 'moex generate: --ep and --cuda-graph exclude each other' \
        generate "$fx" --prompt-ids 1,2 --ep 2 --device cuda --cuda-graph
    refused 2 'moex generate: --device cuda:0,1: several GPUs take the ranks of --ep N' \
        generate "$fx" --prompt-ids 1,2 --device cuda:0,1
    refused 2 'moex generate: --device: "x" is not a GPU index 0 to 1023 \(in "cuda:0,x"\)' \
        generate "$fx" --prompt-ids 1,2 --ep 2 --device cuda:0,x
    refused 2 'moex generate: --device: "gpu" is not cpu, cuda, cuda:N or cuda:N,M,...' generate "$fx" --prompt-ids 1,2 --device gpu
    refused 1 'rank 0 of 3: .*num_experts = 8 does not divide over an expert-parallel group of 3 ranks' \
        generate "$fx" --prompt-ids 1,2 --ep 3
    refused 1 'leaves 1 experts a rank, fewer than num_experts_per_tok = 2' generate "$fx" --prompt-ids 1,2 --ep 8
    ;;

expert_parallel_mpi)
    # --ep-mpi under mpirun (one rank a process): the tokens and text of one model, printed once, by
    # rank 0; a group that does not divide the experts fails every rank. Exit 77 (skipped) without
    # mpirun or without MPI in this build.
    command -v mpirun >/dev/null 2>&1 || { echo "no mpirun: skipped"; exit 77; }
    g=(generate "$fx" --prompt-ids 5,17,42,8,33,2 --prompt-ids 9,60,14 --prompt-ids 1,2,3,4,5,6,7,8,9,10,11
       --max-new-tokens 5 --ignore-eos --threads 1)
    "$moex" "${g[@]}" --ep-mpi >out 2>err
    if grep -q 'this build of moex has no MPI' err; then echo "no MPI in this build: skipped"; exit 77; fi
    run=(mpirun)
    if mpirun --version 2>&1 | grep -q 'Open MPI'; then run+=(--oversubscribe); [ "$(id -u)" = 0 ] && run+=(--allow-run-as-root); fi
    "$moex" "${g[@]}" --json >one.json 2>err
    check $? 0 ''
    for n in 2 4; do
        "${run[@]}" -n $n "$moex" "${g[@]}" --json --ep-mpi >ep.json 2>err
        what="mpirun -n $n --ep-mpi --json" check $? 0 "over $n expert-parallel ranks \\(MPI\\)"
        if [ "$(grep -c . ep.json)" != 1 ] ||
            [ "$(sed 's/,"experts_implementation".*//' one.json)" != "$(sed 's/,"experts_implementation".*//' ep.json)" ]; then
            echo "FAIL (mpirun -n $n --ep-mpi --json): not one JSON line with one model's new ids and text"
            sed 's/^/  | /' one.json ep.json
            failed=1
        fi
    done
    "${run[@]}" -n 2 "$moex" "${g[@]}" --ep-mpi >out 2>err
    what="mpirun -n 2 --ep-mpi report" check $? 0 ''
    grep -q '^expert parallelism: 2 ranks (MPI processes), 4 experts a rank$' out ||
        { echo "FAIL (mpirun -n 2 --ep-mpi): no line naming the ranks"; sed 's/^/  | /' out; failed=1; }
    "${run[@]}" -n 3 "$moex" "${g[@]}" --ep-mpi >out 2>err
    what="mpirun -n 3 --ep-mpi" check $? 1 'rank 2 of 3: .*num_experts = 8 does not divide over an expert-parallel group of 3 ranks'
    refused 2 '--ep N \(ranks in this process\) and --ep-mpi \(a rank a process\) exclude each other' \
        generate "$fx" --prompt-ids 1,2 --ep 2 --ep-mpi
    refused 2 'moex generate: --ep-mpi and --cuda-graph exclude each other' \
        generate "$fx" --prompt-ids 1,2 --ep-mpi --device cuda --cuda-graph
    ;;

*)
    echo "unknown group \"$group\""
    exit 2
    ;;
esac
if [ $failed = 0 ]; then echo "$group: all checks passed"; fi
exit $failed
