#!/usr/bin/env bash
# Network/socket tuning for loadgen and the engine on Linux.
#
#   tuning/sysctl.sh                 show current values and the proposed ones (dry run, default)
#   tuning/sysctl.sh --apply [FILE]  save current values to FILE (default /tmp/rl-sysctl.saved), then apply
#   tuning/sysctl.sh --revert [FILE] restore the values saved in FILE
#
# Nothing is changed without --apply or --revert. Needs root for those.
set -euo pipefail

SAVE_DEFAULT=/tmp/rl-sysctl.saved
BUF=${RL_SOCKET_BUFFER:-16777216}   # 16 MiB

# key  proposed-value  why
KNOBS=(
  "net.core.rmem_max|$BUF|ceiling for SO_RCVBUF: lets the engine/raw client/responder ask for large receive buffers (bursts of replies are not dropped)"
  "net.core.wmem_max|$BUF|ceiling for SO_SNDBUF: sendmmsg batches do not block or fail with ENOBUFS"
  "net.core.rmem_default|1048576|receive buffer of sockets that do not set SO_RCVBUF (e.g. the official client)"
  "net.core.wmem_default|1048576|send buffer of sockets that do not set SO_SNDBUF"
  "net.core.netdev_max_backlog|16384|per-CPU input queue (also used by loopback): drops under bursts when too small"
  "net.core.busy_poll|50|µs of busy polling in poll/select: lower latency, more CPU (0 = off)"
  "net.core.busy_read|50|µs of busy polling on blocking reads: lower latency, more CPU (0 = off)"
)

mode=show
file=$SAVE_DEFAULT
case "${1:-}" in
  ""|--show|--dry-run) mode=show ;;
  --apply) mode=apply; file=${2:-$SAVE_DEFAULT} ;;
  --revert) mode=revert; file=${2:-$SAVE_DEFAULT} ;;
  -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
  *) echo "unknown option: $1 (use --apply, --revert or nothing)" >&2; exit 2 ;;
esac

get() { sysctl -n "$1" 2>/dev/null || echo "n/a"; }

case $mode in
  show)
    printf '%-30s %-12s %-12s %s\n' knob current proposed why
    for k in "${KNOBS[@]}"; do
      IFS='|' read -r key val why <<<"$k"
      printf '%-30s %-12s %-12s %s\n' "$key" "$(get "$key")" "$val" "$why"
    done
    echo
    echo "(dry run: nothing changed; --apply to apply, --revert to restore)"
    ;;
  apply)
    [ "$(id -u)" -eq 0 ] || { echo "--apply needs root" >&2; exit 1; }
    : > "$file"
    for k in "${KNOBS[@]}"; do
      IFS='|' read -r key val _ <<<"$k"
      cur=$(get "$key")
      [ "$cur" = "n/a" ] && { echo "skip $key (not available)"; continue; }
      echo "$key=$cur" >> "$file"
      sysctl -q -w "$key=$val" && echo "$key: $cur -> $val"
    done
    echo "saved previous values to $file (revert with: $0 --revert $file)"
    ;;
  revert)
    [ "$(id -u)" -eq 0 ] || { echo "--revert needs root" >&2; exit 1; }
    [ -f "$file" ] || { echo "no saved file $file" >&2; exit 1; }
    while IFS='=' read -r key val; do
      [ -n "$key" ] || continue
      sysctl -q -w "$key=$val" && echo "$key -> $val"
    done < "$file"
    ;;
esac

ncpu=$(nproc 2>/dev/null || echo 1)
gov=$(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo "n/a")
cat <<EOF

Advice (not applied by this script):
- CPU isolation: keep the client and responder cores free of other work. On a
  dedicated box boot with e.g. isolcpus=1-$((ncpu > 1 ? ncpu - 1 : 1)) nohz_full=1-$((ncpu > 1 ? ncpu - 1 : 1)) rcu_nocbs=1-$((ncpu > 1 ? ncpu - 1 : 1))
  and pass --client-cores / --responder-cores to loadgen. This machine has $ncpu cores.
- IRQ affinity: steer NIC interrupts away from the engine cores
  (echo MASK > /proc/irq/N/smp_affinity; stop irqbalance) or onto the core that
  owns the matching socket when using SO_REUSEPORT + RSS. Loopback has no IRQs:
  softirq work runs on the sending core.
- CPU governor: now '$gov'. For stable figures use 'performance'
  (cpupower frequency-set -g performance) and disable deep C-states for latency runs.
- Busy polling trades CPU for latency; leave it off for CPU-per-decision figures.
EOF
