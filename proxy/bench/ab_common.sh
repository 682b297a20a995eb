# What the A/B scripts (ab.sh, rls_ab.sh) share, sourced: the AES test key, the CPU split
# (PROXY_CPUS: the last allowed CPU; ENV_CPUS: the others), a temporary directory and the
# processes to stop on exit (PIDS), and reading a JSON readiness line.
AES_KEY="rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5"
ALLOWED=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
PROXY_CPUS=${PROXY_CPUS:-${ALLOWED##*,}}
ENV_CPUS=${ENV_CPUS:-$(python3 -c "import os; s=sorted(os.sched_getaffinity(0)); o=[c for c in s if c!=$PROXY_CPUS] or s; print(','.join(map(str,o)))")}
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
ready() { # FILE: the first readiness line, waited for up to 10 s
    for _ in $(seq 1 200); do
        grep -m1 '"event":"ready"' "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "no readiness line in $1" >&2
    return 1
}
