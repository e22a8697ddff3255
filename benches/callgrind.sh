#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind (repeatable on a busy
# machine, unlike wall-clock load): zonegate runs under valgrind, a Python
# client sends N1 then N2 sequential keep-alive requests, and the marginal
# instructions per request are printed.
#
#   benches/callgrind.sh target/dist/zonegate 200 1200      # non-streaming
#   benches/callgrind.sh target/dist/zonegate 200 1200 1    # streaming
#   PACE=2 benches/callgrind.sh target/dist/zonegate 50 250 1  # streaming, 2 ms between
#                                      # events (a paced generation: every event its own read,
#                                      # write and wake-up; runs vary by a few percent)
#   TOKENS=64 benches/callgrind.sh ... # each answer this many deltas (16): two runs that differ
#                                      # only here give the cost of one more event of a stream
#   QUOTA=1 benches/callgrind.sh ...   # the tenant has quotas far above the load: every request
#                                      # pays the whole quota stage and its headers
#   ATOMICS=1 benches/callgrind.sh ... # also atomic read-modify-writes per request, by
#                                      # function (benches/atomics.py; callgrind counts each
#                                      # as one instruction, natively ~20 cycles or more)
#   CONNS=128 benches/callgrind.sh BIN 2 10  # 128 connections, each sending in turn, N1 and
#                                      # N2 rounds: requests in flight together, as under load
#   PROVIDER=anthropic benches/callgrind.sh ...  # the backend is a provider (`anthropic`:
#                                      # requests and answers translated; `azure`: its path and
#                                      # key; `openai`: a key), with its mock and a key: the
#                                      # translation's cost over the plain passthrough
#   SAMPLING=0|0.1|1 benches/callgrind.sh ...  # traces on: `[telemetry] otlp_endpoint` names a
#                                      # local sink (python3, answers every export 200) and
#                                      # `sampling` is this ratio: the tracer's cost per request
#   POLICY=20 benches/callgrind.sh ... # traffic policy that the request does not match: the
#                                      # backend also serves `other` and m1..m20, with a rule
#                                      # and a shadow for each m<i> (to `other`) and a rule for
#                                      # `bench` that needs an `x-canary` header the client
#                                      # never sends; POLICY=0 (or unset): no policy at all.
#                                      # POLICY_MODELS_ONLY=1: the extra models, no rules
#   KEEP=/tmp/cg benches/callgrind.sh ...  # keeps both runs' callgrind files there
#                                      # (cg.N1, cg.N2) for callgrind_annotate: the
#                                      # marginal cost by function is the difference
#   CACHE=1 benches/callgrind.sh ...   # also cache misses per request, simulated (32 KiB
#                                      # 8-way I1 and D1, the 1 MiB 8-way L2 as LL, 64-byte
#                                      # lines: this machine's per-core caches, AMD Zen 4, as
#                                      # /sys/devices/system/cpu/cpu0/cache lists them; lscpu
#                                      # prints both cores' sum): I1mr is code the request
#                                      # runs that did not fit, D1 data that went cold, LL
#                                      # what came from beyond the core's L2
#   BACKENDS=10000 benches/callgrind.sh ...  # the config lists this many backends: model
#                                      # `bench` on the first, the others on 100 other models
#                                      # (all at the mock's address, probed hourly): the cost of
#                                      # a fleet's size to a request (issue 48's scale curves)
#   TENANTS=100000 benches/callgrind.sh ...  # this many tenants, one API key each; the
#                                      # requests use the first one's
#   COLLECT='zonegate::dataplane::proxy::infer*' benches/callgrind.sh ...  # count only inside
#                                      # the functions matched (callgrind --toggle-collect,
#                                      # repeatable as COLLECT='a;b'): the request path without
#                                      # the node's background work, which grows with the
#                                      # config (the health sweeper walks every backend every
#                                      # 250 ms) and with the run's length, not per request
#
# Needs valgrind and python3; a benchmark, never part of the tests.
set -euo pipefail
BIN=$1; N1=$2; N2=$3; STREAM=${4:-0}
WORK=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BP=$(free_port); ZP=$(free_port); AP=$(free_port)
PROVIDER_ARGS=""; PROVIDER_TOML=""
if [ -n "${PROVIDER:-}" ]; then
  PROVIDER_ARGS="--provider $PROVIDER --expect-key bench-provider-key"
  PROVIDER_TOML="provider = \"$PROVIDER\"
