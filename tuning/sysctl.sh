#!/usr/bin/env bash
# Network/socket tuning for loadgen and the engine on Linux.
#
#   tuning/sysctl.sh [KNOB...]                 show current and proposed values (dry run, default)
#   tuning/sysctl.sh --apply [--save FILE] [KNOB...]
#                                             save the current values of the knobs (default file
#                                             /tmp/rl-sysctl.saved), then apply the proposed ones
#   tuning/sysctl.sh --revert [--save FILE]   restore the values saved in FILE
#   tuning/sysctl.sh --tuned DIR [KNOB...]    write a tuned profile (DIR/tuned.conf) with the knobs
#
# KNOB: a name of the table below (rmem_max, wmem_max, rmem_default, wmem_default,
# netdev_max_backlog, busy_poll, busy_read) or its full sysctl key. Without KNOBs: the
# buffer and backlog knobs. Busy polling (busy_poll, busy_read) only when named, or with
# --busy-poll: it spends CPU to cut latency, which spoils CPU-per-decision figures.
# Buffers: loadgen and the responder ask for 4 MiB (SO_RCVBUF/SO_SNDBUF), so the ceilings
# are 4 MiB (RL_SOCKET_BUFFER=BYTES changes it, e.g. for loadgen --socket-buffer BYTES).
#
# Nothing is changed without --apply or --revert. Those need root.
set -euo pipefail

SAVE_DEFAULT=/tmp/rl-sysctl.saved
BUF=${RL_SOCKET_BUFFER:-4194304}   # 4 MiB: loadgen's --socket-buffer default

# name | key | proposed value | why
KNOBS=(
  "rmem_max|net.core.rmem_max|$BUF|ceiling of SO_RCVBUF: loadgen's and the responder's 4 MiB receive buffers are granted in full (bursts of replies are not dropped)"
  "wmem_max|net.core.wmem_max|$BUF|ceiling of SO_SNDBUF: sendmmsg/GSO batches do not block or fail with ENOBUFS"
  "rmem_default|net.core.rmem_default|1048576|receive buffer of sockets that do not set SO_RCVBUF (the official client)"
  "wmem_default|net.core.wmem_default|1048576|send buffer of sockets that do not set SO_SNDBUF"
  "netdev_max_backlog|net.core.netdev_max_backlog|16384|per-CPU input queue (loopback too): drops under bursts when too small"
  "busy_poll|net.core.busy_poll|50|µs of busy polling in poll/select: lower latency, more CPU (only when named)"
  "busy_read|net.core.busy_read|50|µs of busy polling on blocking reads: lower latency, more CPU (only when named)"
)
DEFAULT_NAMES="rmem_max wmem_max rmem_default wmem_default netdev_max_backlog"

usage() { sed -n '2,19p' "$0"; }

mode=show
file=$SAVE_DEFAULT
tuned_dir=""
names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --show|--dry-run) mode=show ;;
    --apply) mode=apply ;;
    --revert) mode=revert ;;
    --save) file=${2:?--save needs a FILE}; shift ;;
    --tuned) mode=tuned; tuned_dir=${2:?--tuned needs a DIR}; shift ;;
    --busy-poll) names+=(busy_poll busy_read) ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    *) names+=("$1") ;;
  esac
  shift
