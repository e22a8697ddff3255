#!/usr/bin/env bash
# Loopback load benchmark: zonegate against nginx as a reverse proxy, same
# run, same backend, with wrk. Prints requests/s and p50/p99 latency per
# target and the ratios zonegate / nginx per cell.
#
# The matrix (issue 16's method): wrk with 1 and 2 threads, 32 and 256
# connections, a POST of a small chat body, against
#   direct    the backend itself: a static nginx answering a fixed chat
#             completion (1 worker);
#   nginx     nginx as the peer proxy (2 workers, least_conn, keep-alive 128);
#   zonegate  a standalone zonegate node (one data-plane thread per core);
#   floor     examples/floor_proxy.rs: zonegate's thread and pool layout and
#             syscalls with none of a gateway's work, the most a tokio
#             proxy reaches here (FLOOR=0 leaves it out).
# Each cell also counts the upstream connections the proxy opened during
# it (the backend's stub_status accepts): keep-alive reuse means a handful,
# not one per request.
# Then a streaming case (256 concurrent SSE streams of 16 chunks from the
# mock backend, direct / nginx / zonegate) and a memory case: zonegate's
# RSS idle, and while it carries 1,000 concurrent slow streams.
#
#   benches/load.sh                    # the matrix, streams and memory, 10 s per cell
#   DURATION=20 benches/load.sh
#   ROUNDS=3 DURATION=5 ONLY=matrix benches/load.sh
#                                      # each cell's targets run ROUNDS times, their order
#                                      # rotated every round (the one that runs first does
#                                      # a few % better); rows are medians (req/s, latency,
#                                      # CPU), errors and upstream connections are summed.
#                                      # A -t2 -c256 cell swings by ±10% between single runs;
#                                      # with ROUNDS > 1 each cell also prints zonegate / nginx
#                                      # round by round (paired: free of the drift between rounds)
#                                      # and their medians; with ROUNDS >= 5 each median's 90%
#                                      # interval and a verdict, and the matrix ends with the
#                                      # target (>= 1.0x req/s, p99 <= nginx's, every cell).
#   ONLY=matrix|paced|streams|memory benches/load.sh
#                                      # paced: the latency each proxy adds below saturation
#                                      # (wrk -t1 -c32, each connection pausing 0-2 ms, then
#                                      # 1-5 ms, between requests: a fixed offered load; with
#                                      # ROUNDS > 1 also zonegate / nginx paired by round)
#   CLUSTER=1 benches/load.sh          # zonegate as a Raft member (control plane running)
#   APPLY=1 benches/load.sh            # also zonegate (a Raft member) while a replicated
#                                      # config is applied every 0.2 s (zg-applying)
#   TLS=1 benches/load.sh              # also zonegate and nginx over HTTPS: HTTP/1.1 keep-alive (wrk),
#                                      # HTTP/2 (h2load, if installed), and new connections
#                                      # per request (wrk, Connection: close)
#   QUOTA=1 benches/load.sh            # the tenant has rpm/tpm/concurrency quotas far above the
#                                      # load: every request pays the whole quota stage (and headers)
#   BIN=target/pgo/zonegate benches/load.sh
#                                      # measures that zonegate binary (benches/pgo.sh's
#                                      # profile-guided build) instead of building one
#   BASE=/tmp/zonegate-old benches/load.sh
#                                      # A/B in one run: adds a zg-base row (that binary, same
#                                      # config) after every zonegate row of the matrix and streams;
#                                      # on a shared 2-core machine two separate runs differ by ±10%
#
# Needs nginx and wrk (`apt-get install nginx wrk`; TLS=1 also openssl, and
# h2load from nghttp2-client for the HTTP/2 row); this is a benchmark,
# never part of the tests. Everything listens on 127.0.0.1 and stops when
# the script exits.
set -euo pipefail

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-1}
ONLY=${ONLY:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

needs nginx wrk

wait_http() {
  for _ in $(seq 100); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "not answering: $1" >&2; exit 1
}

release_binary
if [ "${FLOOR:-1}" = 1 ]; then
  echo "building the floor..." >&2
  (cd "$ROOT" && cargo build --profile dist --quiet --example floor_proxy)
fi
FLOOR_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/dist/examples/floor_proxy
KEY=bench-key
CHAT='{"model":"bench","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
STREAM_CHAT='{"model":"bench-stream","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hello"}]}'

# The backends: a static nginx answering every POST with one chat
# completion (and /health, /metrics), and the mock backend for streams.
STATIC_PORT=$(start_static_backend)
MOCK_PORT=$(free_port)
RUST_LOG=warn setsid "$BIN" mock-backend --listen "127.0.0.1:$MOCK_PORT" --name mock --model bench-stream >"$WORK/mock.log" 2>&1 &
PIDS+=($!)

NGINX_PORT=$(start_nginx proxy 2 "
    location /v1/chat/stream { proxy_pass http://mock/v1/chat/completions; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }
    location / { proxy_pass http://static; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }" \
  "$(proxy_to static "$STATIC_PORT") $(proxy_to mock "$MOCK_PORT")")

ZG_PORT=$(free_port)
ADMIN_PORT=$(free_port)
QUOTA_LINE=$( [ "${QUOTA:-0}" = 1 ] && echo 'quota = { rpm = 1000000000, tpm = 1000000000000, concurrency = 100000 }' || true )
zonegate_config "$ZG_PORT" "$ADMIN_PORT" "$STATIC_PORT" "$QUOTA_LINE" >"$WORK/zonegate.toml"
backend_block mock "$MOCK_PORT" bench-stream >>"$WORK/zonegate.toml"
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
RUST_LOG=warn setsid "$BIN" serve --config "$WORK/zonegate.toml" >"$WORK/zonegate.log" 2>&1 &
ZG_PID=$!
PIDS+=($ZG_PID)

if [ "${FLOOR:-1}" = 1 ]; then
  FLOOR_PORT=$(free_port)
  setsid "$FLOOR_BIN" "127.0.0.1:$FLOOR_PORT" "127.0.0.1:$STATIC_PORT" "$(nproc)" &
  FLOOR_PID=$!
  PIDS+=($FLOOR_PID)
fi

if [ -n "${BASE:-}" ]; then
  # The build to compare with: an identical node from another binary
  # (idle while the others are measured).
  BASE_PORT=$(free_port)
  sed -e "s/^listen = .*/listen = \"127.0.0.1:$BASE_PORT\"/" \
      -e "s/^admin_listen = .*/admin_listen = \"127.0.0.1:$(free_port)\"/" \
      -e "s|^data_dir = .*|data_dir = \"$WORK/data-base\"|" \
      -e '/^\[\[cluster.members\]\]/,$d' "$WORK/zonegate.toml" >"$WORK/zonegate-base.toml"
  RUST_LOG=warn setsid "$BASE" serve --config "$WORK/zonegate-base.toml" >"$WORK/zonegate-base.log" 2>&1 &
  BASE_PID=$!
  PIDS+=($BASE_PID)
fi

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
  RUST_LOG=warn setsid "$BIN" serve --config "$WORK/zonegate-tls.toml" >"$WORK/zonegate-tls.log" 2>&1 &
  TLS_PID=$!
  PIDS+=($TLS_PID)
  # nginx over TLS, the same certificate, TLS 1.3 only (zonegate's
  # rustls prefers it), session resumption on (tickets, as rustls).
  NGINX_TLS_PORT=$(start_nginx proxy-tls 2 "
    ssl_certificate $WORK/tls.crt; ssl_certificate_key $WORK/tls.key;
    ssl_protocols TLSv1.3; ssl_session_tickets on; ssl_session_cache shared:tls:10m;
    location / { proxy_pass http://static; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }" \
    "$(proxy_to static "$STATIC_PORT")" "ssl http2")
  for _ in $(seq 100); do
    curl -sk -o /dev/null "https://127.0.0.1:$TLS_PORT/healthz" && break
    sleep 0.1
  done
fi

for port in $STATIC_PORT $MOCK_PORT $NGINX_PORT $ZG_PORT ${BASE_PORT:-} ${FLOOR_PORT:-}; do wait_http "http://127.0.0.1:$port/"; done
sleep 2
rss_kb() { ps -o rss= -p "$ZG_PID" | tr -d ' '; }
IDLE_RSS_KB=$(rss_kb)

# wrk script: POST $BODY with the tenant's key; prints one RESULT line.
post_lua() {
  cat >"$WORK/$1.lua" <<LUA
wrk.method = "POST"
wrk.body = '$2'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
${3:-}
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.3f %.3f %d %d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.requests))
end
LUA
}
post_lua chat "$CHAT"
post_lua stream "$STREAM_CHAT"
post_lua close "$CHAT" 'wrk.headers["Connection"] = "close"'

accepts() { curl -s "http://127.0.0.1:$STATIC_PORT/status" | awk 'NR==3{print $1}'; }

# run NAME URL THREADS CONNECTIONS [SCRIPT [SECONDS]]: one RESULT line,
# named, with the backend connections accepted during it.
# The processes whose CPU a target's row reports: the proxy's, not the
# backend's (direct has none).
cpu_pids() {
  case $1 in
    nginx) nginx_workers proxy ;;
    nginx-tls*) nginx_workers proxy-tls ;;
    zg-tls*) echo "${TLS_PID:-}" ;;
    zg-base) echo "${BASE_PID:-}" ;;
    floor) echo "${FLOOR_PID:-}" ;;
    zonegate|zg-*) echo "$ZG_PID" ;;
  esac
}
# The machine's idle and total CPU ticks so far (/proc/stat: idle + iowait).
machine_ticks() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, t; exit }' /proc/stat; }

