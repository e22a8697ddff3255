#!/usr/bin/env bash
# A profile-guided release build of zonegate (PGO): an instrumented build
# serves a training load on 127.0.0.1, and the build that uses its profile
# lays the request path's code out hot-first and inlines where the load
# went. The data plane's code per request is larger than the instruction
# cache (docs/src/performance.md, "Where the time goes"); this is the build a
# deployment ships for throughput. `cargo build --profile dist` stays the
# plain one: same source, same behaviour, only code generation differs
# (`--release` is the everyday build: no cross-crate LTO, quicker to build).
#
#   benches/pgo.sh                     # writes target/pgo/zonegate
#   OUT=/usr/local/bin/zonegate benches/pgo.sh
#   SECS=20 benches/pgo.sh             # seconds of each training load (default 8)
#
# The training load: zonegate's own mock backend behind a standalone node
# with two backends, wrk POSTing chat completions (whole answers, then
# streams), 300 streams paced 10 ms an event (examples/sse_clients.rs),
# with a few clients' mistakes between (no key, a wrong key, an
# unknown model, malformed JSON) and a /metrics scrape. The mock backend
# writes no profile: only the gateway's code is trained.
#
# Needs the toolchain's llvm-profdata (`rustup component add llvm-tools`),
# wrk and curl. Two release builds into target/pgo (their own target
# directories: the flags differ from a plain build's), ~7 minutes each
# here from scratch. A benchmark tool, never part of the tests.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECS=${SECS:-8}
PGO_DIR=${CARGO_TARGET_DIR:-$ROOT/target}/pgo
OUT=${OUT:-$PGO_DIR/zonegate}
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"

PROFDATA=$(find "$(rustc --print sysroot)/lib/rustlib" -name llvm-profdata -type f 2>/dev/null | head -1)
[ -n "$PROFDATA" ] || { echo "needs llvm-profdata: rustup component add llvm-tools" >&2; exit 1; }
for tool in wrk curl; do
  command -v "$tool" >/dev/null || { echo "needs $tool: apt-get install $tool" >&2; exit 1; }
done

CLIENT=$(example_client sse_clients)
echo "instrumented build..." >&2
# The profiles' directory is set at run time (LLVM_PROFILE_FILE); the flag
# stays the same from run to run, so the build after a change is incremental.
RAW=$WORK/raw
# Both builds use the dist profile as it is: one instrumented without
# LTO gave a profile that matched nothing (32.3k instructions per request,
# as without one): the profile names functions by their mangled symbols,
# and cargo's symbol hash covers the profile's settings.
(cd "$ROOT" && RUSTFLAGS="-Cprofile-generate=$PGO_DIR/generate/profiles" CARGO_TARGET_DIR=$PGO_DIR/generate \
  cargo build --profile dist --locked --quiet --bin zonegate)
GEN=$PGO_DIR/generate/dist/zonegate

# Two mock backends (the node then scores and picks), profiles discarded.
# Called in a command substitution (a subshell), so its pid goes to a
# file common.sh's cleanup kills, not to PIDS (which would be the
# subshell's: the mocks outlived the script that way).
mock() {
  local port
  port=$(free_port)
  LLVM_PROFILE_FILE=/dev/null RUST_LOG=warn "$GEN" mock-backend --listen "127.0.0.1:$port" \
    --name "$1" --model bench >"$WORK/$1.log" 2>&1 &
  echo $! >"$WORK/$1.pid"
  echo "$port"
}
M1=$(mock m1)
M2=$(mock m2)
ZP=$(free_port)
AP=$(free_port)
# Hardly a grace at exit: the node stops once the training is done.
zonegate_config "$ZP" "$AP" "$M1" | sed '/^id = 1$/a drain_grace = "10ms"' >"$WORK/z.toml"
backend_block m2 "$M2" bench >>"$WORK/z.toml"
LLVM_PROFILE_FILE="$RAW/zonegate-%p.profraw" RUST_LOG=warn "$GEN" serve --config "$WORK/z.toml" \
  >"$WORK/z.log" 2>&1 &
ZPID=$!
PIDS+=($ZPID)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$ZP/healthz" && break; sleep 0.1; done

post() {
  post_lua "$1"
  wrk -t2 -c"$2" -d"${SECS}s" -s "$WORK/post.lua" "http://127.0.0.1:$ZP/v1/chat/completions" |
    grep -E "Requests/sec|Non-2xx" >&2
}
mistakes() {
  local url=http://127.0.0.1:$ZP/v1/chat/completions
  for _ in $(seq 50); do
    curl -s -o /dev/null -X POST -d '{}' "$url"
    curl -s -o /dev/null -X POST -H 'Authorization: Bearer wrong' -d '{}' "$url"
    curl -s -o /dev/null -X POST -H 'Authorization: Bearer bench-key' -d '{"model":"none","messages":[]}' "$url"
    curl -s -o /dev/null -X POST -H 'Authorization: Bearer bench-key' -d '{"model":' "$url"
  done
  curl -s -o /dev/null "http://127.0.0.1:$AP/metrics"
}
# Paced streams, as a generation sends them (every event its own read,
# write and wake-up: the path long streams spend their CPU on, which wrk's
# unpaced streams hardly take), then the mocks back to full speed.
paced() {
  local body='{"model":"bench","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hello"}]}'
  for p in "$M1" "$M2"; do
    curl -s -o /dev/null -X POST -H 'content-type: application/json' \
      -d "{\"stream_interval_ms\": $1}" "http://127.0.0.1:$p/mock/faults"
  done
  [ "$1" = 0 ] && return
  "$CLIENT" "http://127.0.0.1:$ZP/v1/chat/completions" 300 "$SECS" "$body" bench-key |
    grep '^RESULT' >&2
}
echo "training ($SECS s per load)..." >&2
post false 32
mistakes
post true 64
paced 10
paced 0
post false 256
mistakes
# SIGTERM drains and exits: the profile is written at exit.
kill -TERM "$ZPID"
wait "$ZPID" || true
"$PROFDATA" merge -o "$WORK/zonegate.profdata" "$RAW"

echo "optimised build..." >&2
(cd "$ROOT" && RUSTFLAGS="-Cprofile-use=$WORK/zonegate.profdata" CARGO_TARGET_DIR=$PGO_DIR/use \
  cargo build --profile dist --locked --quiet --bin zonegate)
mkdir -p "$(dirname "$OUT")"
cp "$PGO_DIR/use/dist/zonegate" "$OUT"
echo "$OUT" >&2
