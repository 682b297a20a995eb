#!/usr/bin/env bash
# What a new TCP connection costs rl-proxy --mode forward-auth: wrk straight to the
# decision service, every request on a kept connection and then every request on a new
# one (`Connection: close`), alternated ROUNDS times; rl-proxy's CPU per check (utime +
# stime from /proc) for each. A front proxy that keeps few idle connections to the
# decision service (Traefik's ForwardAuth keeps Go's default two) sits between the two.
#
# Placement: rl-proxy on the last allowed CPU, wrk and rl-responder on the others.
# To see where the time goes, profile the proxy's CPU while a run is on:
#   perf record -e cpu-clock -C LAST_CPU --call-graph dwarf,16384 -- sleep 4
#
# Usage: proxy/bench/conn_cost.sh [DURATION_S] [CONNECTIONS] [ROUNDS]   (defaults 5, 32, 3)
set -euo pipefail

DURATION=${1:-5}
CONNS=${2:-32}
ROUNDS=${3:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
AES_KEY="rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5"
TMP=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT

command -v wrk >/dev/null || { echo "conn_cost.sh needs wrk (apt-get install wrk)" >&2; exit 2; }
(cd "$ROOT" && cargo build --release -q -p rl-proxy -p rl-responder)
BIN="$ROOT/target/release"
ALLOWED=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
PROXY_CPU=${ALLOWED##*,}
ENV_CPUS=$(python3 -c "import os; s=sorted(os.sched_getaffinity(0)); o=[c for c in s if c!=$PROXY_CPU] or s; print(','.join(map(str,o)))")

ready() {
    for _ in $(seq 1 200); do
        grep -m1 '"event":"ready"' "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    cat "$1" >&2
    return 1
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

RATELIMITLY_API_KEY=$AES_KEY taskset -c "$ENV_CPUS" "$BIN/rl-responder" --cores 1 \
    >"$TMP/r.out" 2>"$TMP/r.err" &
PIDS+=($!)
RL=$(ready "$TMP/r.out")
RATELIMITLY_API_KEY=$AES_KEY taskset -c "$PROXY_CPU" "$BIN/rl-proxy" --mode forward-auth \
    --deny-status 429 --trust-forwarded 127.0.0.1/32 \
    --endpoint "$(field "$RL" server_id)@127.0.0.1:$(field "$RL" port)" \
    --limit 4000000000/1s --on-failure closed >"$TMP/p.out" 2>"$TMP/p.err" &
PROXY=$!
PIDS+=($PROXY)
URL="http://127.0.0.1:$(field "$(ready "$TMP/p.out")" port)/"

# run MODE: one measured wrk run (after a 1 s warm-up); prints rl-proxy's CPU µs per check
run() {
    local h=()
    [ "$1" = new ] && h=(-H "Connection: close")
    taskset -c "$ENV_CPUS" wrk -t1 -c"$CONNS" -d1s "${h[@]}" "$URL" >/dev/null
    local c0 c1 n
    c0=$(awk '{print $14 + $15}' "/proc/$PROXY/stat")
    taskset -c "$ENV_CPUS" wrk -t1 -c"$CONNS" -d"${DURATION}s" "${h[@]}" "$URL" >"$TMP/w.txt"
    c1=$(awk '{print $14 + $15}' "/proc/$PROXY/stat")
    n=$(awk '/requests in/ {print $1}' "$TMP/w.txt")
    grep -q "Non-2xx" "$TMP/w.txt" && { echo "non-2xx answers:" >&2; cat "$TMP/w.txt" >&2; exit 1; }
    python3 -c "print(f'{($c1-$c0)/$(getconf CLK_TCK)*1e6/$n:.1f}')"
}

KEPT=() NEW=()
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then KEPT+=("$(run kept)"); NEW+=("$(run new)")
    else NEW+=("$(run new)"); KEPT+=("$(run kept)"); fi
done
python3 - "${KEPT[*]}" "${NEW[*]}" <<'PY'
import statistics, sys
kept, new = ([float(x) for x in a.split()] for a in sys.argv[1:3])
print(f"rl-proxy CPU µs per check, kept connections: median {statistics.median(kept):.1f} (rounds {' '.join(map(str, kept))})")
print(f"rl-proxy CPU µs per check, a new connection each: median {statistics.median(new):.1f} (rounds {' '.join(map(str, new))})")
PY
