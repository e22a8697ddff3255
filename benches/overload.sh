#!/usr/bin/env bash
# Overload side by side (issue 48, item 3): a backend that carries
# CAPACITY requests at once (zonegate's mock backend with `--capacity`,
# each request generating GENERATION_MS; the rest wait in its queue, as a
# server's batch does), offered twice what it carries by two tenants, p0
# (priority P0, 40 % of the capacity) and p2 (P2, 160 %), each at a fixed
# rate whatever the answers take (examples/open_loop.rs). In front of it:
#   direct    no gateway: the backend's own queue;
#   nginx     limit_conn of CAPACITY on the backend's location (503 past
#             it; nginx has no notion of the tenants' priorities);
#   zonegate  the backend's `capacity = CAPACITY` units, the tenants'
#             priorities (P2 leaves 40 % of the units free for P0, less
#             what P0 holds; a request short of units waits up to
#             `queue_timeout`, P0 first).
# First each target unloaded (p0 alone), then overloaded; per tenant:
# sent, answered 200, refused (429/503), errors (other, or no answer in
# 10 s), goodput and the 200s' latency from when each was due.
#
#   benches/overload.sh                      # 20 s per run
#   DURATION=30 CAPACITY=64 benches/overload.sh
#   RESERVE=0.05 benches/overload.sh         # zonegate's [quotas] p0_reserve (default 0.2)
#   QUEUE=0s benches/overload.sh             # zonegate's [quotas] queue_timeout (default 100ms;
#                                            # 0s: refused at once, no wait)
#   LONG=300 benches/overload.sh             # also zonegate overloaded for 300 s,
#                                            # its RSS every 30 s (memory flat?)
#   BIN=target/release/zonegate benches/overload.sh
#
# Needs nginx; a benchmark, never part of the tests. Everything listens
# on 127.0.0.1 and stops when the script exits.
set -euo pipefail

DURATION=${DURATION:-20}
CAPACITY=${CAPACITY:-32}
GENERATION_MS=${GENERATION_MS:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
needs nginx curl

release_binary
CLIENT=$(example_client open_loop)
BODY='{"model":"bench","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
# The backend's rate at capacity, and the tenants' offered rates.
FULL=$((CAPACITY * 1000 / GENERATION_MS))
P0_RATE=$((FULL * 40 / 100))
P2_RATE=$((FULL * 160 / 100))

SP=$(free_port)
RUST_LOG=warn setsid "$BIN" mock-backend --listen "127.0.0.1:$SP" --name static --model bench \
  --capacity "$CAPACITY" >"$WORK/mock.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$SP/health" && break; sleep 0.1; done
curl -s -o /dev/null -X POST -H 'content-type: application/json' \
  -d "{\"generation_ms\": $GENERATION_MS}" "http://127.0.0.1:$SP/mock/faults"

NP=$(start_nginx proxy 2 "
    location / { limit_conn backend $CAPACITY; proxy_pass http://static; proxy_http_version 1.1; proxy_set_header Connection \"\"; }" \
  "$(proxy_to static "$SP") limit_conn_zone \$server_port zone=backend:1m;")

ZP=$(free_port)
cat >"$WORK/zonegate.toml" <<CONF
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:$ZP"
admin_listen = "127.0.0.1:$(free_port)"
data_dir = "$WORK/data"
[[tenants]]
name = "p0"
key_sha256 = "$(printf %s p0-key | sha256sum | cut -d' ' -f1)"
priority = "P0"
[[tenants]]
name = "p2"
key_sha256 = "$(printf %s p2-key | sha256sum | cut -d' ' -f1)"
priority = "P2"
[[backends]]
name = "static"
zone = "az-a"
url = "http://127.0.0.1:$SP"
models = ["bench"]
capacity = $CAPACITY
CONF
{
  echo "[quotas]"
  if [ -n "${RESERVE:-}" ]; then echo "p0_reserve = $RESERVE"; fi
  if [ -n "${QUEUE:-}" ]; then echo "queue_timeout = \"$QUEUE\""; fi
} >>"$WORK/zonegate.toml"
RUST_LOG=warn setsid "$BIN" serve --config "$WORK/zonegate.toml" >"$WORK/zonegate.log" 2>&1 &
ZPID=$!
PIDS+=($ZPID)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$ZP/healthz" && break; sleep 0.1; done
sleep 1

url_of() {
  case $1 in
    direct) echo "http://127.0.0.1:$SP/v1/chat/completions" ;;
    nginx) echo "http://127.0.0.1:$NP/v1/chat/completions" ;;
    zonegate) echo "http://127.0.0.1:$ZP/v1/chat/completions" ;;
  esac
}

