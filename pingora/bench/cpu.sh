#!/usr/bin/env bash
# CPU per request (issue 47's benchmark), in ONE run of alternating rounds:
#   off      the example proxy with --limit off (plain Pingora, the baseline)
#   hosted   the example with ratelimitly-pingora, the engine on Pingora's runtime (default)
#   pinned   the same, the engine's core on a thread of its own (--engine pinned)
#   local    the example with pingora-limits' per-process Rate (--limiter local)
#   rl-proxy rl-proxy (our hyper proxy), engine admission, --on-failure closed
#   nginx    nginx as a plain reverse proxy (one process: master_process off, 1 worker)
# wrk (1 thread, keep-alive) against the proxy; nginx as the upstream (`return 200`);
# rl-responder as the service. The proxy under test runs on the last allowed CPU
# (taskset), wrk, the upstream and the responder on the others (as proxy/bench/run.sh).
# CPU: the proxy process's utime+stime from /proc over the measured run, per request.
# The table: each setup's median over the rounds, and its added CPU over `off` (the
# median of the per-round differences, paired within a round).
#
#   pingora/bench/cpu.sh [PROXY_BIN [RESPONDER_BIN [RL_PROXY_BIN]]]
#   (defaults: target/pingora/release/examples/proxy, target/release/rl-responder and
#   target/release/rl-proxy: `cargo build --release -p rl-responder -p rl-proxy` first)
#   env: SECS (8), CONNS (16), ROUNDS (3), NGINX (/usr/sbin/nginx)
#
# Every request is granted (the limits are far above the rate), so each one is a decision.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PROXY=${1:-$HERE/../../target/pingora/release/examples/proxy}
RESPONDER=${2:-$HERE/../../target/release/rl-responder}
RL_PROXY=${3:-$HERE/../../target/release/rl-proxy}
SECS=${SECS:-8} CONNS=${CONNS:-16} ROUNDS=${ROUNDS:-3} NGINX=${NGINX:-/usr/sbin/nginx}
KEY=rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5
LIMIT=4000000000/1s
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

ALLOWED=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
LAST=${ALLOWED##*,}
OTHERS=$(python3 -c "import os; s=sorted(os.sched_getaffinity(0)); o=[c for c in s if c!=$LAST] or s; print(','.join(map(str,o)))")
PCPU=${PROXY_CPUS:-$LAST} ECPU=${ENV_CPUS:-$OTHERS}

# Waits (bounded) for a line matching $2 in file $1; prints it.
ready_line() {
  for _ in $(seq 300); do
    if grep -q "$2" "$1" 2>/dev/null; then grep -m1 "$2" "$1"; return 0; fi
    sleep 0.1
  done
  echo "no '$2' line in $1" >&2; cat "$1" "${1%.out}.err" >&2 2>/dev/null || true; return 1
}
json_field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

cat >"$TMP/up.conf" <<NGX
daemon off; worker_processes 1; pid $TMP/up.pid; error_log $TMP/up-error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:18180; location / { return 200 "upstream"; } } }
NGX
taskset -c "$ECPU" "$NGINX" -p "$TMP" -c "$TMP/up.conf" & PIDS+=($!)
RATELIMITLY_API_KEY=$KEY taskset -c "$ECPU" "$RESPONDER" --cores 1 >"$TMP/resp.out" 2>"$TMP/resp.err" &
PIDS+=($!)
RLINE=$(ready_line "$TMP/resp.out" '"event":"ready"')
EP="$(json_field "$RLINE" server_id)@127.0.0.1:$(json_field "$RLINE" port)"
sleep 0.5

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
port=18200
SETUPS="off hosted pinned local rl-proxy nginx"
for round in $(seq "$ROUNDS"); do
  echo "round $round of $ROUNDS" >&2
  for setup in $SETUPS; do
    port=$((port + 1)) # a port of its own: the last one may still be closing
    out=$TMP/$setup-$round.out
    case $setup in
      off|hosted|pinned|local)
        limit=$LIMIT engine=hosted limiter=ratelimitly
        case $setup in off) limit=off ;; pinned) engine=pinned ;; local) limiter=local ;; esac
        RATELIMITLY_API_KEY=$KEY taskset -c "$PCPU" "$PROXY" --listen 127.0.0.1:$port \
          --upstream 127.0.0.1:18180 --endpoint "$EP" --limit "$limit" --engine "$engine" \
          --limiter "$limiter" --grace-period 0 >"$out" 2>"${out%.out}.err" & pid=$! ;;
      rl-proxy)
        RATELIMITLY_API_KEY=$KEY taskset -c "$PCPU" "$RL_PROXY" --listen 127.0.0.1:$port \
          --upstream http://127.0.0.1:18180 --endpoint "$EP" --limit "$LIMIT" \
          --on-failure closed >"$out" 2>"${out%.out}.err" & pid=$! ;;
      nginx)
        mkdir -p "$TMP/ngx-$round"
        cat >"$TMP/ngx-$round/nginx.conf" <<NGX