# run NAME URL THREADS CONNECTIONS [SCRIPT [SECONDS]]: one RESULT line,
# named, with the backend connections accepted during it, the proxy's
# CPU microseconds per request and the machine's idle share (%): a
# closed loop that leaves cores idle is waiting, not short of CPU.
run() {
  local name=$1 url=$2 t=$3 c=$4 script=${5:-chat} d=${6:-$DURATION} before after pids cpu0 cpu m0 m1
  pids=$(cpu_pids "$name")
  before=$(accepts)
  cpu0=$(cpu_ticks $pids)
  m0=$(machine_ticks)
  line=$(wrk -t"$t" -c"$c" -d"$d"s --timeout 10s -s "$WORK/$script.lua" "$url" | grep '^RESULT' || echo "RESULT 0 0 0 1 0")
  m1=$(machine_ticks)
  cpu=$(( ($(cpu_ticks $pids) - cpu0) * 1000000 / $(getconf CLK_TCK) ))
  after=$(accepts)
  echo "$line $((after - before))" | awk -v name="$name" -v cpu="$cpu" -v has="${pids:+1}" -v m="$m0 $m1" '
    { split(m, k, " "); idle = (k[4] > k[2]) ? 100 * (k[3] - k[1]) / (k[4] - k[2]) : 0
      $1 = name; printf "%s %s %.0f\n", $0, (has && $6 > 0) ? sprintf("%.1f", cpu / $6) : "-", idle }'
}