done
# --apply FILE of earlier versions: a path where a knob name is expected
if [ ${#names[@]} -gt 0 ] && [[ ${names[0]} == */* ]]; then file=${names[0]}; names=("${names[@]:1}"); fi
[ ${#names[@]} -gt 0 ] || read -r -a names <<<"$DEFAULT_NAMES"

# The chosen knobs' table lines, in the order named; an unknown name is an error.
chosen=()
for n in "${names[@]}"; do
  found=""
  for k in "${KNOBS[@]}"; do
    IFS='|' read -r name key _ _ <<<"$k"
    if [ "$n" = "$name" ] || [ "$n" = "$key" ]; then found=$k; fi
  done
  [ -n "$found" ] || { echo "unknown knob: $n (one of: $(printf '%s ' "${KNOBS[@]%%|*}"))" >&2; exit 2; }
  chosen+=("$found")
done

get() { sysctl -n "$1" 2>/dev/null || echo "n/a"; }

case $mode in
  show)
    printf '%-28s %-12s %-12s %s\n' knob current proposed why
    for k in "${chosen[@]}"; do
      IFS='|' read -r _ key val why <<<"$k"
      printf '%-28s %-12s %-12s %s\n' "$key" "$(get "$key")" "$val" "$why"
    done
    echo
    echo "(dry run: nothing changed; --apply to apply, --revert to restore)"
    ;;
  apply)
    [ "$(id -u)" -eq 0 ] || { echo "--apply needs root" >&2; exit 1; }
    : > "$file"
    for k in "${chosen[@]}"; do
      IFS='|' read -r _ key val _ <<<"$k"
      cur=$(get "$key")
      [ "$cur" = "n/a" ] && { echo "skip $key (not available)"; continue; }
      echo "$key=$cur" >> "$file"
      sysctl -q -w "$key=$val" && echo "$key: $cur -> $val"
    done
    echo "saved previous values to $file (revert with: $0 --revert --save $file)"
    ;;
  revert)
    [ "$(id -u)" -eq 0 ] || { echo "--revert needs root" >&2; exit 1; }
    [ -f "$file" ] || { echo "no saved file $file" >&2; exit 1; }
    while IFS='=' read -r key val; do
      [ -n "$key" ] || continue
      sysctl -q -w "$key=$val" && echo "$key -> $val"
    done < "$file"
    ;;
  tuned)
    mkdir -p "$tuned_dir"
    {
      echo "# tuned profile for loadgen and the engine (tuning/sysctl.sh --tuned)"
      echo "[main]"
      echo "summary=Ratelimitly engine benchmarks: socket buffers for 4 MiB, performance governor"
      echo "include=latency-performance"
      echo
      echo "[sysctl]"
      for k in "${chosen[@]}"; do
        IFS='|' read -r _ key val _ <<<"$k"
        echo "$key=$val"
      done
    } > "$tuned_dir/tuned.conf"
    echo "wrote $tuned_dir/tuned.conf: copy the folder to /etc/tuned/NAME and run tuned-adm profile NAME"
    ;;
esac

ncpu=$(nproc 2>/dev/null || echo 1)
gov=$(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo "n/a")
# CPU 0 keeps the housekeeping; clients on the lower half of the rest, responders on the upper
if [ "$ncpu" -ge 3 ]; then
  half=$(( (ncpu - 1) / 2 ))
  client="1-$half"; [ "$half" -eq 1 ] && client="1"
  resp="$((half + 1))-$((ncpu - 1))"; [ "$((half + 1))" -eq "$((ncpu - 1))" ] && resp="$((ncpu - 1))"
  iso="isolcpus=$client,$resp nohz_full=$client,$resp rcu_nocbs=$client,$resp"
  placement="loadgen --client-cores $client --responder-cores $resp"
else
  iso="(this machine has $ncpu CPU(s): isolating the client and responder cores would leave no CPU for the rest; use 4 or more)"
  placement="loadgen --client-cores 0 --responder-cores $((ncpu - 1))"
fi
cat <<EOF

Advice (not applied by this script):
- CPU isolation, for both roles: the client cores (engine, application) and the responder
  cores, away from CPU 0 and from each other. On this $ncpu-CPU machine, boot with
    $iso
  and run $placement
  (with tuning/scaling.py, pass the same sets as --engine-cpus/--app-cpus and --responder-cpus).
- IRQ affinity: steer NIC interrupts away from the client and responder cores
  (echo MASK > /proc/irq/N/smp_affinity; stop irqbalance) or onto the core that
  owns the matching socket when using SO_REUSEPORT + RSS. Loopback has no IRQs:
  softirq work runs on the sending core.
- CPU governor: now '$gov'. For stable figures use 'performance'
  (cpupower frequency-set -g performance; the --tuned profile includes latency-performance).
- Busy polling trades CPU for latency; it is off unless named (busy_poll busy_read, or
  --busy-poll). Leave it off for CPU-per-decision figures.
EOF