api_key = { env = \"BENCH_PROVIDER_KEY\" }"
  export BENCH_PROVIDER_KEY=bench-provider-key
fi
RUST_LOG=warn "$BIN" mock-backend --listen 127.0.0.1:$BP --name static --model bench $PROVIDER_ARGS >/dev/null 2>&1 &
MOCK=$!
if [ -n "${PACE:-}" ]; then
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$BP/health" && break; sleep 0.1; done
  curl -s -o /dev/null -X POST -H 'content-type: application/json' \
    -d "{\"stream_interval_ms\": $PACE}" "http://127.0.0.1:$BP/mock/faults"
fi
TELEMETRY_TOML=""; SINK=""
if [ -n "${SAMPLING:-}" ]; then
  TP=$(free_port)
  python3 - "$TP" <<'PY' >/dev/null 2>&1 &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
  SINK=$!
  TELEMETRY_TOML="[telemetry]
otlp_endpoint = \"http://127.0.0.1:$TP\"
sampling = $SAMPLING"
fi
# Many backends: probe hourly, so probes stay out of the counted requests.
[ "${BACKENDS:-1}" -gt 1 ] && HEALTH_INTERVAL=${HEALTH_INTERVAL:-1h}
MODELS='"bench"'; POLICY_TOML=""
if [ "${POLICY:-0}" -gt 0 ]; then
  MODELS="$MODELS, \"other\""
  for i in $(seq "$POLICY"); do
    MODELS="$MODELS, \"m$i\""
    [ "${POLICY_MODELS_ONLY:-0}" = 1 ] && continue
    POLICY_TOML="$POLICY_TOML
[[rules]]
name = \"gray-m$i\"
model = \"m$i\"
percent = 50.0
route_to = \"other\"
[[shadows]]
name = \"shadow-m$i\"
model = \"m$i\"
to = \"other\"
percent = 10.0"
  done
  [ "${POLICY_MODELS_ONLY:-0}" = 1 ] || POLICY_TOML="$POLICY_TOML
[[rules]]
name = \"bench-canary\"
model = \"bench\"
match = { headers = { \"x-canary\" = \"1\" } }
route_to = \"other\""
fi
cat > $WORK/z.toml <<CONF
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:$ZP"
admin_listen = "127.0.0.1:$AP"
data_dir = "$WORK/data"
[[tenants]]
name = "bench"
key_sha256 = "$(printf %s bench-key | sha256sum | cut -d' ' -f1)"
$( [ "${QUOTA:-0}" = 1 ] && echo 'quota = { rpm = 1000000000, tpm = 1000000000000, concurrency = 100000 }' )
# No health probes during the run: their count grows with its length and
# would land in the marginal cost of a request.
[health]
interval = "${HEALTH_INTERVAL:-10m}"
stable_interval = "${HEALTH_INTERVAL:-10m}"
[[backends]]
name = "static"
zone = "az-a"
url = "http://127.0.0.1:$BP"
models = [$MODELS]
$PROVIDER_TOML
$TELEMETRY_TOML
$POLICY_TOML
CONF
# A fleet and a tenant list of any size (BACKENDS, TENANTS), appended.
python3 - "${BACKENDS:-1}" "${TENANTS:-1}" "$BP" >>$WORK/z.toml <<'PY'
import hashlib, sys
backends, tenants, port = (int(a) for a in sys.argv[1:])
out = []
for i in range(1, backends):
    zone = ("az-a", "az-b", "az-c")[i % 3]
    out.append(f'[[backends]]\nname = "b{i}"\nzone = "{zone}"\nurl = "http://127.0.0.1:{port}"\nmodels = ["m{i % 100}"]\n')
for i in range(1, tenants):
    digest = hashlib.sha256(f"tenant-key-{i}".encode()).hexdigest()
    out.append(f'[[tenants]]\nname = "t{i}"\nkey_sha256 = "{digest}"\n')
print("\n".join(out))
PY
run() {
  local n=$1 out=$WORK/cg.$1
  RUST_LOG=warn valgrind --tool=callgrind $VG_OPTS --callgrind-out-file=$out "$BIN" serve --config $WORK/z.toml >/dev/null 2>$WORK/vg.$n &
  local pid=$!
  # A config of 10,000 backends or 100,000 tenants takes minutes to load under valgrind.
  for _ in $(seq 3000); do curl -s -o /dev/null http://127.0.0.1:$ZP/healthz && break; sleep 0.2; done
  python3 - "$ZP" "$n" "$STREAM" "$CONNS" "${TOKENS:-16}" <<'PY'
import http.client, sys, json
port, n, stream, conns, tokens = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])
body = json.dumps({"model":"bench","max_tokens":tokens,"stream":stream,"messages":[{"role":"user","content":"hello"}]})
cs = [http.client.HTTPConnection("127.0.0.1", port) for _ in range(conns)]
headers = {"Authorization":"Bearer bench-key","Content-Type":"application/json"}
for _ in range(n):
    for c in cs:
        c.request("POST", "/v1/chat/completions", body, headers)
    for c in cs:
        r = c.getresponse(); r.read()
        assert r.status == 200, r.status
PY
  kill -INT $pid; wait $pid 2>/dev/null || true
  # The events line names the counters; summary holds their totals.
  grep -E "^events:" $out | head -1 > $WORK/events.$n
  grep -E "^summary:|^totals:" $out | head -1 | cut -d' ' -f2-
}
CONNS=${CONNS:-1}
# valgrind options: per-instruction counts (ATOMICS), the cache simulation (CACHE)
VG_OPTS=""
[ "${ATOMICS:-0}" = 1 ] && VG_OPTS="--dump-instr=yes"
[ "${CACHE:-0}" = 1 ] && VG_OPTS="$VG_OPTS --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,8,64"
if [ -n "${COLLECT:-}" ]; then
  IFS=';' read -ra PATTERNS <<<"$COLLECT"
  for p in "${PATTERNS[@]}"; do VG_OPTS="$VG_OPTS --toggle-collect=$p"; done
fi
S1=$(run $N1); S2=$(run $N2)
kill $MOCK $SINK 2>/dev/null || true
python3 - "$(cat $WORK/events.$N1)" "$S1" "$S2" $(((N2 - N1) * CONNS)) $N1 $N2 <<'PY'
import sys
names = sys.argv[1].split()[1:]
a, b = [list(map(int, x.split())) for x in sys.argv[2:4]]
n = int(sys.argv[4])
print(f"instructions per request: {(b[0]-a[0])/n:.0f}  ({a[0]} @ {sys.argv[5]}, {b[0]} @ {sys.argv[6]} rounds)")
if len(names) > 1:
    print("per request: " + "  ".join(f"{k} {(y-x)/n:.1f}" for k, x, y in zip(names[1:], a[1:], b[1:])))
PY
if [ "${ATOMICS:-0}" = 1 ]; then
  LIBC=$(readlink -f "$(ldd "$BIN" | awk '/libc.so/ {print $3}')")
  python3 "$(dirname "$0")/atomics.py" $WORK/cg.$N1 $WORK/cg.$N2 $(((N2 - N1) * CONNS)) "$(readlink -f "$BIN")" "$LIBC"
fi
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp $WORK/cg.$N1 $WORK/cg.$N2 "$KEEP"/; fi
rm -rf $WORK
