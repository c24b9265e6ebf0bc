#!/usr/bin/env bash
# Mixture of experts under a memory budget (issue #21): decode speed, bytes read, expert
# hit rate, disk wait and peak RSS of a Qwen3-30B-A3B-shaped file under a memory cgroup of
# about half the file, cold page cache before every run, for
#   experts  --mem-budget with the expert cache (and its read-ahead of the next layer's experts)
#   noahead  the same, read-ahead off (HEARTH_NO_EXPERT_PREFETCH=1)
#   layers   the same budget, HEARTH_WHOLE_LAYERS=1 (whole layers stream through the window)
#   mmap     no --mem-budget: the plain mapping, paged by the kernel under the same limit
# plus one mapped run without a cgroup as the reference tokens (greedy).
# Needs root (cgroup v1 memory controller). Usage:
#   bench/moe-budget.sh [MODEL] [RUNS]
# MODEL defaults to /tmp/a3b-6l.gguf, made with
#   hearth synth --arch qwen3moe --shape 30b-a3b --n-layer 6 --type q4_0 \
#     --tokenizer-from models/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/a3b-6l.gguf
# Extra env: CG_BYTES (cgroup limit, default file/2), BUDGET (--mem-budget, default
# CG_BYTES − 100 MiB: headroom for what the budget does not see, e.g. the binary's pages),
# N (tokens, 64), CONFIGS (default "experts layers mmap"), OUT (results dir).
set -euo pipefail
M=${1:-/tmp/a3b-6l.gguf}
RUNS=${2:-3}
BIN=${BIN:-target/release/hearth}
N=${N:-64}
FILE_BYTES=$(stat -c %s "$M")
CG_BYTES=${CG_BYTES:-$((FILE_BYTES / 2))}
BUDGET=${BUDGET:-$((CG_BYTES - 100 * 1024 * 1024))}
CONFIGS=${CONFIGS:-"experts layers mmap"}
OUT=${OUT:-/tmp/moe-budget}
CG=/sys/fs/cgroup/memory/hearth-moe-$$
mkdir -p "$OUT"
ARGS=(generate -m "$M" -p "The quick brown fox jumps over the lazy dog" -n "$N" --ignore-eos
      --temperature 0 -t 2 -c 256 --json)

evict() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$M"; }
# Bytes this run read from the block device (getrusage ru_inblock × 512: counted when the
# read is submitted, buffered read-ahead, page faults and O_DIRECT alike; /proc/diskstats
# would count other users of the disk too).
inblock() { python3 -c 'import resource,subprocess,sys; subprocess.run(sys.argv[1:], check=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512, file=sys.stderr)' "$@"; }

"$BIN" "${ARGS[@]}" > "$OUT/reference.json"   # mapped, no cgroup: the reference tokens

for run in $(seq 1 "$RUNS"); do
  for cfg in $CONFIGS; do
    mkdir "$CG"
    echo "$CG_BYTES" > "$CG/memory.limit_in_bytes"
    evict
    case $cfg in
      experts) extra=(--mem-budget "$BUDGET"); envs=() ;;
      noahead) extra=(--mem-budget "$BUDGET"); envs=(HEARTH_NO_EXPERT_PREFETCH=1) ;;
      layers)  extra=(--mem-budget "$BUDGET"); envs=(HEARTH_WHOLE_LAYERS=1) ;;
      mmap)    extra=(); envs=() ;;
    esac
    ( echo $BASHPID > "$CG/cgroup.procs"; inblock env "${envs[@]}" "$BIN" "${ARGS[@]}" "${extra[@]}" ) \
      > "$OUT/$cfg-$run.json" 2> "$OUT/$cfg-$run.err"
    echo "{\"disk_read_bytes\": $(tail -1 "$OUT/$cfg-$run.err"), \"cgroup_max_usage\": $(cat "$CG/memory.max_usage_in_bytes")}" > "$OUT/$cfg-$run.extra"
    rmdir "$CG"
  done
done

python3 - "$OUT" "$RUNS" "$CONFIGS" <<'PY'
import json, statistics as st, sys
out, runs, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
ref = json.load(open(f"{out}/reference.json"))["completion_tokens"]
med = lambda xs: st.median(xs) if xs else float("nan")
print("| config | decode tok/s (runs) | median | read/token MB | hit rate | disk wait/token ms | peak RSS MB | cgroup max MB | disk read MB (whole run) | read ahead / prefetch hits | tokens = mapped |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
for cfg in configs:
    rows = []
    for r in range(1, runs + 1):
        d = json.load(open(f"{out}/{cfg}-{r}.json")); e = json.load(open(f"{out}/{cfg}-{r}.extra"))
        nt = len(d["completion_tokens"]) - 1  # tokens timed by decode (the first comes from prefill)
        io = (d.get("window") or {}).get("decode_io")
        rows.append(dict(tps=d["timings"]["decode_tok_s"], rss=d["peak_rss_bytes"] / 1e6,
                         cg=e["cgroup_max_usage"] / 1e6, dev=e["disk_read_bytes"] / 1e6,
                         same=d["completion_tokens"] == ref,
                         rpt=io["bytes_read"] / nt / 1e6 if io else None,
                         hit=io["expert_hit_rate"] if io and io["expert_hits"] + io["expert_misses"] else None,
                         wait=io["wait_secs"] / nt * 1e3 if io else None,
                         ahead=f'{io.get("experts_prefetched", 0)} / {io.get("expert_prefetch_hits", 0)}' if io else "–"))
    f = lambda k, fmt: (fmt % med([x[k] for x in rows])) if rows[0][k] is not None else "–"
    print(f"| {cfg} | {', '.join('%.1f' % x['tps'] for x in rows)} | {med([x['tps'] for x in rows]):.1f} | "
          f"{f('rpt','%.1f')} | {f('hit','%.3f')} | {f('wait','%.2f')} | {f('rss','%.0f')} | {f('cg','%.0f')} | "
          f"{f('dev','%.0f')} | {', '.join(x['ahead'] for x in rows)} | {all(x['same'] for x in rows)} |")
PY
