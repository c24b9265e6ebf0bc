#!/usr/bin/env bash
# A mixture-of-experts file under a memory cgroup of about half its size, cold page cache
# before each run: hearth's expert cache (--mem-budget), whole layers streamed through the
# window (HEARTH_WHOLE_LAYERS=1, same budget), and plain mmap (no budget) under the same
# limit (issue #21; results in docs/MEMORY.md). `hearth generate --json` runs (a fixed prompt,
# greedy), not `hearth bench`: bench's bandwidth probe allocates a 1 GiB buffer, which a cgroup
# limit of this size would feel.
#
#   sudo bench/moe-budget.sh MODEL.gguf [BUDGET=1GiB] [LIMIT_BYTES=1181116006] [N=32] [RUNS=3]
#
# Needs root and the cgroup v1 memory controller (/sys/fs/cgroup/memory, see
# ../shared/docs/MACHINE.md); the limit counts page cache, so the mapped run is an honest
# "device with LIMIT bytes of RAM". Each run prints TTFT, decode tok/s, peak RSS, the decode
# reads (MB per token, expert hit rate, I/O wait) and whether the tokens equal an unlimited
# mapped run's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${1:?usage: $0 MODEL.gguf [BUDGET] [LIMIT_BYTES] [N] [RUNS]}"
budget="${2:-1GiB}"
limit="${3:-1181116006}"
n="${4:-32}"
runs="${5:-3}"
hearth="${HEARTH:-$root/target/release/hearth}"
cg=/sys/fs/cgroup/memory/hearth-moe-budget
[[ -d /sys/fs/cgroup/memory ]] || { echo "error: no cgroup v1 memory controller at /sys/fs/cgroup/memory" >&2; exit 2; }
mkdir -p "$cg"
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
echo "$limit" > "$cg/memory.limit_in_bytes"

evict() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$model"; }
# Run "$@" inside the cgroup (a subshell that moves itself in first).
limited() { bash -c 'echo $$ > '"$cg"'/cgroup.procs; exec "$@"' _ "$@"; }
prompt="The history of the printing press begins"

echo "model $model, budget $budget, cgroup limit $limit bytes, $(lscpu | sed -n 's/^Model name: *//p'), hearth $("$hearth" --version)"
reference=$("$hearth" generate -m "$model" -p "$prompt" -n "$n" -t 2 --temperature 0 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['completion_tokens'])")
report='
import json, sys
d = json.load(sys.stdin); t = d["timings"]; w = d.get("window") or {}; io = w.get("decode_io") or {}
n = max(len(d["completion_tokens"]) - 1, 1)
same = "same tokens" if str(d["completion_tokens"]) == sys.argv[1] else "TOKENS DIFFER"
print("TTFT {:.0f} ms, decode {:.2f} tok/s, peak RSS {:.0f} MiB, decode reads {:.1f} MB/token, I/O wait {:.1f} ms/token, expert hit rate {:.1f}%, {}".format(
    t["ttft_ms"], t["decode_tok_s"], d["peak_rss_bytes"] / 2**20, io.get("bytes_read", 0) / n / 1e6,
    io.get("wait_secs", 0) * 1e3 / n, 100 * io.get("expert_hit_rate", 0), same))
'
for mode in experts whole-layers mmap; do
  case $mode in
    experts) env=(); args=(--mem-budget "$budget") ;;
    whole-layers) env=(HEARTH_WHOLE_LAYERS=1); args=(--mem-budget "$budget") ;;
    mmap) env=(); args=() ;;
  esac
  for r in $(seq "$runs"); do
    evict
    printf '%s run %s: ' "$mode" "$r"
    limited env "${env[@]}" "$hearth" generate -m "$model" -p "$prompt" -n "$n" -t 2 --temperature 0 --json "${args[@]}" 2>/dev/null \
      | python3 -c "$report" "$reference"
  done
done
