#!/usr/bin/env bash
# Prefill and decode speed of `hearth generate`, median of N runs per thread count,
# in the shape of llama-bench's pp128 / tg64 (a 128-token prompt, 64 generated tokens).
#
#   bench/generate-speed.sh [MODEL] [RUNS] [THREADS...]
#
# Prints a Markdown table row per thread count. Compare with llama.cpp's figures in
# ../shared/reference/smollm2/llama-cpp-baseline.md (same machine class).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${1:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
runs="${2:-5}"
shift $(( $# > 2 ? 2 : $# )) || true
threads=("${@:-1 2}")
cargo build --release -q -p hearth --manifest-path "$root/Cargo.toml"
bin="$root/target/release/hearth"
prompt="$(mktemp)"; trap 'rm -f "$prompt"' EXIT
# Exactly 128 prompt tokens: cut the GPL text by token count via `hearth tokenize`.
ref="${HEARTH_REFERENCE_DIR:-$root/../shared/reference}/smollm2/ppl_gpl3.txt"
python3 - "$bin" "$model" "$ref" "$prompt" <<'PY'
import json, subprocess, sys
bin_, model, ref, out = sys.argv[1:]
text = open(ref).read()
lo, hi = 0, 2000
while lo < hi:  # longest prefix with <= 128 tokens
    mid = (lo + hi + 1) // 2
    ids = json.loads(subprocess.check_output([bin_, "tokenize", "-m", model, "--text", text[:mid], "--json"]))
    lo, hi = (mid, hi) if len(ids) <= 128 else (lo, mid - 1)
open(out, "w").write(text[:lo])
PY
echo "| model | threads | prompt tokens | pp tok/s (median) | tg tok/s (median) | peak RSS MiB |"
echo "|---|---:|---:|---:|---:|---:|"
for t in ${threads[@]}; do
  for i in $(seq "$runs"); do
    "$bin" generate -m "$model" -f "$prompt" -n 64 --ignore-eos --temperature 0 -t "$t" -c 512 --json
  done | python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
pp = statistics.median(r["timings"]["prefill_tok_s"] for r in rows)
tg = statistics.median(r["timings"]["decode_tok_s"] for r in rows)
rss = max(r["peak_rss_bytes"] for r in rows) / 2**20
n = len(rows[0]["prompt_tokens"])
print(f"| {sys.argv[1]} | {sys.argv[2]} | {n} | {pp:.1f} | {tg:.1f} | {rss:.1f} |")
' "$(basename "$model")" "$t"
done
