#!/usr/bin/env bash
# Long token streams side by side (issue 48, item 2): CONNS concurrent SSE
# streams (default 1,000), each answer TOKENS token events (64) PACE ms
# apart (33: 30 tokens/s, a generation's pace), from zonegate's mock
# backend, read by examples/sse_clients.rs directly, through nginx
# (2 workers, proxy_buffering off, keep-alive upstream) and through a
# standalone zonegate node. Each round runs the three in rotated order.
#
# Per target and round: tokens delivered, the proxy's CPU (user + system)
# per delivered token, the gaps between a stream's consecutive token
# events (p50, p99, p99.9, max), time to first token p99, the proxy's RSS
# in the middle of the run. Then, paired by round: zonegate's CPU per
# token over nginx's, and each proxy's added inter-token p99 (its gaps'
# p99 minus direct's in the same round).
#
#   benches/streams.sh                       # 3 rounds x 20 s
#   ROUNDS=5 DURATION=30 benches/streams.sh
#   CONNS=200 PACE=10 benches/streams.sh
#   BIN=target/release/zonegate benches/streams.sh
#
# Needs nginx (`apt-get install nginx`); a benchmark, never part of the
# tests. Everything listens on 127.0.0.1 and stops when the script exits.
set -euo pipefail

CONNS=${CONNS:-1000}
PACE=${PACE:-33}
TOKENS=${TOKENS:-64}
DURATION=${DURATION:-20}
ROUNDS=${ROUNDS:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
needs nginx curl

release_binary

stream_bench "$BIN"
zonegate_node z "$BIN"
sleep 1

url_of() {
  case $1 in
    direct) echo "http://127.0.0.1:$SP/v1/chat/completions" ;;
    nginx) echo "http://127.0.0.1:$NP/v1/chat/completions" ;;
    zonegate) echo "http://127.0.0.1:$z_PORT/v1/chat/completions" ;;
  esac
}
pids_of() {
  case $1 in
    nginx) nginx_workers proxy ;;
    zonegate) echo "$z_PID" ;;
  esac
}
rss_kb() {
  local t=0 p
  for p in "$@"; do t=$((t + $(ps -o rss= -p "$p" | tr -d ' '))); done
  echo "$t"
}

# measure ROUND NAME: "ROUND NAME tokens/s cpu-us/token p50 p99 p999 max ttft-p99 rss-KiB errors"
# (times in µs; "-" where the target has no process of its own).
measure() {
  local round=$1 name=$2 pids cpu0 cpu rss=- client result
  pids=$(pids_of "$name")
  cpu0=$(cpu_ticks $pids)
  "$CLIENT" "$(url_of "$name")" "$CONNS" "$DURATION" "$BODY" bench-key >"$WORK/client.out" &
  client=$!
  sleep $((DURATION / 2))
  [ -n "$pids" ] && rss=$(rss_kb $pids)
  wait "$client"
  cpu=$(( ($(cpu_ticks $pids) - cpu0) * 1000000 / $(getconf CLK_TCK) ))
  result=$(grep '^RESULT' "$WORK/client.out")
  echo "$result" | awk -v r="$round" -v n="$name" -v cpu="$cpu" -v has="${pids:+1}" -v rss="$rss" -v d="$DURATION" '
    { printf "%s %s %.0f %s %s %s %s %s %s %s %s\n", r, n, $3 / d, (has && $3 > 0) ? sprintf("%.2f", cpu / $3) : "-",
        $5, $6, $7, $8, $9, rss, $4 }'
}

echo "warming up..." >&2
"$CLIENT" "$(url_of zonegate)" 100 3 "$BODY" bench-key >/dev/null
"$CLIENT" "$(url_of nginx)" 100 3 "$BODY" bench-key >/dev/null

TARGETS=(direct nginx zonegate)
RUNS=""
for round in $(seq 0 $((ROUNDS - 1))); do
  for i in 0 1 2; do
    RUNS+="$(measure "$round" "${TARGETS[$(((i + round) % 3))]}")"$'\n'
  done
done

echo
echo "== $CONNS concurrent streams, $TOKENS tokens each, $PACE ms apart; $DURATION s x $ROUNDS round(s), $(nproc) cores"
printf '%-9s %9s %11s %8s %8s %8s %8s %9s %8s %6s\n' target tokens/s "cpu us/tok" "gap p50" "gap p99" "p99.9" "max" "ttft p99" "RSS MiB" errors
printf '%s' "$RUNS" | awk "$ROUND_STATS"'
  function col(name, k,   i, v, m) { m = 0; for (i = 1; i <= runs[name]; i++) v[i] = vals[name, i, k]; return median(v, runs[name]) }
  { n = ++runs[$2]; for (k = 3; k <= 10; k++) vals[$2, n, k] = $k; errors[$2] += $11 }
  END {
    split("direct nginx zonegate", order, " ")
    for (t = 1; t <= 3; t++) { name = order[t]; if (!runs[name]) continue
      cpu = vals[name, 1, 4] == "-" ? "-" : sprintf("%.2f", col(name, 4))
      rss = vals[name, 1, 10] == "-" ? "-" : sprintf("%.1f", col(name, 10) / 1024)
      printf "%-9s %9.0f %11s %8.2f %8.2f %8.2f %8.2f %9.2f %8s %6d\n", name, col(name, 3), cpu,
        col(name, 5) / 1000, col(name, 6) / 1000, col(name, 7) / 1000, col(name, 8) / 1000, col(name, 9) / 1000, rss, errors[name] }
  }'
echo "(gaps and time to first token in ms, medians over the rounds; CPU: the proxy's user + system per delivered token)"
printf '%s' "$RUNS" | awk "$ROUND_STATS"'
  { v[$1, $2, "cpu"] = $4; v[$1, $2, "p99"] = $6; if ($1 + 1 > rounds) rounds = $1 + 1 }
  END {
    for (r = 0; r < rounds; r++) {
      cpu[r + 1] = v[r, "zonegate", "cpu"] / v[r, "nginx", "cpu"]
      zadd[r + 1] = (v[r, "zonegate", "p99"] - v[r, "direct", "p99"]) / 1000
      nadd[r + 1] = (v[r, "nginx", "p99"] - v[r, "direct", "p99"]) / 1000
    }
    QUIET = 0
    print "paired by round: zonegate / nginx " said(cpu, rounds, "CPU per token", "costlier")
    printf "added inter-token p99 over direct (ms), zonegate:"; for (r = 1; r <= rounds; r++) printf " %+.2f", zadd[r]
    printf " (median %+.2f); nginx:", median(zadd, rounds); for (r = 1; r <= rounds; r++) printf " %+.2f", nadd[r]
    printf " (median %+.2f)\n", median(nadd, rounds)
  }'
