#!/usr/bin/env bash
# Tensor parallelism over an emulated home network (issue #6).
#
#   bench/tp-network.sh
#
# Starts `hearth worker`s on this machine, puts a user-space delay proxy
# (crates/parallel/examples/delay_proxy.rs: one-way delay, rate per direction; one
# process for all workers, so the coordinator's interface is shared as on a switch
# port) in front of them, and runs `hearth generate` across coordinator + workers for
# each one-way delay, node count, wire type and schedule. Prints a Markdown table with
# decode ms/token, the allreduce share of it, KB sent per token and the latency model
# 2·L·(t_data + t_link) per token (t_link = 2τ per exchange, t_data = 2(N−1)·S/B;
# `sum` does 2 exchanges per layer, `gather` 4). Then runs the in-process allreduce
# microbenchmark (examples/allreduce_latency.rs): star vs ring, N = 2, 3, 4,
# S = 576 (SmolLM2) and 4096 (a 7B's decode); its τ = 0 rows go through the emulated
# links with no delay (the emulator's own cost), `direct` rows over plain loopback.
#
# "other load" is the CPU other processes used during each run (the machine is shared).
# A worker that vanishes mid-run is restarted on its address and the run retried once.
#
# The per-token split of decode into compute and allreduce is only printed on stderr
# (the `decode:` line; `--json`'s tensor_parallel counters add prefill and decode
# together), so the runs here are without --json.
#
# Environment (defaults):
#   HEARTH      target/release/hearth       the binary (build: cargo build --release -p hearth)
#   MODEL       models/SmolLM2-135M-Instruct.Q4_1.gguf
#   DELAYS      "1 5 10"                    one-way delays in ms (0 ms without proxy always runs first)
#   RATE_MBIT   300                         link rate per direction
#   NODES       "2 3"                       node counts (coordinator + NODES−1 workers)
#   NTOK        32                          tokens generated (-n) at delays below SLOW_MS
#   NTOK_SLOW   16                          tokens generated at delays ≥ SLOW_MS (keeps the run short)
#   SLOW_MS     5
#   MICRO_REPS  30                          repetitions per microbenchmark configuration
#   SKIP_E2E=1 / SKIP_MICRO=1               skip a part
#   LOG_DIR                                 keep every run's stdout/stderr there
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
HEARTH="${HEARTH:-$root/target/release/hearth}"
model="${MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
delays="${DELAYS:-1 5 10}"
rate="${RATE_MBIT:-300}"
nodes_list="${NODES:-2 3}"
ntok="${NTOK:-32}"
ntok_slow="${NTOK_SLOW:-16}"
slow_ms="${SLOW_MS:-5}"
micro_reps="${MICRO_REPS:-30}"
prompt="In the old harbour town, the fishermen rose before dawn, mended their nets by lantern light, and told stories about the great storm that"

if [[ ! -x "$HEARTH" ]]; then
  echo "no hearth binary at $HEARTH: build it with 'cargo build --release -p hearth' or set HEARTH" >&2
  exit 1
fi
cargo build --release -q -p hearth-parallel --example delay_proxy --example allreduce_latency \
  --manifest-path "$root/Cargo.toml"
examples="${CARGO_TARGET_DIR:-$root/target}/release/examples"
proxy_bin="$examples/delay_proxy"
micro_bin="$examples/allreduce_latency"

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ -n "${LOG_DIR:-}" ]]; then mkdir -p "$LOG_DIR" && cp -r "$work"/. "$LOG_DIR"/; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_lines FILE PATTERN COUNT: until FILE has COUNT lines matching PATTERN (30 s).
wait_lines() {
  for _ in $(seq 300); do
    if [[ "$(grep -c "$2" "$1" 2>/dev/null || true)" -ge "$3" ]]; then return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1" >&2
  cat "$1" "${1%.out}.err" >&2 2>/dev/null || true
  exit 1
}

