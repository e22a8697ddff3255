#!/usr/bin/env bash
# Two zonegate builds against nginx on long streams (issue 48, item 2), for
# differences smaller than streams.sh's swing between runs: both nodes and
# nginx (2 workers, proxy_buffering off) run side by side in front of one
# mock backend, and each round measures A, nginx, B in turn with
# examples/sse_clients.rs (CONNS streams of TOKENS events PACE ms apart).
# Prints each round's CPU µs per delivered token (the proxy's user +
# system from /proc) and A's and B's ratio to nginx's.
#
#   benches/ab-streams.sh OLD-BINARY NEW-BINARY        # 1,000 streams, 30 tokens/s, 3 x 15 s
#   ROUNDS=5 DURATION=20 benches/ab-streams.sh A B
#   A_TOML='data_plane_threads = 1' benches/ab-streams.sh BIN BIN  # one build; [node] lines for A (B_TOML: B)
#
# Needs nginx; a benchmark, never part of the tests.
set -euo pipefail

BIN_A=$1
BIN_B=$2
CONNS=${CONNS:-1000}
PACE=${PACE:-33}
TOKENS=${TOKENS:-64}
DURATION=${DURATION:-15}
ROUNDS=${ROUNDS:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
needs nginx curl

stream_bench "$BIN_A"
zonegate_node a "$BIN_A" "${A_TOML:-}"
zonegate_node b "$BIN_B" "${B_TOML:-}"
sleep 1

# cpu_per_token URL PID...: the proxy's CPU µs per token delivered.
cpu_per_token() {
  local url=$1 cpu0 cpu
  shift
  cpu0=$(cpu_ticks "$@")
  "$CLIENT" "$url" "$CONNS" "$DURATION" "$BODY" bench-key >"$WORK/client.out"
  cpu=$(( ($(cpu_ticks "$@") - cpu0) * 1000000 / $(getconf CLK_TCK) ))
  awk -v cpu="$cpu" '/^RESULT/ { printf "%.2f", cpu / $3 }' "$WORK/client.out"
}
A_URL="http://127.0.0.1:$a_PORT/v1/chat/completions"
B_URL="http://127.0.0.1:$b_PORT/v1/chat/completions"
N_URL="http://127.0.0.1:$NP/v1/chat/completions"
echo "warming up..." >&2
for u in "$A_URL" "$B_URL" "$N_URL"; do "$CLIENT" "$u" 100 3 "$BODY" bench-key >/dev/null; done
echo "== $CONNS streams, $TOKENS tokens each, $PACE ms apart; CPU µs per token, rounds of $DURATION s: A, nginx, B"
for r in $(seq "$ROUNDS"); do
  a=$(cpu_per_token "$A_URL" "$a_PID")
  n=$(cpu_per_token "$N_URL" $(nginx_workers proxy))
  b=$(cpu_per_token "$B_URL" "$b_PID")
  awk -v r="$r" -v a="$a" -v n="$n" -v b="$b" \
    'BEGIN { printf "round %d: A %s  nginx %s  B %s   A/nginx %.3f  B/nginx %.3f  B/A %.3f\n", r, a, n, b, a / n, b / n, b / a }'
done
