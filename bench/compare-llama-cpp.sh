#!/usr/bin/env bash
# Side-by-side prefill/decode speed of hearth and llama.cpp on the same machine, same run.
#
#   LLAMA_BENCH=/path/to/llama-bench bench/compare-llama-cpp.sh MODEL.gguf [THREADS=1,2] [P=512] [N=128] [R=5]
#
# For each thread count it runs `hearth bench` and then `llama-bench` (interleaved, so host
# noise on this shared machine hits both alike) and prints a Markdown table of tok/s mean ± sd
# and the ratio hearth / llama.cpp, with the `uptime` load average at start and end.
#
# Environment:
#   LLAMA_BENCH   path to llama.cpp's llama-bench (required; see below to build it)
#   HEARTH        path to the hearth binary (default: target/release/hearth in this repo;
#                 build it with `cargo build --release -p hearth`)
#   HEARTH_MODEL  the file hearth runs instead of MODEL: the same weights in hearth's own
#                 layout (`hearth quantize --pure MODEL OUT --type q4_0x8` of a Q4_0 MODEL,
#                 which llama.cpp cannot read); the table then names both files
#   HEARTH_ARGS, LLAMA_BENCH_ARGS   extra arguments for either tool (word-split), e.g.
#                 LLAMA_BENCH_ARGS="--repack 0"
#
# Building llama-bench (the llama.cpp vendored in llama_cpp_python-0.3.36, the build behind
# ../shared/reference/smollm2/llama-cpp-baseline.md). Only package registries are reachable,
# so take llama.cpp from the PyPI sdist and cmake/ninja from PyPI wheels; build outside the repo:
#
#   mkdir -p /tmp/llamacpp && cd /tmp/llamacpp
#   python3 -m venv venv && venv/bin/pip install cmake ninja scikit-build-core
#   # The sdist (76.6 MB, sha256 832db069...c1a2e). --no-build-isolation matters: without it pip
#   # "prepares metadata" in an isolated env whose build deps it builds from source under
#   # --no-binary :all: (cmake from source: an hour on 2 cores). With scikit-build-core in the
#   # venv it takes seconds.
#   venv/bin/pip download --no-deps --no-binary :all: --no-build-isolation llama_cpp_python==0.3.36
#   tar xzf llama_cpp_python-0.3.36.tar.gz       # llama.cpp is in llama_cpp_python-0.3.36/vendor/llama.cpp
#   export PATH=$PWD/venv/bin:$PATH
#   cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -G Ninja \
#     -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
#   nice -n 15 cmake --build build -j2 --target llama-bench llama-quantize llama-perplexity llama-completion
#   export LLAMA_BENCH=/tmp/llamacpp/build/bin/llama-bench
#
# With -DGGML_NATIVE=ON the build targets the build host's CPU (-march=native): build it on the
# machine you benchmark on. The CPU features it uses are in the `system_info:` line that
# `build/bin/llama-completion -m MODEL -p hi -n 4 -no-cnv` prints (e.g. AVX512 = 1 | AVX512_VNNI = 1).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

