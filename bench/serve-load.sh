#!/usr/bin/env bash
# Aggregate decode throughput of `hearth serve` under N concurrent streaming clients
# (bench/loadgen.rs), one server per model, one markdown row per client count.
#
#   bench/serve-load.sh MODEL [CLIENTS="1 4 8 16"] [PROMPT_TOKENS=32] [MAX_TOKENS=128] [THREADS=2]
#
# Needs release builds: cargo build --release -p hearth && cargo build --release -p hearth-serve --example loadgen
set -euo pipefail
model="$1"; clients="${2:-1 4 8 16}"; prompt="${3:-32}"; out="${4:-128}"; threads="${5:-2}"
target="${CARGO_TARGET_DIR:-target}/release"
max=0; for c in $clients; do [ "$c" -gt "$max" ] && max=$c; done
log="$(mktemp)"
"$target/hearth" serve -m "$model" --port 0 --parallel "$max" -t "$threads" -c $((prompt * 2 + out + 64)) >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
addr="$(grep -o 'http://[0-9.:]*' "$log" | head -n1)"
echo "| model | clients | requests | output tok/s (aggregate) | vs 1 client | TTFT p50 / p99 ms | TPOT p50 / p99 ms | load avg |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
base=""
for c in $clients; do
  j="$("$target/examples/loadgen" --url "$addr" --clients "$c" --requests $((2 * c)) --prompt-tokens "$prompt" --max-tokens "$out" --json)"
  read -r agg t50 t99 p50 p99 n <<<"$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["aggregate_tok_s"], j["ttft_ms_p50"], j["ttft_ms_p99"], j["tpot_ms_p50"], j["tpot_ms_p99"], j["requests"])' "$j")"
  [ -z "$base" ] && base="$agg"
  ratio="$(python3 -c "print(f'{$agg / $base:.2f}x')")"
  echo "| $(basename "$model" .gguf) | $c | $n | $agg | $ratio | $t50 / $t99 | $p50 / $p99 | $(cut -d' ' -f1 /proc/loadavg) |"
done
