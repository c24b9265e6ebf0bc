#!/usr/bin/env bash
# Peak RSS of every node of a tensor-parallel group (issue #6), against its share.
#
#   bench/tp-memory.sh MODEL [NODES...] [-- extra generate flags]
#
# For each node count N (default: 2 4) and each schedule (sum, gather): start N-1 fresh
# `hearth worker` processes on loopback, run one `hearth generate` as node 0, and print
# each process's peak RSS (VmHWM: the coordinator's from its --json report, a worker's
# from the line it logs when the session ends) next to the block weights the node
# computes with and its KV cache. Fresh workers per run, since VmHWM never goes down.
# All processes share one page cache here; each counts the file pages it maps, as it
# would on its own machine.
set -euo pipefail
HEARTH=${HEARTH:-target/release/hearth}
MODEL=${1:?usage: bench/tp-memory.sh MODEL [NODES...] [-- generate flags]}
shift
NODES=()
while [[ $# -gt 0 && $1 != "--" ]]; do NODES+=("$1"); shift; done
[[ ${1:-} == "--" ]] && shift
EXTRA=("$@")
[[ ${#NODES[@]} -eq 0 ]] && NODES=(2 4)
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

echo "| nodes | schedule | node | peak RSS MiB | block weights MiB | KV cache MiB |"
echo "| ---: | --- | ---: | ---: | ---: | ---: |"
for n in "${NODES[@]}"; do
  for sched in sum gather; do
    PIDS=()
    addrs=()
    for ((i = 1; i < n; i++)); do
      "$HEARTH" worker -m "$MODEL" --listen 127.0.0.1:0 -t 1 >"$TMP/w$i.out" 2>"$TMP/w$i.err" &
      PIDS+=($!)
    done
    for ((i = 1; i < n; i++)); do
      for _ in $(seq 600); do grep -q listening "$TMP/w$i.out" 2>/dev/null && break; sleep 0.05; done
      addrs+=("$(awk '/listening on/ { print $5 }' "$TMP/w$i.out")")
    done
    workers=()
    [[ $n -gt 1 ]] && workers=(--workers "$(IFS=,; echo "${addrs[*]}")" --tp-schedule "$sched")
    [[ $n -eq 1 && $sched == gather ]] && continue
    "$HEARTH" generate -m "$MODEL" -p "The capital of France is" -n 16 --temperature 0 -t 1 -c 512 \
      "${workers[@]}" --json "${EXTRA[@]}" >"$TMP/c.json" 2>"$TMP/c.err"
    sleep 0.5 # the workers log their peak RSS when the session ends
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    python3 "$(dirname "$0")/tp_memory_rows.py" "$n" "$sched" "$TMP"
  done
done
