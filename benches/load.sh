#!/usr/bin/env bash
# Loopback load benchmark: the same mock backend called directly, through
# nginx (least_conn, keep-alive) and through zonegate, with wrk.
# Prints requests/s and p50/p99 latency for each, and zonegate's idle RSS.
#
#   benches/load.sh                    # 32 connections, 15 s per target
#   CONNECTIONS=64 DURATION=30 benches/load.sh
#   CLUSTER=1 benches/load.sh          # zonegate as a Raft member (control plane running)
#   APPLY=1 benches/load.sh            # also zonegate (a Raft member) while a replicated
#                                      # config is applied every 0.2 s (zg-applying)
#   TLS=1 benches/load.sh              # also zonegate over HTTPS: HTTP/1.1 keep-alive (wrk),
#                                      # HTTP/2 (h2load, if installed), and new connections
#                                      # per request (wrk, Connection: close)
#   QUOTA=1 benches/load.sh            # the tenant has rpm/tpm/concurrency quotas far above the
#                                      # load: every request pays the whole quota stage (and headers)
#
# Needs nginx and wrk (`apt-get install nginx wrk`; TLS=1 also openssl, and
# h2load from nghttp2-client for the HTTP/2 row); this is a benchmark,
# never part of the tests. Everything listens on 127.0.0.1 and stops when
# the script exits.
set -euo pipefail

CONNECTIONS=${CONNECTIONS:-32}
DURATION=${DURATION:-15}
THREADS=${THREADS:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "needs $tool: apt-get install nginx wrk" >&2; exit 1; }
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "building release binary..." >&2
(cd "$ROOT" && cargo build --release --quiet)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/zonegate

BACKEND_PORT=$(free_port)
RUST_LOG=warn "$BIN" mock-backend --listen "127.0.0.1:$BACKEND_PORT" --name static --model bench >"$WORK/mock.log" 2>&1 &
PIDS+=($!)

NGINX_PORT=$(free_port)
mkdir -p "$WORK/nginx"
cat >"$WORK/nginx.conf" <<CONF
worker_processes auto;
pid $WORK/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx;
  proxy_temp_path $WORK/nginx;
  upstream backend { least_conn; server 127.0.0.1:$BACKEND_PORT; keepalive 128; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
CONF
nginx -c "$WORK/nginx.conf" -p "$WORK/nginx"

ZG_PORT=$(free_port)
ADMIN_PORT=$(free_port)
KEY=bench-key
cat >"$WORK/zonegate.toml" <<CONF
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:$ZG_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
data_dir = "$WORK/data"
[[tenants]]
name = "bench"
key_sha256 = "$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)"
$( [ "${QUOTA:-0}" = 1 ] && echo 'quota = { rpm = 1000000000, tpm = 1000000000000, concurrency = 100000 }' )
[[backends]]
name = "static"
zone = "az-a"
url = "http://127.0.0.1:$BACKEND_PORT"
models = ["bench"]
CONF
[ "${APPLY:-0}" = 1 ] && CLUSTER=1
if [ "${CLUSTER:-0}" = 1 ]; then
  RAFT_PORT=$(free_port)
  cat >>"$WORK/zonegate.toml" <<CONF
[[admin.tokens]]
name = "bench"
sha256 = "$(printf %s bench-admin | sha256sum | cut -d' ' -f1)"
role = "operator"

[[cluster.members]]
id = 1
zone = "az-a"
raft = "127.0.0.1:$RAFT_PORT"
admin = "127.0.0.1:$ADMIN_PORT"
CONF
  export ZONEGATE_CLUSTER_SECRET=bench-cluster-secret
fi
# Access lines off for the throughput run, as nginx's access_log is off.
RUST_LOG=warn "$BIN" serve --config "$WORK/zonegate.toml" >"$WORK/zonegate.log" 2>&1 &
ZG_PID=$!
PIDS+=($ZG_PID)

if [ "${TLS:-0}" = 1 ]; then
  # A second, otherwise identical node serving HTTPS (idle while the
  # others are measured).
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
    -keyout "$WORK/tls.key" -out "$WORK/tls.crt" 2>/dev/null
  TLS_PORT=$(free_port)
  sed -e "s/^listen = .*/listen = \"127.0.0.1:$TLS_PORT\"/" \
      -e "s/^admin_listen = .*/admin_listen = \"127.0.0.1:$(free_port)\"/" \
      -e "s|^data_dir = .*|data_dir = \"$WORK/data-tls\"|" \
      -e '/^\[\[cluster.members\]\]/,$d' "$WORK/zonegate.toml" >"$WORK/zonegate-tls.toml"
  printf '[node.tls]\ncert = "%s"\nkey = "%s"\n' "$WORK/tls.crt" "$WORK/tls.key" >>"$WORK/zonegate-tls.toml"
  RUST_LOG=warn "$BIN" serve --config "$WORK/zonegate-tls.toml" >"$WORK/zonegate-tls.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    curl -sk -o /dev/null "https://127.0.0.1:$TLS_PORT/healthz" && break
    sleep 0.1
  done
fi

for port in $BACKEND_PORT $NGINX_PORT $ZG_PORT; do
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.1
  done
done
sleep 1
IDLE_RSS_KB=$(ps -o rss= -p "$ZG_PID" | tr -d ' ')

cat >"$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"bench","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.3f %.3f %d %d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.requests))
end
LUA

