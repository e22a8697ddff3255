#!/usr/bin/env bash
# Where the whole machine's CPU goes per request: wrk, the proxy, the
# backend and everything else, with nginx and zonegate as the proxy in
# turn, round after round. When wrk keeps every core busy, throughput is
# the cores divided by the machine's CPU per request, so the two sums
# explain the req/s ratio, and the rows say who pays the difference (the
# proxy's own user or kernel time, or wrk and the backend, which parse
# what the proxy sends them).
#
#   benches/whole.sh                      # wrk -t1 -c256, 5 s recorded, 3 rounds
#   T=2 C=32 ROUNDS=5 benches/whole.sh
#   BIN=/tmp/zonegate-old benches/whole.sh
#   NODE='data_plane_threads = 1' benches/whole.sh   # extra [node] lines
#   STREAM=1 PACE=2 benches/whole.sh      # streams of 16 events from the mock backend,
#                                         # 2 ms apart ("request" = one whole stream)
#
# Per row: µs of CPU per request, kernel + user (perf samples of every
# CPU, `perf record -a`, by thread; sampling costs a little of its own,
# in "other"). Needs nginx, wrk and perf, and root or
# kernel.perf_event_paranoid <= 0; a benchmark, never part of the tests.
set -euo pipefail

T=${T:-1}
C=${C:-256}
REC=${REC:-5}
ROUNDS=${ROUNDS:-3}
HZ=1999
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"

needs nginx wrk perf
release_binary
start_proxies
# Thread ids of each process group (nginx workers are single-threaded).
tids() { for p in "$@"; do ls "/proc/$p/task"; done | tr '\n' ' '; }
PROXY_NGINX=$(tids $(nginx_workers proxy))
# The static nginx's worker, or (STREAM=1) the mock backend's threads.
if [ -f "$WORK/static.pid" ]; then
  BACKEND=$(tids $(nginx_workers static))
else
  BACKEND=$(tids "$(cat "$WORK/mock.pid")")
fi
ZONEGATE=$(tids "$ZPID")

# Inside a wrk run: its threads, then every CPU sampled for REC s.
record() {
  WRK=$(tids "$WRK_PID")
  perf record -F "$HZ" -a -o "$WORK/all.data" -- sleep "$REC" >/dev/null 2>&1
}

echo "== wrk -t$T -c$C, $REC s recorded per run, $(nproc) CPUs, $ROUNDS round(s); µs of CPU per request, kernel + user"
for round in $(seq "$ROUNDS"); do
  for t in nginx:$NP zonegate:$ZP; do
    name=${t%%:*}
    while_loaded "${t##*:}" "$REC" record
    proxy=$PROXY_NGINX
    [ "$name" = zonegate ] && proxy=$ZONEGATE
    perf report -i "$WORK/all.data" --stdio --no-children --sort pid,dso -F sample,pid,dso 2>/dev/null |
      python3 -c '
import re, sys
name, rnd, rps, hz, secs = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
groups = {"wrk": sys.argv[6].split(), "proxy": sys.argv[7].split(), "backend": sys.argv[8].split()}
cost = {g: [0, 0] for g in ["wrk", "proxy", "backend", "other"]}
for line in sys.stdin:
    m = re.match(r"^\s+(\d+)\s+(\d+):\S*\s+(.*?)\s*$", line)
    if not m:
        continue
    group = next((g for g, ids in groups.items() if m.group(2) in ids), "other")
    cost[group][0 if "kernel" in m.group(3) else 1] += int(m.group(1))
us = lambda n: n / hz / (rps * secs) * 1e6
total = sum(k + u for k, u in cost.values())
rows = "  ".join(f"{g} {us(k):.2f}+{us(u):.2f}" for g, (k, u) in cost.items())
print(f"round {rnd} {name:9} {rps:7.0f} req/s  machine {us(total):5.2f}  {rows}")
' "$name" "$round" "$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.txt")" "$HZ" "$REC" "$WRK" "$proxy" "$BACKEND"
  done
done