echo "warming up..." >&2
wrk -t1 -c8 -d2s -s "$WORK/chat.lua" "http://127.0.0.1:$ZG_PORT/v1/chat/completions" >/dev/null
wrk -t1 -c8 -d2s -s "$WORK/chat.lua" "http://127.0.0.1:$NGINX_PORT/v1/chat/completions" >/dev/null

header() {
  printf '%-12s %4s %5s %10s %8s %8s %7s %9s %10s %5s\n' target wrk conns "req/s" "p50 ms" "p99 ms" errors "upstream" "cpu us/req" "idle%"
}
row() {
  # name rps p50 p99 errors requests upstream-conns cpu idle, plus threads and conns
  printf '%-12s %4s %5s %10s %8s %8s %7s %9s %10s %5s\n' "$1" "-t${10}" "${11}" "$2" "$3" "$4" "$5" "$7" "$8" "$9"
}

url_of() {
  case $1 in
    direct) echo "http://127.0.0.1:$STATIC_PORT/v1/chat/completions" ;;
    nginx) echo "http://127.0.0.1:$NGINX_PORT/v1/chat/completions" ;;
    zonegate) echo "http://127.0.0.1:$ZG_PORT/v1/chat/completions" ;;
    zg-base) echo "http://127.0.0.1:$BASE_PORT/v1/chat/completions" ;;
    floor) echo "http://127.0.0.1:$FLOOR_PORT/v1/chat/completions" ;;
  esac
}

