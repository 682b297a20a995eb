#!/usr/bin/env bash
# Alternated A/B of rl-proxy --mode rls builds, the gRPC row of run.sh on its own: each
# round starts every build's rl-proxy --mode rls (on PROXY_CPUS) over one rule
# (remote_address, never reached) and measures it with rl-rls-load (on ENV_CPUS; one
# descriptor per call, 100000 values, 32 calls in flight over 2 connections) for SECONDS
# after a 1 s warm-up. Prints one line per run (round, build, decisions/s, rl-proxy CPU µs
# per decision), then per build the medians.
#
# Usage: proxy/bench/rls_ab.sh ROUNDS SECONDS LOAD DIR...   (LOAD: an rl-rls-load binary;
#        each DIR holds an rl-proxy; the first DIR's rl-responder serves every run)
set -euo pipefail

ROUNDS=$1
SECS=$2
LOAD=$3
shift 3
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS SECONDS LOAD DIR..." >&2; exit 2; }
. "$(dirname "$0")/ab_common.sh"

cat >"$TMP/rules.yaml" <<'YAML'
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 4000000000 }
YAML
RATELIMITLY_API_KEY=$AES_KEY taskset -c "$ENV_CPUS" "$1/rl-responder" --cores 1 \
    >"$TMP/r.out" 2>"$TMP/r.err" &
PIDS+=($!)
RLINE=$(ready "$TMP/r.out")
ENDPOINT="$(field "$RLINE" server_id)@127.0.0.1:$(field "$RLINE" port)"

for round in $(seq 1 "$ROUNDS"); do
    for dir in "$@"; do
        RATELIMITLY_API_KEY=$AES_KEY taskset -c "$PROXY_CPUS" "$dir/rl-proxy" --mode rls \
            --config "$TMP/rules.yaml" --endpoint "$ENDPOINT" --on-failure closed \
            >"$TMP/p.out" 2>"$TMP/p.err" &
        pid=$!
        port=$(field "$(ready "$TMP/p.out")" port)
        line=$(taskset -c "$ENV_CPUS" "$LOAD" --target "127.0.0.1:$port" --duration "$SECS" \
            --warmup 1 --concurrency 32 --connections 2 --values 100000 --pid "$pid")
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        echo "$round $dir $(field "$line" decisions_per_s) $(field "$line" cpu_us_per_decision)"
    done
done | tee "$TMP/runs.txt"

python3 - "$TMP/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, d, rate, cpu = line.split()
    runs.setdefault(d, []).append((float(rate), float(cpu)))
for d, v in runs.items():
    print(f"{d}: {statistics.median(r for r, _ in v):.0f} decisions/s, "
          f"{statistics.median(c for _, c in v):.2f} µs CPU per decision (median of {len(v)})")
PY
