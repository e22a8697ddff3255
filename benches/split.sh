#!/usr/bin/env bash
# Where a proxied request's CPU goes: zonegate against nginx (2 workers,
# least_conn, keep-alive) at the same wrk load, same static nginx backend.
# Per request, for each proxy: CPU (from /proc), the user / kernel split
# (perf samples by binary), syscalls and context switches; then perf's
# top user-space symbols of zonegate.
#
#   benches/split.sh                        # wrk -t1 -c32, 8 s per measurement
#   T=2 C=256 SECS=10 benches/split.sh
#   BIN=/tmp/zonegate-old benches/split.sh  # another build
#   STREAM=1 PACE=2 T=2 C=256 benches/split.sh
#                                           # streams of 16 events from the mock backend,
#                                           # 2 ms apart: "req" is then one whole stream
#   FLOOR=1 benches/split.sh                # also examples/floor_proxy.rs (POST only): the
#                                           # same layout and syscalls, no gateway work
#   FLOOR=1 FLOOR_WORK="0 600 1200" benches/split.sh
#                                           # the floor once per WORK (rounds of arithmetic
#                                           # per request): what user time costs here
#   KEEP=/tmp/split benches/split.sh        # keeps the perf recordings (NAME.data)
#   NODE='data_plane_threads = 1' benches/split.sh  # extra [node] lines for zonegate
#   SYSCALLS=1 benches/split.sh             # also each proxy's syscalls by kind
#                                           # per request, and the reads that
#                                           # found nothing (EAGAIN)
#
# Needs nginx, wrk and perf (`apt-get install nginx wrk linux-perf`) and
# root or kernel.perf_event_paranoid <= 1; a benchmark, never part of the
# tests. Each proxy is measured twice: once plain (CPU, syscalls, context
# switches; perf stat counts only) and once under `perf record` (the
# split; sampling adds its own cost, so its CPU is not reported).
set -euo pipefail

T=${T:-1}
C=${C:-32}
SECS=${SECS:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"

needs nginx wrk perf
release_binary
start_proxies
NPIDS=$(nginx_workers proxy)

load() { wrk -t"$T" -c"$C" -d"$1" -s "$WORK/post.lua" "http://127.0.0.1:$2/v1/chat/completions"; }
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo $t; }
switches() { local s=0 p; for p in "$@"; do s=$((s + $(cat /proc/"$p"/task/*/status | awk '/ctxt_switches/{s+=$2} END{print s}'))); done; echo $s; }

# by_kind NAME PORT PIDS: one more run, counting syscalls by kind (those
# this proxy made at least 0.01 times per request).
KINDS="read write readv writev recvfrom sendto recvmsg sendmsg epoll_wait epoll_pwait epoll_ctl futex accept4 close setsockopt getsockopt connect sched_yield"
by_kind() {
  local name=$1 port=$2 pids=$3 ev=() k n
  for k in $KINDS; do ev+=(-e "syscalls:sys_enter_$k"); done
  ev+=(-e syscalls:sys_exit_read --filter 'ret == -11' -e syscalls:sys_exit_recvfrom --filter 'ret == -11')
  perf stat "${ev[@]}" -p "$pids" -o "$WORK/kinds.txt" -- sleep "$SECS" &
  local pp=$!
  n=$(load "${SECS}s" "$port" | awk '/requests in/{print $1}')
  wait $pp
  awk -v n="$n" -v name="$name" '/syscalls:sys_/{gsub(",","",$1); r=$1/n; if (r>=0.01) {k=$2; sub("syscalls:sys_enter_","",k); sub("syscalls:sys_exit_","",k); if ($2 ~ /exit/) k=k" EAGAIN"; line=line sprintf("  %s %.2f", k, r)}} END{print name " per request:" line}' "$WORK/kinds.txt"
}

# measure NAME PORT PIDS...: one plain run, one under perf record.
measure() {
  local name=$1 port=$2; shift 2
  local pids; pids=$(echo "$@" | tr ' ' ,)
  load 2s "$port" >/dev/null
  local t0 s0 t1 s1 out
  t0=$(ticks "$@"); s0=$(switches "$@")
  perf stat -e raw_syscalls:sys_enter -p "$pids" -o "$WORK/stat.txt" -- sleep "$SECS" &
  local pp=$!
  out=$(load "${SECS}s" "$port")
  wait $pp
  t1=$(ticks "$@"); s1=$(switches "$@")
  local n sc
  n=$(echo "$out" | awk '/requests in/{print $1}')
  sc=$(awk '/raw_syscalls/{gsub(",","",$1); print $1}' "$WORK/stat.txt")
  if [ "${SYSCALLS:-0}" = 1 ]; then by_kind "$name" "$port" "$pids"; fi
  perf record -F 2999 -g -o "$WORK/$name.data" -p "$pids" -- sleep "$SECS" >/dev/null 2>&1 &
  pp=$!
  load "${SECS}s" "$port" >/dev/null
  wait $pp
  local kernel
  kernel=$(perf report -i "$WORK/$name.data" --no-children --sort dso -g none 2>/dev/null \
    | awk '/\[kernel.kallsyms\]/{gsub("%","",$1); print $1}')
  python3 - "$name" "$n" "$SECS" "$((t1 - t0))" "$(getconf CLK_TCK)" "$((s1 - s0))" "$sc" "$kernel" <<'PY'
import sys
name, n, secs, ticks, hz, cs, sc, kernel = sys.argv[1:]
n, ticks, hz, kernel = int(n), int(ticks), int(hz), float(kernel or 0)
cpu = ticks / hz * 1e6 / n
print(f"{name:9} {n/int(secs):8.0f} req/s  cpu {cpu:5.1f} us/req  "
      f"(kernel {cpu*kernel/100:4.1f}, user {cpu*(100-kernel)/100:4.1f})  "
      f"syscalls {int(sc)/n:4.2f}/req  context switches {int(cs)/n:4.2f}/req")
PY
}

echo "== wrk -t$T -c$C, ${SECS} s per measurement, $(nproc) cores"
measure nginx "$NP" $NPIDS
measure zonegate "$ZP" "$ZPID"
if [ "${FLOOR:-0}" = 1 ] && [ "${STREAM:-0}" != 1 ]; then
  (cd "$ROOT" && cargo build --profile dist --quiet --example floor_proxy)
  for work in ${FLOOR_WORK:-0}; do
    FP=$(free_port)
    setsid "${CARGO_TARGET_DIR:-$ROOT/target}/dist/examples/floor_proxy" "127.0.0.1:$FP" "127.0.0.1:$SP" "$(nproc)" "$work" &
    FPID=$!
    PIDS+=("$FPID")
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$FP/" && break; sleep 0.1; done
    name=floor
    [ "$work" = 0 ] || name=floor+$work
    measure "$name" "$FP" "$FPID"
    kill "$FPID" 2>/dev/null || true
  done
fi
# KEEP=DIR: the perf recordings (NAME.data), for `perf report -i`.
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$WORK"/*.data "$KEEP"/; fi
echo
echo "== zonegate: top user-space symbols (self, % of its samples)"
perf report -i "$WORK/zonegate.data" --no-children --sort sym -g none \
  --dsos "$(basename "$BIN")",libc.so.6 2>/dev/null | grep -v '^#' | grep -v '^$' | head -25
