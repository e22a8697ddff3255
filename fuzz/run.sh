#!/usr/bin/env bash
# Runs every fuzz target (or those named after the time) for SECONDS each
# (default 600), one after another, one libFuzzer process at a time, at
# the lowest CPU priority. Quiet: one line per target (its executions and
# corpus), a crash's log tail and its reproducer's path. Exits non-zero
# if any target crashed, timed out or ran out of memory.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# New inputs go to fuzz/corpus/<target> (not checked in); the checked-in
# seeds are fuzz/seeds/<target>; crashes land in fuzz/artifacts/<target>/
# and the logs in fuzz/target/logs/. See fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-600}"
shift || true
# The flags every build and run uses: a change rebuilds everything.
FUZZ=(cargo +nightly fuzz)
BUILD=(-s none)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <("${FUZZ[@]}" list)
fi

mkdir -p target/logs
echo "== fuzz: build (${#targets[@]} targets)"
nice -n 19 "${FUZZ[@]}" build "${BUILD[@]}" >target/logs/build.log 2>&1 || {
    tail -40 target/logs/build.log
    exit 1
}
failed=0
for t in "${targets[@]}"; do
    dict=()
    case "$t" in
        http1_*|upstream_*) dict=(-dict=dicts/http.dict) ;;
        sse) dict=(-dict=dicts/sse.dict) ;;
        config) dict=(-dict=dicts/config.dict) ;;
    esac
    mkdir -p "corpus/$t"
    log="target/logs/$t.log"
    start=$(date +%s)
    if nice -n 19 "${FUZZ[@]}" run "${BUILD[@]}" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "${dict[@]}" >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed=1
    fi
    took=$(($(date +%s) - start))
    # Final stats on a clean end; the last status line's count after a crash.
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
    [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tr -d '#' | tail -1)
    echo "$t: $status, ${execs:-?} executions in ${took} s, corpus $(ls "corpus/$t" | wc -l) inputs"
    if [ "$status" = FAILED ]; then
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -20 || tail -30 "$log"
    fi
done
exit "$failed"
