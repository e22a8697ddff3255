#!/usr/bin/env bash
# Alternating A/B of two zonegate builds, for a difference smaller than
# this machine's swing between runs: both nodes run side by side on one
# static nginx backend, and short wrk runs alternate between them, round
# after round. Prints each build's medians (req/s, p99, CPU µs per request
# from /proc) and B's ratio to A.
#
#   benches/ab.sh OLD-BINARY NEW-BINARY                 # wrk -t1 -c32, 3 s, 8 rounds
#   C=256 SECS=3 ROUNDS=8 benches/ab.sh OLD NEW
#   T=2 C=256 benches/ab.sh OLD NEW                     # wrk -t2 (load.sh's other method)
#   B_NODE='data_plane_threads = 1' benches/ab.sh BIN BIN   # one build, two configs
#   STREAM=1 PACE=2 C=256 benches/ab.sh OLD NEW   # streams of 16 events from the mock
#                                                 # backend, 2 ms apart ("req" = a stream)
#
# Needs nginx and wrk; a benchmark, never part of the tests.
set -euo pipefail

A=$1
B=$2
C=${C:-32}
T=${T:-1}
SECS=${SECS:-3}
ROUNDS=${ROUNDS:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"

needs nginx wrk
start_backend "$B"

# A_NODE / B_NODE: extra [node] lines for that build's node.
zonegate_node a "$A" "${A_NODE:-}"
zonegate_node b "$B" "${B_NODE:-}"

cat >>"$WORK/post.lua" <<LUA
done = function(s, latency, requests)
  io.write(string.format("RESULT %d %.0f %.3f\n", s.requests, s.requests / (s.duration / 1e6),
    latency:percentile(99) / 1000))
end
LUA
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
load() { wrk -t"$T" -c"$C" -d"$2" -s "$WORK/post.lua" "http://127.0.0.1:$1/v1/chat/completions"; }
load "$a_PORT" 1s >/dev/null
load "$b_PORT" 1s >/dev/null

echo "== alternating A/B: wrk -t$T -c$C, $ROUNDS rounds of ${SECS} s each"
# Rounds alternate which build goes first (a b, b a, ...): the first of a
# pair measured ~3% faster than the second in back-to-back runs of the
# same two builds, whichever it was.
for round in $(seq "$ROUNDS"); do
  order="a b"
  [ $((round % 2)) = 0 ] && order="b a"
  for t in $order; do
    pid_var=${t}_PID port_var=${t}_PORT
    c0=$(ticks "${!pid_var}")
    result=$(load "${!port_var}" "${SECS}s" | grep RESULT)
    c1=$(ticks "${!pid_var}")
    echo "$t $result $((c1 - c0))" >>"$WORK/rounds.txt"
  done
done
python3 - "$WORK/rounds.txt" "$(getconf CLK_TCK)" "$A" "$B" <<'PY'
import statistics, sys
rows, hz = {}, int(sys.argv[2])
for line in open(sys.argv[1]):
    t, _, n, rps, p99, ticks = line.split()
    rows.setdefault(t, []).append((float(rps), float(p99), int(ticks) / hz * 1e6 / int(n)))
med = {t: [statistics.median(r[i] for r in v) for i in range(3)] for t, v in rows.items()}
for t, name in (("a", sys.argv[3]), ("b", sys.argv[4])):
    rps, p99, cpu = med[t]
    print(f"{t}: {rps:8.0f} req/s  p99 {p99:6.2f} ms  cpu {cpu:5.1f} us/req   ({name})")
(ra, pa, ca), (rb, pb, cb) = med["a"], med["b"]
print(f"b/a: req/s {rb / ra:.3f}x  p99 {pb / pa:.3f}x  cpu per request {cb / ca:.3f}x")
PY
