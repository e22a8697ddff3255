#!/usr/bin/env bash
# Memory after floods (issue 48, item 5): does a node give its memory back
# once a flood is over? A standalone node of BIN in front of zonegate's mock
# backend; a Python asyncio client then
#   1. opens CONNS keep-alive connections (default 11,000), sends one
#      request on each and holds them all idle, then closes them all;
#   2. holds STREAMS streams (default 2,000) at once (the mock paces 16
#      events 500 ms apart: 8 s each) until they end.
# It reads VmRSS from /proc/<pid>/status: idle (after a few warm-up
# requests), at the flood's peak, then once a second for SETTLE seconds
# (default 30) after each flood, and says whether RSS came back within 2x
# idle (the target) and when. Wall-clock only in the settle clock; no
# other timing is taken.
#
#   benches/flood.sh target/release/zonegate
#   CONNS=2000 STREAMS=500 SETTLE=10 benches/flood.sh BIN   # a quick run
#   CONNS=0 benches/flood.sh BIN             # the streams only (STREAMS=0: the connections only)
#   MALLOC_ARENA_MAX=2 benches/flood.sh BIN  # glibc's tuning, for comparison
#
# Needs python3 and an open-files limit above CONNS + 2 x STREAMS + 1,000 (ulimit -n; a stream holds a backend connection too);
# the node's node.limits.max_connections is set to CONNS + STREAMS + 1,000. A
# benchmark, never part of the tests.
set -euo pipefail
BIN=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
needs python3 curl
CONNS=${CONNS:-11000}
STREAMS=${STREAMS:-2000}
SETTLE=${SETTLE:-30}
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -le $((CONNS + 2 * STREAMS + 1000)) ]; then
  echo "needs ulimit -n above $((CONNS + 2 * STREAMS + 1000)) (it is $(ulimit -n))" >&2
  exit 1
fi
SP=$(start_mock_backend "$BIN" 0)
zonegate_node z "$BIN" "[node.limits]
max_connections = $((CONNS + STREAMS + 1000))"
echo "zonegate $BIN (pid $z_PID), $CONNS idle connections, $STREAMS streams, ${SETTLE}s to settle"
python3 - "$z_PORT" "$z_PID" "$SP" "$CONNS" "$STREAMS" "$SETTLE" <<'PY'
import asyncio, json, os, sys, time, urllib.request

port, pid, mock, conns, streams, settle = (int(a) for a in sys.argv[1:])

def rss_kb():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

def faults(interval_ms):
    req = urllib.request.Request(
        f"http://127.0.0.1:{mock}/mock/faults",
        data=json.dumps({"stream_interval_ms": interval_ms}).encode(),
        headers={"content-type": "application/json"}, method="POST")
    urllib.request.urlopen(req).read()

def request(stream, keep_alive):
    body = json.dumps({"model": "bench", "max_tokens": 16, "stream": stream,
                       "messages": [{"role": "user", "content": "hello"}]})
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer bench-key\r\nContent-Type: application/json\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}").encode()

async def one_request(reader, writer, stream, keep_alive):
    writer.write(request(stream, keep_alive))
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if not keep_alive:
        await reader.read(-1)  # until the node closes: the whole stream
        return status
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return status

async def settle_from(label, idle):
    t0 = time.monotonic()
    back = None
    samples = []
    for s in range(settle + 1):
        await asyncio.sleep(max(0.0, t0 + s - time.monotonic()))
        r = rss_kb()
        samples.append(r)
        if back is None and r <= 2 * idle:
            back = s
    print(f"{label}: RSS each second after it ended (MiB): "
          + " ".join(f"{r / 1024:.0f}" for r in samples))
    verdict = f"within 2x idle after {back} s" if back is not None else f"NOT within 2x idle after {settle} s"
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    print(f"{label}: {samples[-1] / 1024:.1f} MiB after {settle} s = "
          f"{samples[-1] / idle:.2f}x idle; {verdict} ({fds} open files)")

async def main():
    # Warm-up: 20 answered requests (a node that has just started may
    # answer 503 for a moment), so idle counts a node that has served.
    ok, deadline = 0, time.monotonic() + 60
    while ok < 20:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        status = await one_request(r, w, False, True)
        w.close()
        if status == 200:
            ok += 1
        elif time.monotonic() > deadline:
            sys.exit(f"the node answers {status}")
        else:
            await asyncio.sleep(0.2)
    await asyncio.sleep(2)
    idle = rss_kb()
    print(f"idle: {idle / 1024:.1f} MiB")

    if conns:
        await idle_connections(idle)
    if streams:
        await held_streams(idle)

async def idle_connections(idle):
    # 1. Idle keep-alive connections, each after one request.
    held, gate, failed = [], asyncio.Semaphore(256), 0
    async def open_one():
        nonlocal failed
        async with gate:
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                if await one_request(r, w, False, True) != 200:
                    failed += 1
                held.append(w)
            except (OSError, asyncio.IncompleteReadError):
                failed += 1
    await asyncio.gather(*(open_one() for _ in range(conns)))
    await asyncio.sleep(1)
    peak = rss_kb()
    print(f"{len(held)} idle connections held ({failed} failed): {peak / 1024:.1f} MiB")
    for w in held:
        w.close()
    held.clear()
    await settle_from(f"after {conns} idle connections", idle)

async def held_streams(idle):
    # 2. Streams held at once, 16 events 500 ms apart.
    faults(500)
    done, failed, top = 0, {}, 0
    async def stream_one():
        nonlocal done
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            status = await one_request(r, w, True, False)
            if status == 200:
                done += 1
            else:
                failed[status] = failed.get(status, 0) + 1
            w.close()
        except (OSError, asyncio.IncompleteReadError) as e:
            failed[type(e).__name__] = failed.get(type(e).__name__, 0) + 1
    tasks = [asyncio.ensure_future(stream_one()) for _ in range(streams)]
    while not all(t.done() for t in tasks):
        top = max(top, rss_kb())
        await asyncio.sleep(0.5)
    faults(0)
    print(f"{done} streams served (failed: {failed or 'none'}), peak {top / 1024:.1f} MiB")
    await settle_from(f"after {streams} streams", idle)

asyncio.run(main())
PY
