#!/usr/bin/env bash
# Worker groups: 1 engine × 2 threads vs 2 engines × 1 thread (pinned) on one model,
# at 1 and 8 concurrent streaming clients (bench/loadgen.rs), one JSON line per run.
#
#   bench/serve-groups.sh [MODEL=models/synth-1b-q4_0.gguf] [MAX_TOKENS=64]
#
# Needs release builds: cargo build --release -p hearth && cargo build --release -p hearth-serve --example loadgen
set -u
model="${1:-models/synth-1b-q4_0.gguf}"; out="${2:-64}"
T="${CARGO_TARGET_DIR:-target}/release"
log="$(mktemp)"
for g in 1 2; do
  "$T/hearth" serve -m "$model" --port 0 --groups $g --parallel $((8 / g)) -t $((2 / g)) -c 256 --pin >"$log" 2>&1 & pid=$!
  for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
  addr="$(grep -o '127.0.0.1:[0-9]*' "$log" | head -n1)"
  for c in 1 8; do
    echo "groups $g clients $c: $("$T/examples/loadgen" --url "$addr" --clients $c --requests $((2 * c)) --prompt-tokens 32 --max-tokens "$out" --json) load $(cut -d' ' -f1 /proc/loadavg)"
  done
  kill $pid; wait $pid 2>/dev/null
done
rm -f "$log"