run() {
  local name=$1 url=$2
  wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION"s -s "$WORK/post.lua" "$url" | grep '^RESULT' | sed "s/^RESULT/$name/"
}

echo "warming up..." >&2
wrk -t1 -c4 -d2s -s "$WORK/post.lua" "http://127.0.0.1:$ZG_PORT/v1/chat/completions" >/dev/null
wrk -t1 -c4 -d2s -s "$WORK/post.lua" "http://127.0.0.1:$NGINX_PORT/v1/chat/completions" >/dev/null

h2() {
  # h2load prints "finished in Xs, N req/s" and a latency line in µs/ms.
  h2load -t"$THREADS" -c"$CONNECTIONS" -m1 -D"$DURATION" \
    -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
    -d "$WORK/body.json" "$1" 2>/dev/null | awk -v name="$2" '
      /finished in/ { rps = $4 }
      /^requests:/ { failed = $10 }
      END { printf "%s %s - - %s 0\n", name, rps, failed }'
}

RESULTS=$(
  run direct   "http://127.0.0.1:$BACKEND_PORT/v1/chat/completions"
  run nginx    "http://127.0.0.1:$NGINX_PORT/v1/chat/completions"
  run zonegate "http://127.0.0.1:$ZG_PORT/v1/chat/completions"
  if [ "${APPLY:-0}" = 1 ]; then
    # Two configs that differ only in [retry], applied in turn.
    ctl() { "$BIN" ctl --admin "http://127.0.0.1:$ADMIN_PORT" --token bench-admin "$@"; }
    ctl config show >"$WORK/base.toml"
    printf '\n[retry]\nmax_attempts = 3\n' | cat "$WORK/base.toml" - >"$WORK/c0.toml"
    printf '\n[retry]\nmax_attempts = 2\n' | cat "$WORK/base.toml" - >"$WORK/c1.toml"
    # curl rather than ctl: the applier's own CPU should not be measured.
    apply() {
      curl -sf -o /dev/null -H "Authorization: Bearer bench-admin" -H "Content-Type: application/toml" \
        --data-binary "@$1" "http://127.0.0.1:$ADMIN_PORT/admin/v1/config"
    }
    ( i=0; while :; do apply "$WORK/c$((i % 2)).toml" && echo ok >>"$WORK/applies"; i=$((i + 1)); sleep 0.2; done ) &
    APPLIER=$!
    run zg-applying "http://127.0.0.1:$ZG_PORT/v1/chat/completions"
    kill "$APPLIER" 2>/dev/null || true
    echo "(zg-applying: $(wc -l <"$WORK/applies" 2>/dev/null || echo 0) configs applied during the run)" >&2
  fi
  if [ "${TLS:-0}" = 1 ]; then
    run zg-tls "https://127.0.0.1:$TLS_PORT/v1/chat/completions"
    if command -v h2load >/dev/null; then
      printf '%s' '{"model":"bench","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}' >"$WORK/body.json"
      h2 "https://127.0.0.1:$TLS_PORT/v1/chat/completions" zg-h2
    fi
    sed -i 's/^wrk.headers\["Content-Type"\]/wrk.headers["Connection"] = "close"\n&/' "$WORK/post.lua"
    run zg-tls-new "https://127.0.0.1:$TLS_PORT/v1/chat/completions"
    run zg-new "http://127.0.0.1:$ZG_PORT/v1/chat/completions"
  fi
)
LOADED_RSS_KB=$(ps -o rss= -p "$ZG_PID" | tr -d ' ')

echo
echo "loopback load: $CONNECTIONS connections, $DURATION s each, $(nproc) cores, wrk -t$THREADS, control plane: $([ "${CLUSTER:-0}" = 1 ] && echo raft || echo standalone)"
printf '%-11s %10s %9s %9s %8s\n' target "req/s" "p50 ms" "p99 ms" errors
echo "$RESULTS" | while read -r name rps p50 p99 errors _; do
  printf '%-11s %10s %9s %9s %8s\n' "$name" "$rps" "$p50" "$p99" "$errors"
done
[ "${TLS:-0}" = 1 ] && echo "(zg-tls: HTTPS keep-alive; zg-h2: HTTP/2 over TLS, h2load, 1 stream per connection; *-new: a new connection per request)"
DIRECT_P99=$(echo "$RESULTS" | awk '$1=="direct"{print $4}')
NGINX_RPS=$(echo "$RESULTS" | awk '$1=="nginx"{print $2}')
ZG_RPS=$(echo "$RESULTS" | awk '$1=="zonegate"{print $2}')
ZG_P99=$(echo "$RESULTS" | awk '$1=="zonegate"{print $4}')
echo
awk -v z="$ZG_RPS" -v n="$NGINX_RPS" 'BEGIN{printf "zonegate / nginx throughput: %.2fx\n", z/n}'
awk -v z="$ZG_P99" -v d="$DIRECT_P99" 'BEGIN{printf "zonegate added p99 over direct: %.3f ms\n", z-d}'
echo "zonegate RSS: idle $((IDLE_RSS_KB / 1024)) MiB, after load $((LOADED_RSS_KB / 1024)) MiB"