# Model shape for the latency model.
read -r n_layer n_embd n_ff q_dim < <("$HEARTH" inspect "$model" --json | python3 -c '
import json, sys
m = json.load(sys.stdin)["metadata"]
a = m["general.architecture"]
e, h = m[a + ".embedding_length"], m[a + ".attention.head_count"]
print(m[a + ".block_count"], e, m[a + ".feed_forward_length"], h * m.get(a + ".attention.key_length", e // h))')
n_prompt="$("$HEARTH" tokenize -m "$model" --text "$prompt" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"

max_nodes=0
for n in $nodes_list; do (( n > max_nodes )) && max_nodes=$n; done
# start_worker I ADDR: worker I listening on ADDR (127.0.0.1:0 picks a port).
workers=()
worker_pids=()
start_worker() {
  local i=$1 log="$work/worker$1.${#pids[@]}"
  "$HEARTH" worker --listen "$2" -m "$model" -t 1 >"$log.out" 2>"$log.err" &
  pids+=($!)
  worker_pids[i]=$!
  wait_lines "$log.out" '^hearth worker listening on ' 1
  workers[i]="$(sed -n 's/^hearth worker listening on \([^ ]*\).*/\1/p' "$log.out")"
}
# revive_workers: restart (on the same address) any worker that is gone, saying how it
# ended; returns 1 if one was restarted.
revive_workers() {
  local i st revived=0
  for i in "${!worker_pids[@]}"; do
    if ! kill -0 "${worker_pids[i]}" 2>/dev/null; then
      st=0
      wait "${worker_pids[i]}" 2>/dev/null || st=$?
      echo "  worker $i (pid ${worker_pids[i]}, ${workers[i]}) is gone, exit status $st; restarting it" >&2
      start_worker "$i" "${workers[i]}"
      revived=1
    fi
  done
  return $((1 - revived))
}
for i in $(seq 0 $((max_nodes - 2))); do start_worker "$i" 127.0.0.1:0; done

results="$work/results.tsv"
: >"$results"
run=0
# gen DELAY NODES WIRE SCHED NTOK ADDRS...: one generate; appends a results line.
# run_measured LOAD_FILE OUT ERR CMD...: run CMD and write to LOAD_FILE the CPU (in
# cores, averaged over the run) used by processes other than CMD and the ones this
# script started: the machine is shared, and other jobs slow the nodes down.
run_measured() {
  python3 - "$@" <<'PY'
import os, resource, subprocess, sys, time
load_file, out, err, *cmd = sys.argv[1:]
mine = [int(p) for p in os.environ.get("BENCH_PIDS", "").split()]
hz = os.sysconf("SC_CLK_TCK")
def busy():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4]  # all but idle and iowait
def ours():
    t = 0
    for p in mine:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            t += int(f[11]) + int(f[12])  # utime, stime
        except OSError:
            pass
    return t
b0, o0, t0 = busy(), ours(), time.monotonic()
with open(out, "w") as fo, open(err, "w") as fe:
    rc = subprocess.call(cmd, stdout=fo, stderr=fe)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
other = (busy() - b0 - (ours() - o0)) / hz - (ru.ru_utime + ru.ru_stime)
open(load_file, "w").write(f"{max(other, 0.0) / wall:.2f}\n")
sys.exit(rc)
PY
}

# gen DELAY NODES WIRE SCHED NTOK ADDRS...: one generate; appends a results line (a
# failed run is recorded as such, and the benchmark goes on).
gen() {
  local delay=$1 n=$2 wire=$3 sched=$4 ntok=$5
  shift 5
  run=$((run + 1))
  local out="$work/run$run.out" err="$work/run$run.err" load="$work/run$run.load" cluster=()
  if (( n > 1 )); then
    cluster=(--workers "$(IFS=,; echo "${*:1:n-1}")" --wire-type "$wire" --tp-schedule "$sched")
  fi
  echo "  τ=$delay ms, $n nodes, $wire, $sched, -n $ntok ..." >&2
  local try
  for try in 1 2; do
    if BENCH_PIDS="${pids[*]}" run_measured "$load" "$out" "$err" \
      "$HEARTH" generate -m "$model" -p "$prompt" -n "$ntok" --temperature 0 -t 1 --ignore-eos "${cluster[@]}"; then
      break
    fi
    echo "  failed: $(tail -1 "$err")" >&2
    # A worker that died (not one that reported an error) is restarted and the run retried once.
    revive_workers || break
    cp "$err" "$err.try$try"
  done
  python3 - "$delay" "$n" "$wire" "$sched" "$out" "$err" "$load" >>"$results" <<'PY'
import re, sys
delay, n, wire, sched, out, err, load = sys.argv[1:]
e = open(err).read()
other = open(load).read().strip()
s = re.search(r"decode (\d+) tokens at ([\d.]+) tok/s", e)
d = re.search(r"^decode: per token ([\d.]+) ms = compute ([\d.]+) ms \+ allreduce and waiting for workers "
              r"([\d.]+) ms \((\d+)%\); ([\d.]+) KB sent", e, re.M)
text = open(out).read().strip().replace("\t", " ").replace("\n", " ")
if d:
    ms, comp, ar, share, kb = d.groups()
elif s:  # one node
    ms, comp, ar, share, kb = f"{1e3 / float(s.group(2)):.1f}", "", "0", "0", "0"
else:  # failed
    ms, comp, ar, share, kb = "fail", "", "", "", ""
    text = e.strip().splitlines()[-1] if e.strip() else "failed"
print("\t".join([delay, n, wire, sched, ms, comp, ar, share, kb, text, other]))
PY
}

echo "$(date -u '+%F %H:%M UTC'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "model: $(basename "$model"), $n_layer layers, n_embd $n_embd, n_ff $n_ff; prompt $n_prompt tokens; rate $rate Mbit/s" >&2
if [[ -z "${SKIP_E2E:-}" ]]; then
  gen - 1 - - "$ntok"
  for delay in 0 $delays; do
    targets=("${workers[@]}")
    proxy_pid=
    if [[ "$delay" != 0 ]]; then
      args=()
      for w in "${workers[@]}"; do args+=(--listen 127.0.0.1:0 --target "$w"); done  # one listener per worker
      "$proxy_bin" "${args[@]}" --delay-ms "$delay" --rate-mbit "$rate" >"$work/proxy$delay.out" 2>"$work/proxy$delay.err" &
      proxy_pid=$!
      pids+=("$proxy_pid")
      wait_lines "$work/proxy$delay.out" '^delay proxy listening on ' "${#workers[@]}"
      mapfile -t targets < <(sed -n 's/^delay proxy listening on \([^ ]*\).*/\1/p' "$work/proxy$delay.out")
    fi
    n_this=$ntok
    if python3 -c "import sys; sys.exit(0 if float('$delay') >= float('$slow_ms') else 1)"; then n_this=$ntok_slow; fi
    for n in $nodes_list; do
      gen "$delay" "$n" f32 sum "$n_this" "${targets[@]}"
      gen "$delay" "$n" q8_0 sum "$n_this" "${targets[@]}"
      gen "$delay" "$n" f32 gather "$n_this" "${targets[@]}"
    done
    if [[ -n "$proxy_pid" ]]; then kill "$proxy_pid" 2>/dev/null || true; wait "$proxy_pid" 2>/dev/null || true; fi
  done

  echo
  echo "decode, $n_prompt-token prompt, -t 1 per node, $rate Mbit/s; model per token: Σ over exchanges (2τ + 2(N−1)·frame/B);"
  echo "other load: CPU cores used by other processes on the machine during the run (averaged)"
  echo
  python3 - "$results" "$rate" "$n_layer" "$n_embd" "$n_ff" "$q_dim" <<'PY'
import sys
path, rate, L, e, ff, q = sys.argv[1], float(sys.argv[2]), *map(int, sys.argv[3:])
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
B = rate * 1e6 / 8
def frame(n, wire):
    return 34 + (4 * n if wire == "f32" else 34 * -(-n // 32))
def model_ms(delay, n, wire, sched):
    tau = float(delay) / 1e3
    sizes = [e, e] if sched == "sum" else [q, e, ff, e]
    return 1e3 * L * sum(2 * tau + 2 * (n - 1) * frame(s, wire) / B for s in sizes)
one = next((r for r in rows if r[1] == "1"), [""] * 11)
base = {(r[1], r[2], r[3]): float(r[4]) for r in rows if r[0] == "0" and r[4] != "fail"}
print("| τ ms | nodes | wire | schedule | decode ms/token | allreduce ms/token | allreduce share | KB sent/token "
      "| model comm ms/token | 0 ms + model | measured − (0 ms + model) | ratio | text = 1 node | other load |")
print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for d, n, wire, sched, ms, comp, ar, share, kb, text, other in rows:
    if ms == "fail":
        print(f"| {d} | {n} | {wire} | {sched} | failed: {text} | | | | | | | | | {other} |")
        continue
    # Runs with fewer tokens (NTOK_SLOW) compare with the start of the 1-node text.
    same = "yes" if text and one[9].startswith(text) else "no"
    if n == "1":
        print(f"| - | 1 | - | - | {float(ms):.1f} | - | - | - | - | - | - | - | - | {other} |")
        continue
    head = f"| {d} | {n} | {wire} | {sched} | {float(ms):.1f} | {float(ar):.1f} | {share}% | {float(kb):.1f} "
    b = base.get((n, wire, sched))
    if float(d) == 0 or b is None:  # no emulated link: nothing to predict
        print(head + f"| - | - | - | - | {same} | {other} |")
        continue
    m = model_ms(d, int(n), wire, sched)
    print(head + f"| {m:.1f} | {b + m:.1f} | {float(ms) - b - m:+.1f} | {float(ms) / (b + m):.2f} | {same} | {other} |")
PY
fi

if [[ -z "${SKIP_MICRO:-}" ]]; then
  echo
  echo "allreduce microbenchmark (in-process, median of $micro_reps; slowest node per repetition)"
  echo
  "$micro_bin" --nodes 2,3,4 --elems 576,4096 --delay-ms "$(echo 0 $delays | tr ' ' ',')" \
    --rate-mbit "$rate" --reps "$micro_reps" --direct
fi
echo "done $(date -u '+%H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
