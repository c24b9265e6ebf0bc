#!/usr/bin/env bash
# Speed of each architecture at one shape, side by side with llama.cpp, one table per
# architecture (issue #17: the other architectures must be no slower than the llama rows,
# relative to llama.cpp).
#
#   LLAMA_BENCH=/path/to/llama-bench bench/arch-speed.sh SHAPE P N R [ARCH...]
#   e.g. bench/arch-speed.sh 7b 32 16 3 llama qwen2 qwen3 gemma3
#
# For each architecture (default: llama qwen2 qwen3 gemma3) it writes
# `hearth synth --arch A --shape SHAPE --type q4_0 --output-type q6_k` (SmolLM2's tokenizer,
# so every file has the same vocabulary), runs bench/compare-llama-cpp.sh on it at 1 and 2
# threads, and deletes the file (KEEP=1 keeps it) so that only one file at a time takes
# disk and page cache. Files go to $ARCH_SPEED_DIR (default: models/synth, git-ignored).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 4 ] || { sed -n '2,13p' "$0"; exit 2; }
shape=$1 p=$2 n=$3 r=$4
shift 4
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(llama qwen2 qwen3 gemma3)
hearth="${HEARTH:-$root/target/release/hearth}"
dir="${ARCH_SPEED_DIR:-$root/models/synth}"
tok="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$dir"
for a in "${archs[@]}"; do
  f="$dir/$a-$shape-q4_0.gguf"
  "$hearth" synth --arch "$a" --shape "$shape" --type q4_0 --output-type q6_k --tokenizer-from "$tok" --out "$f" >&2
  echo
  echo "#### $a"
  echo
  HEARTH="$hearth" "$root/bench/compare-llama-cpp.sh" "$f" 1,2 "$p" "$n" "$r"
  [ -n "${KEEP:-}" ] || rm -f "$f"
done