# load TARGET SECONDS TENANT...: the client's RESULT lines, the target's name first.
load() {
  local target=$1 secs=$2
  shift 2
  "$CLIENT" "$(url_of "$target")" "$secs" "$BODY" "$@" | sed "s/^RESULT /$target /"
}

echo "warming up..." >&2
load nginx 3 "p0:p0-key:$P0_RATE" >/dev/null
load zonegate 3 "p0:p0-key:$P0_RATE" >/dev/null

ROWS=""
for target in direct nginx zonegate; do
  ROWS+="$(load "$target" "$DURATION" "p0:p0-key:$P0_RATE" | sed 's/^\([a-z]*\) /\1 unloaded /')"$'\n'
done
for target in direct nginx zonegate; do
  ROWS+="$(load "$target" "$DURATION" "p0:p0-key:$P0_RATE" "p2:p2-key:$P2_RATE" | sed 's/^\([a-z]*\) /\1 2x /')"$'\n'
done

echo
echo "== overload: a backend of $CAPACITY at once x ${GENERATION_MS} ms (${FULL} req/s), p0 (P0) $P0_RATE req/s, p2 (P2) $P2_RATE req/s; zonegate's p0_reserve ${RESERVE:-0.2}, queue_timeout ${QUEUE:-100ms}; $DURATION s per run, $(nproc) cores"
printf '%-9s %-9s %-6s %7s %7s %8s %7s %9s %8s %8s %8s %9s\n' target load tenant sent ok refused errors "goodput/s" "p50 ms" "p99 ms" "p99.9" "success"
printf '%s' "$ROWS" | awk 'NF {
  printf "%-9s %-9s %-6s %7d %7d %8d %7d %9d %8.2f %8.2f %8.2f %8.2f%%\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 / 1000, $10 / 1000, $11 / 1000, $4 ? 100 * $5 / $4 : 0 }'
echo "(latency: the 200s', from when each request was due; success: 200s of those sent)"
printf '%s' "$ROWS" | awk '
  $2 == "unloaded" && $3 == "p0" { base[$1] = $10 }
  $2 == "2x" { good[$1] += $8; if ($3 == "p0") { p99[$1] = $10; ok[$1] = $4 ? 100 * $5 / $4 : 0 } }
  END { for (t in good) if (t != "direct") printf "%s: goodput %d req/s of %s carried; p0 success %.2f%%, p0 p99 %.2f ms = %.2fx unloaded (target: >= 99.9%%, <= 2x)\n",
          t, good[t], "'"$FULL"'", ok[t], p99[t] / 1000, base[t] ? p99[t] / base[t] : 0 }'

if [ -n "${LONG:-}" ]; then
  echo
  echo "== zonegate overloaded for $LONG s: RSS every 30 s (MiB)"
  load zonegate "$LONG" "p0:p0-key:$P0_RATE" "p2:p2-key:$P2_RATE" >"$WORK/long.out" &
  CL=$!
  for _ in $(seq $((LONG / 30))); do
    sleep 30
    printf '%s ' "$(($(ps -o rss= -p "$ZPID") / 1024))"
  done
  wait "$CL"
  echo
  cat "$WORK/long.out"
fi
