#!/usr/bin/env bash
# nginx's instructions per proxied request, counted by callgrind, as
# benches/callgrind.sh counts zonegate's: nginx as one process (no master,
# one worker) in front of zonegate's mock backend, a Python client sending
# N1 then N2 sequential keep-alive requests, the marginal instructions
# per request printed. With a third argument 1 the answers are event
# streams of TOKENS deltas (16); PACE=ms spaces the mock's events (every event its own read,
# write and wake-up, as a generation's are).
#
#   benches/callgrind-nginx.sh 200 1200             # plain answers
#   PACE=2 benches/callgrind-nginx.sh 50 250 1      # paced streams
#   BIN=target/dist/zonegate ...                    # the mock's binary
#   TOKENS=64 ...                                   # deltas per answer (16)
#
# Needs valgrind, nginx and python3; a benchmark, never part of the tests.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/zonegate}; N1=$1; N2=$2; STREAM=${3:-0}
WORK=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BP=$(free_port); NP=$(free_port)
RUST_LOG=warn "$BIN" mock-backend --listen 127.0.0.1:$BP --name static --model bench >/dev/null 2>&1 &
MOCK=$!
trap 'kill $MOCK 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$BP/health" && break; sleep 0.1; done
if [ -n "${PACE:-}" ]; then
  curl -s -o /dev/null -X POST -H 'content-type: application/json' -d "{\"stream_interval_ms\": $PACE}" "http://127.0.0.1:$BP/mock/faults"
fi
mkdir -p $WORK/logs
cat > $WORK/nginx.conf <<CONF
worker_processes 1;
error_log $WORK/logs/error.log warn;
pid $WORK/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $WORK; proxy_temp_path $WORK; fastcgi_temp_path $WORK; uwsgi_temp_path $WORK; scgi_temp_path $WORK;
  upstream static { server 127.0.0.1:$BP; keepalive 64; }
  server { listen 127.0.0.1:$NP; location / { proxy_pass http://static; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } }
}
CONF
run() {
  local n=$1 out=$WORK/cg.$1
  valgrind --tool=callgrind --callgrind-out-file=$out nginx -c $WORK/nginx.conf -g 'daemon off; master_process off;' >/dev/null 2>$WORK/vg.$n &
  local pid=$!
  for _ in $(seq 300); do curl -s -o /dev/null -X POST http://127.0.0.1:$NP/v1/chat/completions -d '{}' && break; sleep 0.2; done
  python3 - "$NP" "$n" "$STREAM" "${TOKENS:-16}" <<'PY'
import http.client, sys, json
port, n, stream, tokens = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
body = json.dumps({"model":"bench","max_tokens":tokens,"stream":stream,"messages":[{"role":"user","content":"hello"}]})
c = http.client.HTTPConnection("127.0.0.1", port)
headers = {"Authorization":"Bearer bench-key","Content-Type":"application/json"}
for _ in range(n):
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
PY
  kill -QUIT $pid; wait $pid 2>/dev/null || true
  grep -E "^summary:|^totals:" $out | head -1 | cut -d' ' -f2
}
A=$(run $N1); B=$(run $N2)
echo "nginx instructions per request: $(( (B - A) / (N2 - N1) ))  ($A @ $N1, $B @ $N2)"
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$WORK"/cg.* "$KEEP"/; fi
