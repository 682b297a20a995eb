#!/usr/bin/env bash
# CPU per request of the example proxy: plain Pingora (--limit off), the engine hosted
# on Pingora's runtime, and the engine pinned. wrk (1 thread, keep-alive) against the
# proxy; nginx as the upstream (`return 200`); rl-responder as the service. CPU: the
# proxy process's utime+stime from /proc over the measured run, per completed request.
#
#   pingora/bench/cpu.sh PROXY_BIN RESPONDER_BIN [SECONDS] [CONNECTIONS]
#
# Every request is granted (the limit is far above the rate), so each one is a decision.
set -euo pipefail
PROXY=$1 RESPONDER=$2 SECS=${3:-10} CONNS=${4:-16}
KEY=rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

cat >"$TMP/nginx.conf" <<NGX
daemon off; worker_processes 1; pid $TMP/nginx.pid; error_log $TMP/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:18180; location / { return 200 "upstream"; } } }
NGX
nginx -c "$TMP/nginx.conf" & PIDS+=($!)
RATELIMITLY_API_KEY=$KEY "$RESPONDER" --listen 127.0.0.1:18190 --server-id 7 >"$TMP/resp.log" 2>&1 & PIDS+=($!)
sleep 1

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
echo "| setup | requests/s | proxy CPU µs per request |"
echo "|---|---|---|"
port=18200
for setup in off hosted pinned; do
  port=$((port + 1)) # a port of its own: the last one may still be closing
  limit="1000000000/1s"; engine=hosted
  case $setup in off) limit=off ;; pinned) engine=pinned ;; esac
  RATELIMITLY_API_KEY=$KEY "$PROXY" --listen 127.0.0.1:$port --upstream 127.0.0.1:18180 \
    --endpoint 7@127.0.0.1:18190 --limit "$limit" --engine "$engine" --grace-period 0 \
    >"$TMP/ready-$setup" 2>"$TMP/proxy-$setup.log" & pid=$!
  PIDS+=("$pid") # killed on exit, should a step below fail
  for _ in $(seq 300); do [ -s "$TMP/ready-$setup" ] && break; sleep 0.1; done
  [ -s "$TMP/ready-$setup" ] || { echo "$setup: no ready line within 30 s" >&2; exit 1; }
  wrk -t1 -c"$CONNS" -d1s http://127.0.0.1:$port/ >/dev/null
  c0=$(ticks $pid)
  out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" http://127.0.0.1:$port/)
  c1=$(ticks $pid)
  kill -INT $pid; wait $pid 2>/dev/null || true
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  us=$(awk -v t=$((c1 - c0)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
  echo "| $setup | $rps | $us |${non2xx:+ non-2xx: $non2xx}"
done
