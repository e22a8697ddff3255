#!/usr/bin/env bash
# The machine's own stalls, for reading a p99 on it: inside a wrk run
# against each target in turn (direct: the static backend alone; nginx;
# zonegate), `perf sched record` for a few seconds, then per second of the
# recording:
#   - waits over 1 ms: a woken task waited that long for a CPU;
#   - whole-machine stalls: every CPU ends an idle stretch of 1 ms or more
#     within half a millisecond of the others (so all sat idle together
#     for at least that half), while the load never pauses (a closed loop
#     always has work in flight): the runnable work was not run; on a
#     virtual machine, its virtual CPUs were not, by the host.
# A stall delays every request in flight; if `direct` shows them too, they
# are the machine's, whatever proxy is in the path.
#
#   benches/stalls.sh                      # wrk -t1 -c32, 3 rounds, 4 s recorded per run
#   T=2 C=256 ROUNDS=5 benches/stalls.sh
#   BIN=/tmp/zonegate-old benches/stalls.sh
#   NODE='data_plane_scheduling = "normal"' benches/stalls.sh   # extra [node] lines
#
# Needs nginx, wrk and perf (`apt-get install nginx wrk linux-perf`) and
# root or kernel.perf_event_paranoid <= 1; a benchmark, never part of the
# tests.
set -euo pipefail

T=${T:-1}
C=${C:-32}
ROUNDS=${ROUNDS:-3}
REC=${REC:-4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"

needs nginx wrk perf
release_binary
start_proxies

echo "== wrk -t$T -c$C, $REC s recorded per run, $(nproc) CPUs, $ROUNDS round(s)"
for round in $(seq "$ROUNDS"); do
  for t in direct:$SP nginx:$NP zonegate:$ZP; do
    name=${t%%:*}
    while_loaded "${t##*:}" "$REC" perf sched record -o "$WORK/sched.data" -- sleep "$REC" >/dev/null 2>&1
    # Columns: time, [cpu], task, wait, scheduling delay, run (ms).
    perf sched timehist -i "$WORK/sched.data" 2>/dev/null | awk -v secs="$REC" -v cpus="$(nproc)" \
      -v name="$name" -v round="$round" -v rps="$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.txt")" \
      -v p99="$(awk '$1 == "99%" {print $2}' "$WORK/wrk.txt")" '
      NR > 3 && $(NF - 1) + 0 > 1.0 { waits++; task = $3; sub(/\[.*/, "", task); by[task]++ }
      # An idle stretch of 1 ms or more ends; a stall when every CPU ends
      # one within half a millisecond.
      NR > 3 && $3 == "<idle>" && $NF + 0 >= 1.0 {
        if ($1 - first > 0.0005) { delete seen; n = 0; first = $1 }
        if (!($2 in seen)) { seen[$2] = 1; if (++n == cpus) stalls++ }
      }
      END { printf "round %d %-9s %9.0f req/s  p99 %-8s  waits over 1 ms %5.1f/s  whole-machine stalls %4.1f/s  waits by task:",
              round, name, rps, p99, waits / secs, stalls / secs
            # The three tasks that waited most often.
            for (k = 0; k < 3; k++) { top = ""; for (t in by) if (top == "" || by[t] > by[top]) top = t
                                      if (top == "") break; printf " %s %d", top, by[top]; delete by[top] }
            printf "\n" }'
  done
done
