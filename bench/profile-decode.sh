#!/usr/bin/env bash
# Where decode time goes: a sampled CPU profile of `hearth bench`'s decode test.
#
#   bench/profile-decode.sh MODEL.gguf [THREADS=2] [N=64]
#
# Runs `perf record -e cpu-clock` (a software clock: this VM has no hardware counters, so
# `perf stat -e cycles` says "not supported", but timer sampling works) over
# `hearth bench -m MODEL -p 0 -n N -t THREADS -r 2`, then prints
#   1. the share of samples per function (the matmul kernels against everything else), and
#   2. the hottest instructions of the top function with their share of its samples.
# A timer sample lands on the instruction that was waiting to retire, so loads that miss
# and the instruction after a gather show up as hot spots; read them as "waiting on", not
# "busy in".
#
# Needs `perf` (Debian's linux-perf) and perf_event_paranoid <= 2. The bench itself also
# measures memory bandwidth (about a second) before the test; that shows as `membw::sum_*`.
#
# Environment: HEARTH (default target/release/hearth), OUT (perf.data path, default a temp file).
set -euo pipefail
model=${1:?usage: bench/profile-decode.sh MODEL.gguf [THREADS] [N]}
threads=${2:-2}
n=${3:-64}
hearth=${HEARTH:-$(dirname "$0")/../target/release/hearth}
out=${OUT:-$(mktemp /tmp/hearth-perf.XXXXXX)}
command -v perf >/dev/null || { echo "perf not found (apt-get install linux-perf)" >&2; exit 1; }
[ -x "$hearth" ] || { echo "no hearth binary at $hearth (cargo build --release -p hearth)" >&2; exit 1; }

echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')"
perf record -q -e cpu-clock -F 2000 -o "$out" -- "$hearth" bench -m "$model" -p 0 -n "$n" -t "$threads" -r 2 2>&1 \
    | grep -E "^\| (model|---|.*tg)" || true
echo
echo "## samples per function"
report=$(perf report -i "$out" --no-children --sort symbol --percent-limit 0.5 --stdio 2>/dev/null | grep -E "^ +[0-9]" || true)
echo "$report" | awk '{print $1, $3}'
top=$(echo "$report" | awk 'NR == 1 {print $3}')
echo
echo "## hottest instructions of $top (share of its samples)"
perf annotate -i "$out" --stdio -s "$top" 2>/dev/null | awk -F: '$1+0 >= 1.0' | sort -rn | head -25
echo
echo "# perf data: $out"
