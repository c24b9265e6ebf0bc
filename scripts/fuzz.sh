#!/usr/bin/env bash
# Run the cargo-fuzz targets (fuzz/, docs/FUZZING.md) one after another, each for a
# time or a number of executions, from seed corpora built by fuzz/seed.sh. Runs every
# target, then exits non-zero if any of them crashed, hung (-timeout) or allocated over
# -rss_limit_mb; a failing input is left in fuzz/artifacts/<target>/ (turn it into a
# regression test, see FUZZING.md).
#
#   scripts/fuzz.sh                      # every target, 60 s each
#   scripts/fuzz.sh -t 600 tokenizer     # one target, 10 minutes
#   scripts/fuzz.sh -r 1000000           # every target, 1,000,000 executions each
#
# Needs `cargo +nightly` and cargo-fuzz (`cargo install cargo-fuzz`). Prints each
# target's executions and coverage (libFuzzer's cov/ft) and keeps the full logs in
# fuzz/logs/.
set -euo pipefail
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
cd "$(dirname "$0")/../fuzz"
limit=(-max_total_time=60)
while getopts "t:r:" o; do
  case "$o" in
    t) limit=(-max_total_time="$OPTARG") ;;
    r) limit=(-runs="$OPTARG") ;;
    *) echo "usage: $0 [-t SECONDS | -r RUNS] [target ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)

cargo +nightly fuzz build -O
bash seed.sh >/dev/null
mkdir -p logs

# Per-target input size caps: a GGUF seed is a 64 KiB header; text inputs stay small
# enough that one execution is quick but long runs of one character still show a
# super-linear tokenizer or stop-string matcher (-timeout catches those).
max_len() {
  case "$1" in
    gguf_header|gguf_model) echo 65536 ;;
    gguf_struct) echo 4096 ;;
    chat_template) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

# Per-target -timeout (seconds for one input): the text targets must stay near-linear
# (an 8 KiB run of one character through a tokenizer or the stop-string matcher takes
# milliseconds), the model and template targets legitimately do more.
time_limit() {
  case "$1" in
    tokenizer|http_request|wire) echo 2 ;;
    *) echo 10 ;;
  esac
}

status=0
for t in "${targets[@]}"; do
  log=logs/$t.log
  echo "== $t (${limit[*]})"
  # -rss_limit_mb: memory of the whole process
  # (libFuzzer also fails any single allocation above it: -malloc_limit_mb defaults to it).
  if ! cargo +nightly fuzz run -O "$t" "corpus/$t" -- "${limit[@]}" -max_len="$(max_len "$t")" \
       -timeout="$(time_limit "$t")" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    echo "FAILED: $t (log: fuzz/$log, input: fuzz/artifacts/$t/)"
    grep -a -E "^==|panicked|ERROR|SUMMARY|Test unit written" "$log" | head -20 || true
    status=1
    continue
  fi
  # The last status line holds the totals: "#N DONE cov: C ft: F corp: ..."
  { grep -a -E "^#[0-9]+[[:space:]]+DONE" "$log" | tail -1; grep -a -E "^Done|stat::(number_of_executed_units|peak_rss_mb)" "$log"; } | sed "s/^/   /" || true
done
exit $status
