#!/usr/bin/env bash
# Issue 16's verdict from several runs together: the paired rounds
# (zonegate / nginx, req/s and p99) that `load.sh` printed with ROUNDS >= 2
# (the matrix's cells, and the paced case's), pooled cell by cell from its
# saved outputs, with each pooled median's 90% interval, the verdict, and
# the matrix's target line as load.sh gives them for one run (from the
# ratios as printed, to two decimals). Eleven
# rounds resolve about ±5% on this machine, sixty about ±2%. Pooling runs
# of different builds or hours asks for their mixture's median: say which
# builds and hours.
#
#   benches/pool.sh benches/results/matrix-*.txt
#
# Starts nothing; a benchmark's reading, never part of the tests.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=benches/common.sh
. "$ROOT/benches/common.sh"
[ $# -gt 0 ] || { echo "usage: benches/pool.sh LOAD-OUTPUT..." >&2; exit 2; }

# "CELL;RUNS;req/s rounds;p99 rounds", one line per cell ("-tT -cC" of the
# matrix, "paced 0-2" of the paced case), rounds of all files.
rounds=$(awk '
  /^wrk -t[0-9]+ -c[0-9]+ / { cell = $2 " " $3; next }
  /^pause [0-9]+-[0-9]+ ms / { cell = "paced " $2; next }
  /zonegate\/nginx by round:/ && cell != "" {
    sub(/.*by round: req\/s /, "")
    split($0, part, /\), p99 /)
    sub(/ \(median.*/, "", part[1]); sub(/ \(median.*/, "", part[2])
    r[cell] = r[cell] " " part[1]; p[cell] = p[cell] " " part[2]
    if (!(cell in runs)) order[++n] = cell
    runs[cell]++; cell = ""
  }
  END { for (i = 1; i <= n; i++) { c = order[i]; print c ";" runs[c] ";" r[c] ";" p[c] } }' "$@")
[ -n "$rounds" ] || { echo "no paired rounds in $*" >&2; exit 1; }

echo "== pooled paired rounds, zonegate / nginx, from $# run(s)"
TARGET=""
while IFS=';' read -r cell runs req p99; do
  out=$(printf '%s\n%s\n' "$req" "$p99" | awk -v QUIET=1 "$ROUND_STATS"'
    NR == 1 { for (i = 1; i <= NF; i++) r[i] = $i; n = NF }
    NR == 2 { for (i = 1; i <= NF; i++) p[i] = $i; m = NF }
    END { print n; print said(r, n, "req/s", "faster"); short = SHORT
          print said(p, m, "p99", "slower"); print short, SHORT }')
  { read -r n; read -r req_said; read -r p99_said; read -r short; } <<<"$out"
  printf '%-10s %d rounds from %d run(s): %s, %s\n' "$cell" "$n" "$runs" "$req_said" "$p99_said"
  # The target is the matrix's; paced cells (a fixed load) say the
  # latency each proxy adds.
  [[ $cell == paced* ]] || TARGET+="$short"$'\n'
done <<<"$rounds"
[ -z "$TARGET" ] || printf '%s' "$TARGET" | target_verdict
