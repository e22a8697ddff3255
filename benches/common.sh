# Sourced by the loopback benchmarks (load.sh, streams.sh, overload.sh,
# split.sh, ab.sh, whole.sh, stalls.sh, pool.sh): a work directory removed
# on exit with every process started, free ports, the tools they need,
# nginx, the static backend they measure against, a zonegate node in front
# of it, and the statistics of paired rounds. Not a benchmark by itself.
#
# Every server a benchmark starts runs in a session of its own (`setsid`):
# with the kernel's autogroup scheduling (/proc/sys/kernel/
# sched_autogroup_enabled, on by default) a session is a scheduling group
# with its own share of the CPU. nginx daemonizes into a session of its
# own; a server left in the script's session shares one group with wrk,
# and wrk then waits for a core behind it (docs/src/performance.md, "Where the
# time goes"). A background job of a script is never a process group
# leader, so `setsid` execs in place and `$!` stays the server's pid.

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # Every nginx leaves its pid file here (start_nginx runs in a command
  # substitution, so it cannot add to an array of this shell).
  for n in "$WORK"/*.pid; do [ -f "$n" ] && kill "$(cat "$n")" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# needs TOOL...: stops the benchmark if a tool is missing, naming the
# distribution's packages for all of them (perf comes in linux-perf).
needs() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null && continue
    echo "needs $tool: apt-get install $(echo "$*" | sed 's/\bperf\b/linux-perf/')" >&2
    exit 1
  done
}

# release_binary: sets BIN to a release build of this tree unless it is
# set (another build to measure).
release_binary() {
  [ -n "${BIN:-}" ] && return
  echo "building release binary..." >&2
  (cd "$ROOT" && cargo build --profile dist --quiet)
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/dist/zonegate
}

# example_client NAME: builds examples/NAME.rs (a benchmark's client,
# `--release`) and prints its path.
example_client() {
  echo "building the client..." >&2
  (cd "$ROOT" && cargo build --release --quiet --example "$1")
  echo "${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/$1"
}

# start_nginx NAME WORKERS SERVER-BLOCK-BODY [UPSTREAM]: starts an nginx,
# prints its port.
start_nginx() {
  local name=$1 workers=$2 server=$3 upstream=${4:-} listen=${5:-} port
  port=$(free_port)
  mkdir -p "$WORK/$name"
  cat >"$WORK/$name.conf" <<CONF
worker_processes $workers;
pid $WORK/$name.pid;
error_log $WORK/$name/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $WORK/$name;
  proxy_temp_path $WORK/$name;
  keepalive_requests 1000000;
  $upstream
  server {
    listen 127.0.0.1:$port reuseport $listen;
    $server
  }
}
CONF
  nginx -c "$WORK/$name.conf" -p "$WORK/$name"
  echo "$port"
}

# upstream NAME PORT: an nginx upstream block, least_conn with keep-alive.
proxy_to() {
  echo "upstream $1 { least_conn; server 127.0.0.1:$2; keepalive 128; }"
}

# The static backend: one nginx worker answering every POST with one chat
# completion (and /status, /metrics); prints its port.
COMPLETION='{"id":"chatcmpl-static","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"hello from a static backend"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}'
start_static_backend() {
  start_nginx static 1 "
    location = /status { stub_status; }
    location = /metrics { default_type text/plain; return 200 'vllm:num_requests_waiting 0\n'; }
    location / { default_type application/json; return 200 '$COMPLETION'; }"
}

# start_mock_backend BINARY PACE: zonegate's mock backend in the static
# one's place (model `bench`): 16 events per streamed answer, PACE ms
# apart; prints its port. Its pid file is cleaned up like nginx's.
start_mock_backend() {
  local port
  port=$(free_port)
  RUST_LOG=warn setsid "$1" mock-backend --listen "127.0.0.1:$port" --name static --model bench >"$WORK/mock.log" 2>&1 &
  echo $! >"$WORK/mock.pid"
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.1; done
  curl -s -o /dev/null -X POST -H 'content-type: application/json' \
    -d "{\"stream_interval_ms\": $2}" "http://127.0.0.1:$port/mock/faults"
  echo "$port"
}

# start_backend BINARY: the backend of ab.sh, split.sh and stalls.sh, by STREAM and
# PACE: the static nginx, or (STREAM=1) BINARY's mock backend streaming
# 16 events PACE ms apart. Sets SP (its port) and writes $WORK/post.lua
# (post_lua; streamed with STREAM=1).
start_backend() {
  local stream=false
  if [ "${STREAM:-0}" = 1 ]; then
    SP=$(start_mock_backend "$1" "${PACE:-0}")
    stream=true
  else
    SP=$(start_static_backend)
  fi
  post_lua "$stream"
}

# zonegate_node NAME BINARY [EXTRA]: a standalone node of BINARY in front
# of the backend at SP (its data in $WORK/data-NAME; EXTRA: more [node]
# lines), in a session of its own; sets NAME_PID and NAME_PORT once it
# answers.
zonegate_node() {
  local port
  port=$(free_port)
  zonegate_config "$port" "$(free_port)" "$SP" | sed "s|$WORK/data|$WORK/data-$1|" \
    | awk -v extra="${3:-}" '{print} /^data_dir/ && extra != "" {print extra}' >"$WORK/$1.toml"
  RUST_LOG=warn setsid "$2" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  printf -v "${1}_PID" %s $!
  printf -v "${1}_PORT" %s "$port"
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && return 0; sleep 0.1; done
  echo "zonegate $1 ($2) does not answer" >&2; exit 1
}

# stream_bench BINARY: what streams.sh and ab-streams.sh run against: the
# client examples/sse_clients.rs (CLIENT), a request for TOKENS deltas
# (BODY), BINARY's mock backend sending them PACE ms apart (SP), and nginx
# in front of it (2 workers, proxy_buffering off, keep-alive upstream: NP).
stream_bench() {
  CLIENT=$(example_client sse_clients)
  BODY="{\"model\":\"bench\",\"max_tokens\":$TOKENS,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}"
  SP=$(start_mock_backend "$1" "$PACE")
  NP=$(start_nginx proxy 2 "
    location / { proxy_pass http://static; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }" \
    "$(proxy_to static "$SP")")
}

# start_proxies: the backend (start_backend), then in front of it nginx as
# a proxy (2 workers: sets NP) and a zonegate node of BIN (sets ZP and
# ZPID; NODE: extra [node] lines for it).
start_proxies() {
  start_backend "$BIN"
  NP=$(start_nginx proxy 2 "
    location / { proxy_pass http://static; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }" \
    "$(proxy_to static "$SP")")
  zonegate_node z "$BIN" "${NODE:-}"
  ZP=$z_PORT
  ZPID=$z_PID
}

# User + system CPU of the given processes, in clock ticks.
cpu_ticks() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}

# nginx_workers NAME: the worker pids of the nginx started as NAME.
nginx_workers() { pgrep -P "$(cat "$WORK/$1.pid")" | tr '\n' ' '; }

# while_loaded PORT SECS CMD...: wrk (-t$T -c$C, the POST of post.lua)
# against PORT for SECS + 3 s, and CMD once 2 s of it have passed (the
# connections open and the load steady). wrk's report lands in
# $WORK/wrk.txt; its pid is WRK_PID while CMD runs.
while_loaded() {
  local port=$1 secs=$2
  shift 2
  wrk --latency -t"$T" -c"$C" -d$((secs + 3))s -s "$WORK/post.lua" \
    "http://127.0.0.1:$port/v1/chat/completions" >"$WORK/wrk.txt" &
  WRK_PID=$!
  sleep 2
  "$@"
  wait "$WRK_PID"
}

# post_lua STREAM: writes $WORK/post.lua, wrk's POST of a small chat body
# to model `bench` with tenant `bench`'s key (STREAM: true or false).
post_lua() {
  cat >"$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"bench","max_tokens":16,"stream":$1,"messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-key"
LUA
}

# backend_block NAME PORT MODEL: one more [[backends]] entry (zone az-a)
# for a config zonegate_config wrote.
backend_block() {
  cat <<CONF
[[backends]]
name = "$1"
zone = "az-a"
url = "http://127.0.0.1:$2"
models = ["$3"]
CONF
}

# zonegate_config PORT ADMIN-PORT STATIC-PORT [TENANT-LINE]: a standalone
# node's config (tenant `bench`, key `bench-key`; model `bench` on the
# static backend) on stdout; callers append more backends.
zonegate_config() {
  cat <<CONF
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$2"
data_dir = "$WORK/data"
[[tenants]]
name = "bench"
key_sha256 = "$(printf %s bench-key | sha256sum | cut -d' ' -f1)"
${4:-}
[[backends]]
name = "static"
zone = "az-a"
url = "http://127.0.0.1:$3"
models = ["bench"]
CONF
}

# ROUND_STATS: awk functions for paired rounds (zonegate / nginx, one
# ratio per round), used by load.sh and pool.sh.
#   median(v, n): the median of v[1..n] (sorts v; the mean of the middle
#     two for an even n).
#   interval(v, n): after median(v, n) has sorted v, "LO HI PERCENT": the
#     narrowest pair of order statistics v[k], v[n+1-k] that still holds
#     the true median with at least 90% probability, whatever the
#     distribution (each round falls below the median with probability
#     1/2, so the pair misses it with probability 2 P(Binomial(n, 1/2) <
#     k)); "" for fewer than five rounds, too few for 90%.
#   said(v, n, name, more): "NAME r1 r2 ... (median M, P% in LO-HI:
#     VERDICT)" (without the rounds when the awk variable QUIET is set),
#     the verdict by whether the interval lies above 1, below it or holds
#     it; sets SHORT to "M LO HI" ("M - -" without an interval).
ROUND_STATS='
  function median(v, n,   i, j, tmp) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { tmp = v[i]; v[i] = v[j]; v[j] = tmp }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  function interval(v, n,   k, below, term, best) {
    below = 0; term = 0.5 ^ n
    for (k = 1; 2 * k <= n; k++) {
      below += term
      if (1 - 2 * below < 0.90) break
      best = sprintf("%s %s %.0f", v[k], v[n + 1 - k], 100 * (1 - 2 * below))
      term = term * (n - k + 1) / k
    }
    return best
  }
  function said(v, n, name, more,   out, i, m, ci, f) {
    if (!QUIET) for (i = 1; i <= n; i++) out = out sprintf(" %.2f", v[i])
    m = median(v, n); ci = interval(v, n); SHORT = sprintf("%.3f - -", m)
    if (ci == "") return sprintf("%s%s (median %.2f)", name, out, m)
    split(ci, f, " "); SHORT = sprintf("%.3f %.3f %.3f", m, f[1], f[2])
    return sprintf("%s%s (median %.2f, %s%% in %.2f-%.2f: %s)", name, out, m, f[3], f[1], f[2],
      f[1] > 1 ? "zonegate " more : f[2] < 1 ? "nginx " more : "no difference shown")
  }'

# target_verdict: issue 16's target read from each cell's "REQ LO HI P99
# LO HI" line on stdin (the paired medians and their intervals, SHORT of
# said for req/s and p99).
target_verdict() {
  awk '
    { n++; if ($1 >= 1 && $4 <= 1) met++; if ($3 != "-" && ($3 < 1 || $5 > 1)) behind++
      if ($2 != "-" && ($2 > 1 || $6 < 1)) ahead++ }
    END { printf "target (>= 1.0x nginx req/s and p99 <= nginx, every cell), paired medians: %s (%d of %d cells)", met == n ? "met" : "not met", met, n
          if ($2 != "-") printf "; 90%% intervals: nginx ahead in %d cell(s), zonegate ahead in %d", behind, ahead
          printf "\n" }'
}