# cell THREADS CONNECTIONS SCRIPT TARGET...: each target ROUNDS times, the
# order rotated every round; prints a row per target (medians of the
# rates and times, sums of the counts) and sets CELL to those rows and
# RATIOS to zonegate / nginx paired by round (req/s, then p99): within a
# round the two run at most a round's length apart (seconds), so a
# round's ratio is free of the machine's drift between rounds.
cell() {
  local t=$1 c=$2 script=$3 runs="" round i n target r
  shift 3
  local targets=("$@")
  n=${#targets[@]}
  CELL=""
  for round in $(seq 0 $((ROUNDS - 1))); do
    for i in $(seq 0 $((n - 1))); do
      target=${targets[$(((i + round) % n))]}
      runs+="$round $(run "$target" "$(url_of "$target")" "$t" "$c" "$script")"$'\n'
    done
  done
  for target in "${targets[@]}"; do
    r=$(printf '%s' "$runs" | awk -v name="$target" "$ROUND_STATS"'
      function col(k,   i, v) { for (i = 1; i <= n; i++) v[i] = vals[i, k]; return median(v, n) }
      $2 == name { n++; for (k = 3; k <= 10; k++) vals[n, k] = $k; e += $6; q += $7; u += $8 }
      END { print name, col(3), col(4), col(5), e, q, u, col(9), col(10) }')
    row $r "$t" "$c"
    CELL+="$r"$'\n'
  done
  local paired
  paired=$(printf '%s' "$runs" | awk "$ROUND_STATS"'
    $2 == "nginx" { nr[$1] = $3; np[$1] = $5 } $2 == "zonegate" { zr[$1] = $3; zp[$1] = $5 }
    END { for (k = 0; k in nr; k++) if (nr[k] > 0 && np[k] > 0) { r[++n] = zr[k] / nr[k]; p[n] = zp[k] / np[k] }
          if (!n) exit
          line = said(r, n, "req/s", "faster"); short = SHORT
          line = line ", " said(p, n, "p99", "slower"); print line; print short, SHORT }')
  RATIOS=$(printf '%s\n' "$paired" | head -1)
  # "REQ LO HI P99 LO HI": the paired medians and their intervals.
  PAIRED=$(printf '%s\n' "$paired" | sed -n 2p)
}

if [ "$ONLY" = all ] || [ "$ONLY" = matrix ]; then
  echo
  echo "== matrix: POST chat, $DURATION s per cell x $ROUNDS round(s), $(nproc) cores, control plane: $([ "${CLUSTER:-0}" = 1 ] && echo raft || echo standalone)"
  header
  SUMMARY=""
  TARGET=""
  for t in 1 2; do
    for c in 32 256; do
      cell "$t" "$c" chat direct nginx ${FLOOR_PORT:+floor} zonegate ${BASE:+zg-base}
      SUMMARY+=$(echo "$CELL" | awk -v t="$t" -v c="$c" '
        $1=="direct"{dp99=$4} $1=="nginx"{nr=$2; np99=$4; nc=$8} $1=="zonegate"{zr=$2; zp99=$4; zc=$8} $1=="zg-base"{br=$2; bc=$8} $1=="floor"{fr=$2; fc=$8}
        END { printf "wrk -t%s -c%-4s zonegate/nginx req/s %.2fx, CPU per request %.2fx   p99 zonegate %.3f vs nginx %.3f ms (%s)   added p99 over direct %+.3f ms",
          t, c, zr/nr, zc/nc, zp99, np99, (zp99 <= np99 ? "<=" : ">"), zp99 - dp99
          if (br) printf "   zonegate/base req/s %.2fx, CPU %.2fx", zr/br, zc/bc
          if (fr) printf "   floor/nginx req/s %.2fx, CPU %.2fx", fr/nr, fc/nc
          printf "\n" }')$'\n'
      [ "$ROUNDS" -gt 1 ] && SUMMARY+="    zonegate/nginx by round: $RATIOS"$'\n' && TARGET+="$PAIRED"$'\n'
    done
  done
  echo
  printf '%s' "$SUMMARY"
  # Issue 16's target, read from the paired rounds of all four cells.
  [ "$ROUNDS" -gt 1 ] && printf '%s' "$TARGET" | target_verdict
  echo "(upstream: backend connections the target opened during the cell; direct: the client's own)"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = paced ]; then
  # The latency a proxy adds, below saturation: each of wrk's 32
  # connections waits a random 0-2 ms (then 1-5 ms) after every answer
  # before its next request, so the offered load is fixed (~23k and ~9.4k
  # req/s here, half and a fifth of what either proxy can carry) and the
  # same for every target. At saturation (the matrix) a closed loop's
  # latency is its connections over its throughput: a proxy sharing two
  # cores with wrk and the backend halves the throughput and so doubles
  # the latency whatever it does per request.
  echo
  echo "== paced: POST chat, wrk -t1 -c32, each connection pausing between requests, $DURATION s x $ROUNDS round(s)"
  header
  PACED=""
  for pause in "0,2" "1,5"; do
    post_lua "paced-$pause" "$CHAT" "delay = function() return math.random($pause) end"
    cell 1 32 "paced-$pause" direct nginx zonegate ${BASE:+zg-base}
    PACED+=$(echo "$CELL" | awk -v pause="$pause" '
      $1=="direct"{d=$4} $1=="nginx"{n=$4; nr=$2} $1=="zonegate"{z=$4; zr=$2}
      END { sub(",", "-", pause); printf "pause %s ms (%.0f req/s)   added p99 over direct: zonegate %+.3f ms, nginx %+.3f ms\n", pause, zr, z - d, n - d }')$'\n'
    [ "$ROUNDS" -gt 1 ] && PACED+="    zonegate/nginx by round: $RATIOS"$'\n'
  done
  echo
  printf '%s' "$PACED"
fi

if [ "${APPLY:-0}" = 1 ] || [ "${TLS:-0}" = 1 ]; then
  echo
  echo "== extra rows: wrk -t2 -c32"
  header
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
    row $(run zonegate "http://127.0.0.1:$ZG_PORT/v1/chat/completions" 2 32) 2 32
    ( i=0; while :; do apply "$WORK/c$((i % 2)).toml" && echo ok >>"$WORK/applies"; i=$((i + 1)); sleep 0.2; done ) &
    APPLIER=$!
    row $(run zg-applying "http://127.0.0.1:$ZG_PORT/v1/chat/completions" 2 32) 2 32
    kill "$APPLIER" 2>/dev/null || true
    echo "(zg-applying: $(wc -l <"$WORK/applies" 2>/dev/null || echo 0) configs applied during the run)"
  fi
  if [ "${TLS:-0}" = 1 ]; then
    printf '%s' "$CHAT" >"$WORK/body.json"
    # h2 NAME PORT: h2load's line ("finished in Xs, N req/s"), one stream
    # per connection, as a row.
    h2() {
      h2load -t2 -c32 -m1 -D"$DURATION" \
        -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
        -d "$WORK/body.json" "https://127.0.0.1:$2/v1/chat/completions" 2>/dev/null | awk -v name="$1" '
          /finished in/ { rps = $4 }
          /^requests:/ { failed = $10 }
          END { printf "%-12s %4s %5s %10s %8s %8s %7s %9s\n", name, "h2", 32, rps, "-", "-", failed, "-" }'
    }
    # Each pair ROUNDS times, which goes first alternating round by round.
    tls_url() { echo "https://127.0.0.1:$1/v1/chat/completions"; }
    for r in $(seq "$ROUNDS"); do
      pairs=("nginx-tls $NGINX_TLS_PORT" "zg-tls $TLS_PORT")
      [ $((r % 2)) = 0 ] && pairs=("zg-tls $TLS_PORT" "nginx-tls $NGINX_TLS_PORT")
      for p in "${pairs[@]}"; do
        set -- $p
        row $(run "$1" "$(tls_url "$2")" 2 32) 2 32
      done
      if command -v h2load >/dev/null; then
        for p in "${pairs[@]}"; do
          set -- $p
          h2 "${1/tls/h2}" "$2"
        done
      fi
      for p in "${pairs[@]}"; do
        set -- $p
        row $(run "$1-new" "$(tls_url "$2")" 2 32 close) 2 32
      done
    done
    row $(run zg-new "http://127.0.0.1:$ZG_PORT/v1/chat/completions" 2 32 close) 2 32
    echo "(*-tls: HTTPS keep-alive; *-h2: HTTP/2 over TLS; *-new: a new connection per request;"
    echo " nginx-tls: nginx with the same certificate, TLS 1.3, tickets; ROUNDS pairs, order alternating)"
  fi
fi

if [ "$ONLY" = all ] || [ "$ONLY" = streams ]; then
  echo
  echo "== streams: 256 concurrent SSE streams of 16 chunks (mock backend), wrk -t2, $DURATION s each"
  header
  row $(run direct "http://127.0.0.1:$MOCK_PORT/v1/chat/completions" 2 256 stream) 2 256
  row $(run nginx "http://127.0.0.1:$NGINX_PORT/v1/chat/stream" 2 256 stream) 2 256
  row $(run zonegate "http://127.0.0.1:$ZG_PORT/v1/chat/completions" 2 256 stream) 2 256
  [ -n "${BASE:-}" ] && row $(run zg-base "http://127.0.0.1:$BASE_PORT/v1/chat/completions" 2 256 stream) 2 256
  echo "(the mock writes its 16 events at once: they arrive in one read; both proxies relay"
  echo " them in one write)"
  echo
  echo "== paced streams: the same, 2 ms between events (a fast generation)"
  header
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
    -d '{"stream_interval_ms": 2}' "http://127.0.0.1:$MOCK_PORT/mock/faults"
  row $(run nginx "http://127.0.0.1:$NGINX_PORT/v1/chat/stream" 2 256 stream) 2 256
  row $(run zonegate "http://127.0.0.1:$ZG_PORT/v1/chat/completions" 2 256 stream) 2 256
  [ -n "${BASE:-}" ] && row $(run zg-base "http://127.0.0.1:$BASE_PORT/v1/chat/completions" 2 256 stream) 2 256
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
    -d '{"stream_interval_ms": 0}' "http://127.0.0.1:$MOCK_PORT/mock/faults"
fi

if { [ "$ONLY" = all ] || [ "$ONLY" = h2 ]; } && command -v h2load >/dev/null; then
  # HTTP/2 in the clear (prior knowledge): 4 connections carrying 64
  # concurrent streams each must be served as well as 256 connections.
  printf '%s' "$CHAT" >"$WORK/body.json"
  echo
  echo "== HTTP/2 multiplexing (h2c, h2load -t2 -c4 -m64, $DURATION s)"
  h2load -t2 -c4 -m64 -D"$DURATION" \
    -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
    -d "$WORK/body.json" "http://127.0.0.1:$ZG_PORT/v1/chat/completions" 2>/dev/null |
    grep -E "finished in|^requests:|^status codes:" || echo "h2load failed"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = memory ]; then
  # 1,000 streams of 16 chunks 0.5 s apart (8 s each), held open at once;
  # RSS sampled in the middle of the run.
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
    -d '{"stream_interval_ms": 500}' "http://127.0.0.1:$MOCK_PORT/mock/faults"
  wrk -t2 -c1000 -d12s --timeout 20s -s "$WORK/stream.lua" "http://127.0.0.1:$ZG_PORT/v1/chat/completions" >"$WORK/slow.out" &
  WRK=$!
  sleep 6
  OPEN=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^zonegate_node_in_flight_requests /{print $2}')
  STREAMS_RSS_KB=$(rss_kb)
  wait "$WRK" || true
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
    -d '{"stream_interval_ms": 0}' "http://127.0.0.1:$MOCK_PORT/mock/faults"
  echo
  echo "== memory (zonegate, standalone)"
  echo "RSS idle: $((IDLE_RSS_KB / 1024)) MiB ($IDLE_RSS_KB KiB)"
  echo "RSS with ${OPEN:-?} streams in flight (1,000 slow streams offered): $((STREAMS_RSS_KB / 1024)) MiB ($STREAMS_RSS_KB KiB)"
  grep -E "requests in|Non-2xx|Socket errors" "$WORK/slow.out" || true
fi