usage() { echo "usage: LLAMA_BENCH=/path/to/llama-bench $0 MODEL.gguf [THREADS=1,2] [P=512] [N=128] [R=5]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 5 ]] || usage
model="$1"; threads="${2:-1,2}"; p="${3:-512}"; n="${4:-128}"; r="${5:-5}"
[[ -f "$model" ]] || { echo "error: model file not found: $model" >&2; exit 2; }
[[ "$threads" =~ ^[0-9]+(,[0-9]+)*$ && "$p" =~ ^[0-9]+$ && "$n" =~ ^[0-9]+$ && "$r" =~ ^[1-9][0-9]*$ ]] || usage

if [[ -z "${LLAMA_BENCH:-}" ]]; then
  echo "error: set LLAMA_BENCH to llama.cpp's llama-bench binary; see the comment at the top of $0 for how to build it" >&2
  exit 2
fi
[[ -x "$LLAMA_BENCH" ]] || { echo "error: LLAMA_BENCH=$LLAMA_BENCH is not an executable file (build steps: top of $0)" >&2; exit 2; }
HEARTH="${HEARTH:-$root/target/release/hearth}"
[[ -x "$HEARTH" ]] || { echo "error: hearth binary not found at $HEARTH; run \`cargo build --release -p hearth\` or set HEARTH" >&2; exit 2; }

tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
load() { uptime | sed 's/.*load average: *//'; }
load_start="$(load)"

IFS=, read -ra tlist <<<"$threads"
for t in "${tlist[@]}"; do
  echo "threads $t: hearth ..." >&2
  # shellcheck disable=SC2086
  "$HEARTH" bench -m "${HEARTH_MODEL:-$model}" -p "$p" -n "$n" -t "$t" -r "$r" --json ${HEARTH_ARGS:-} \
    >"$tmp/hearth-$t.json" 2>"$tmp/hearth-$t.err" \
    || { echo "error: hearth bench failed (threads $t):" >&2; tail -20 "$tmp/hearth-$t.err" >&2; exit 1; }
  echo "threads $t: llama.cpp ..." >&2
  # shellcheck disable=SC2086
  "$LLAMA_BENCH" -m "$model" -p "$p" -n "$n" -t "$t" -r "$r" -o json ${LLAMA_BENCH_ARGS:-} \
    >"$tmp/llama-$t.json" 2>"$tmp/llama-$t.err" \
    || { echo "error: llama-bench failed (threads $t):" >&2; tail -20 "$tmp/llama-$t.err" >&2; exit 1; }
done
load_end="$(load)"

python3 - "$tmp" "$model" "$threads" "$load_start" "$load_end" <<'PY'
import glob, json, os, sys
tmp, model, threads, load_start, load_end = sys.argv[1:]

def rows(prefix):
    out = {}
    for path in glob.glob(os.path.join(tmp, prefix + "-*.json")):
        with open(path) as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            # tolerate log lines around the JSON list
            data = json.loads(text[text.index("["): text.rindex("]") + 1])
        for r in data:
            out[(int(r["n_prompt"]), int(r["n_gen"]), int(r["n_threads"]))] = r
    return out

h, l = rows("hearth"), rows("llama")
anyrow = next(iter(l.values()), {})
hrow = next(iter(h.values()), {})
print(f"model: `{os.path.basename(model)}`  ")
if os.environ.get("HEARTH_MODEL"):
    print(f"hearth ran: `{os.path.basename(os.environ['HEARTH_MODEL'])}` (the same weights in hearth's layout)  ")
print(f"llama.cpp: build {anyrow.get('build_commit', '?')} ({anyrow.get('build_number', '?')}), "
      f"backends {anyrow.get('backends', '?')}, cpu {anyrow.get('cpu_info', '?')}  ")
print(f"hearth: simd {hrow.get('simd', '?')}  ")
print(f"load average (1, 5, 15 min): start {load_start}; end {load_end}")
print()
print("| test | threads | hearth tok/s | llama.cpp tok/s | hearth / llama.cpp |")
print("|---|---:|---:|---:|---:|")
order = [int(t) for t in threads.split(",")]
def key(k):
    p, n, t = k
    return (0 if n == 0 else 1, p, n, order.index(t) if t in order else t)
for k in sorted(set(h) | set(l), key=key):
    p, n, t = k
    test = f"pp{p}" if n == 0 else (f"tg{n}" if p == 0 else f"pp{p}+tg{n}")
    fmt = lambda r: f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}" if r else "–"
    hr, lr = h.get(k), l.get(k)
    ratio = f"{hr['avg_ts'] / lr['avg_ts']:.2f}" if hr and lr and lr["avg_ts"] else "–"
    print(f"| {test} | {t} | {fmt(hr)} | {fmt(lr)} | {ratio} |")
PY
