#!/usr/bin/env bash
# hearth against llama.cpp at each x86 SIMD level, on one machine: for every level in LEVELS
# that this CPU has, `HEARTH_SIMD=LEVEL` against a llama.cpp whose CPU backend was built for
# the same instructions, side by side in one `bench/compare-llama-cpp.sh` run per file.
#
#   LLAMA_DIR=/tmp/ll bench/simd-levels.sh [LEVELS=avx2,avxvnni,avx512] [THREADS=1,2] [P=512] [N=128] [R=3] MODEL.gguf...
#
# LLAMA_DIR holds one directory per level, LLAMA_DIR/LEVEL/, each with llama-bench and that
# level's libggml-cpu.so (llama.cpp's loader takes the CPU backend from the executable's
# directory). One llama.cpp build gives them all: build llama-bench once with the backend as a
# loadable module, then only the CPU backend again per level (a few minutes each on 2 cores).
# Sources from PyPI as in the header of bench/compare-llama-cpp.sh; then:
#
#   S=llama_cpp_python-0.3.36/vendor/llama.cpp
#   C="-G Ninja -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release
#      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
#      -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_AVX2=ON -DGGML_BMI2=ON"
#   cmake -S $S -B build-avx2 $C                      # llama.cpp's "haswell" CPU variant
#   cmake -S $S -B build-avxvnni $C -DGGML_AVX_VNNI=ON # its "alderlake" variant
#   cmake -S $S -B build-avx512 $C -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
#   ninja -C build-avx2 llama-bench ggml-cpu
#   ninja -C build-avxvnni ggml-cpu && ninja -C build-avx512 ggml-cpu
#   for l in avx2 avxvnni avx512; do cp -r build-avx2/bin $LLAMA_DIR/$l; cp build-$l/bin/libggml-cpu.so $LLAMA_DIR/$l/; done
#
# (The avx512 build leaves out AMX, which llama.cpp's native build on a Sapphire Rapids class
# Xeon would use for its prefill: a server matrix unit, not a CPU people own at home.)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

usage() { echo "usage: LLAMA_DIR=DIR $0 [LEVELS=avx2,avxvnni,avx512] [THREADS=1,2] [P=512] [N=128] [R=3] MODEL.gguf..." >&2; exit 2; }
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; usage; }
[[ -n "${LLAMA_DIR:-}" ]] || { echo "error: set LLAMA_DIR (see the top of $0)" >&2; exit 2; }
levels="avx2,avxvnni,avx512"; threads="1,2"; p=512; n=128; r=3
[[ $# -ge 1 && "$1" =~ ^[a-z][a-z0-9,]*$ && ! -f "$1" ]] && { levels="$1"; shift; }
[[ $# -ge 1 && "$1" =~ ^[0-9,]+$ && ! -f "$1" ]] && { threads="$1"; shift; }
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ && ! -f "$1" ]] && { p="$1"; shift; }
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ && ! -f "$1" ]] && { n="$1"; shift; }
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ && ! -f "$1" ]] && { r="$1"; shift; }
[[ $# -ge 1 ]] || usage
for m in "$@"; do [[ -f "$m" ]] || { echo "error: model file not found: $m" >&2; usage; }; done

HEARTH="${HEARTH:-$root/target/release/hearth}"
[[ -x "$HEARTH" ]] || { echo "error: no hearth binary at $HEARTH (cargo build --release -p hearth)" >&2; exit 2; }
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "hearth: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
IFS=, read -ra lv <<<"$levels"
for level in "${lv[@]}"; do
  # A CPU without the level would run a lower one under HEARTH_SIMD=LEVEL: unlike with like.
  case "$level" in
    avx2) need="avx2 fma f16c" ;;
    avxvnni) need="avx2 fma f16c avx_vnni" ;;
    avx512) need="avx2 fma f16c avx512f avx512bw avx512vl" ;;
    *) echo "error: unknown level $level (avx2, avxvnni, avx512)" >&2; exit 2 ;;
  esac
  missing=""
  for f in $need; do grep -qw "$f" /proc/cpuinfo || missing="$missing $f"; done
  if [[ -n "$missing" ]]; then
    echo; echo "## $level: skipped (this CPU lacks$missing)"; continue
  fi
  lb="$LLAMA_DIR/$level/llama-bench"
  [[ -x "$lb" ]] || { echo "error: no llama-bench at $lb" >&2; exit 2; }
  for model in "$@"; do
    echo; echo "## $level: $(basename "$model")"; echo
    HEARTH_SIMD="$level" LLAMA_BENCH="$lb" HEARTH="$HEARTH" "$root/bench/compare-llama-cpp.sh" "$model" "$threads" "$p" "$n" "$r"
  done
done