daemon off; master_process off; worker_processes 1; pid $TMP/ngx-$round/nginx.pid;
error_log $TMP/ngx-$round/error.log;
events { worker_connections 1024; }
http { access_log off; upstream up { server 127.0.0.1:18180; keepalive 64; }
  server { listen 127.0.0.1:$port; location / { proxy_pass http://up;
    proxy_http_version 1.1; proxy_set_header Connection ""; } } }
NGX
        taskset -c "$PCPU" "$NGINX" -p "$TMP/ngx-$round" -c "$TMP/ngx-$round/nginx.conf" \
          >"$out" 2>"${out%.out}.err" & pid=$!
        for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
        echo '"event":"ready"' >>"$out" ;;
    esac
    PIDS+=("$pid") # killed on exit, should a step below fail
    ready_line "$out" '"event":"ready"' >/dev/null
    taskset -c "$ECPU" wrk -t1 -c"$CONNS" -d1s http://127.0.0.1:$port/ >/dev/null
    c0=$(ticks $pid)
    res=$(taskset -c "$ECPU" wrk -t1 -c"$CONNS" -d"${SECS}s" http://127.0.0.1:$port/)
    c1=$(ticks $pid)
    if [ "$setup" = nginx ]; then kill -QUIT $pid; else kill -INT $pid; fi
    wait $pid 2>/dev/null || true
    reqs=$(echo "$res" | awk '/requests in/ {print $1}')
    non2xx=$(echo "$res" | awk '/Non-2xx/ {print $NF}')
    rps=$(echo "$res" | awk '/Requests\/sec/ {print $2}')
    us=$(awk -v t=$((c1 - c0)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
    echo "$round $setup $rps $us ${non2xx:-0}" | tee -a "$TMP/rows" >&2
  done
done

python3 - "$TMP/rows" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for r, s, rps, us, bad in rows:
    by.setdefault(s, {})[r] = (float(rps), float(us), int(bad))
names = {"off": "plain Pingora (`--limit off`)",
         "hosted": "Pingora + ratelimitly-pingora, engine hosted (default)",
         "pinned": "Pingora + ratelimitly-pingora, engine pinned",
         "local": "Pingora + pingora-limits `Rate` (`--limiter local`)",
         "rl-proxy": "rl-proxy (engine, `--on-failure closed`)",
         "nginx": "nginx, plain reverse proxy"}
print("| setup | req/s (median) | CPU µs/request (median) | added over plain Pingora | per round (µs) | non-2xx |")
print("|---|---|---|---|---|---|")
for s in by:
    d = by[s]
    add = st.median(d[r][1] - by["off"][r][1] for r in d)
    print(f"| {names.get(s, s)} | {st.median(v[0] for v in d.values()):.0f} | "
          f"{st.median(v[1] for v in d.values()):.2f} | {'—' if s == 'off' else f'{add:+.2f}'} | "
          f"{' / '.join(f'{d[r][1]:.2f}' for r in sorted(d))} | {sum(v[2] for v in d.values())} |")
PY
