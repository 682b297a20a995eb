#!/usr/bin/env bash
# Alternated A/B of rl-proxy builds: the way to tell whether a change helped on a noisy
# machine, where single runs of proxy/bench/run.sh swing by ±0.2.
#
# Usage: proxy/bench/ab.sh ROUNDS SECONDS DIR... (each DIR holds an rl-proxy binary;
#        the first DIR's rl-responder and rl-upstream serve every run)
#
# One responder (AES key, 1 core) and one upstream run throughout on ENV_CPUS; each round
# starts every build's proxy on PROXY_CPUS twice, `--limit off` then engine admission
# (hosted core, --on-failure closed), and measures it with wrk -t1 -c32 for SECONDS after
# a 1 s warm-up. Prints one line per run (round, build, mode, req/s, proxy CPU µs per
# request), then per build the medians and the median of its per-round
# engine/`--limit off` req/s ratios. The same A/B for loadgen builds or settings is
# tuning/ab.py (alternated rounds, medians, spread, per-round ratios, JSON and a table).
set -euo pipefail

ROUNDS=$1
SECS=$2
shift 2
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS SECONDS DIR..." >&2; exit 2; }
. "$(dirname "$0")/ab_common.sh"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

RATELIMITLY_API_KEY=$AES_KEY taskset -c "$ENV_CPUS" "$1/rl-responder" --cores 1 \
    >"$TMP/r.out" 2>"$TMP/r.err" &
PIDS+=($!)
taskset -c "$ENV_CPUS" "$1/rl-upstream" >"$TMP/u.out" 2>"$TMP/u.err" &
PIDS+=($!)
RLINE=$(ready "$TMP/r.out")
ULINE=$(ready "$TMP/u.out")
ENDPOINT="$(field "$RLINE" server_id)@127.0.0.1:$(field "$RLINE" port)"
UPSTREAM="http://127.0.0.1:$(field "$ULINE" port)"
TICK=$(getconf CLK_TCK)

for round in $(seq 1 "$ROUNDS"); do
    for dir in "$@"; do
        for mode in off engine; do
            args=(--limit off)
            [ "$mode" = engine ] && args=(--limit 4000000000/1s --on-failure closed)
            RATELIMITLY_API_KEY=$AES_KEY taskset -c "$PROXY_CPUS" "$dir/rl-proxy" \
                --upstream "$UPSTREAM" --endpoint "$ENDPOINT" "${args[@]}" \
                >"$TMP/p.out" 2>"$TMP/p.err" &
            pid=$!
            port=$(field "$(ready "$TMP/p.out")" port)
            taskset -c "$ENV_CPUS" wrk -t1 -c32 -d1s "http://127.0.0.1:$port/" >/dev/null
            c0=$(ticks "$pid")
            taskset -c "$ENV_CPUS" wrk -t1 -c32 -d"${SECS}s" "http://127.0.0.1:$port/" >"$TMP/w.txt"
            c1=$(ticks "$pid")
            kill "$pid"
            wait "$pid" 2>/dev/null || true
            total=$(awk '/requests in/ {print $1}' "$TMP/w.txt")
            rps=$(awk '/^Requests\/sec:/ {print $2}' "$TMP/w.txt")
            echo "$round $dir $mode $rps $(python3 -c "print(f'{($c1-$c0)/$TICK*1e6/$total:.2f}')")"
        done
    done
done | tee "$TMP/runs.txt"

# the summary's statistics are tuning/ab.py's (medians, per-round ratios)
python3 "$(dirname "$0")/../../tuning/ab.py" --summarize-proxy "$TMP/runs.txt"
