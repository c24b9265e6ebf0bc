#!/usr/bin/env bash
# Cross-build hearth for 64-bit ARM Linux (aarch64-unknown-linux-gnu) on an x86-64 Debian
# machine, and run tests under user-mode emulation (qemu-aarch64). Issue #19.
#
#   scripts/aarch64.sh install            # the toolchain, from Debian's packages (root)
#   scripts/aarch64.sh check              # cargo check of the whole workspace, every target
#   scripts/aarch64.sh build              # release `hearth` binary for aarch64
#   scripts/aarch64.sh test [CRATE...]    # cargo test --release of CRATEs under qemu
#                                         # (default: hearth-kernels)
#   scripts/aarch64.sh ci                 # what .ci/run does: install if needed, then the
#                                         # kernel tests at `neon` (QEMU_CPU=cortex-a72, no
#                                         # dotprod), up to `neon+dotprod` (cortex-a76, no
#                                         # i8mm) and up to `neon+i8mm` (QEMU_CPU=max), and
#                                         # SmolLM2's greedy tokens and logits vs llama.cpp,
#                                         # and an aarch64 worker in an x86 coordinator's
#                                         # cluster (crates/cli/tests/mixed_arch.rs)
#
# (Run `scripts/aarch64.sh install` once; it needs root and Debian's apt.)

set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

# Notes for maintainers. Why Debian's toolchain: this machine's rustup has no aarch64 standard library and cannot
# fetch one (only package registries are reachable), while Debian's `rustc-web` (Rust 1.96)
# comes with one (`libstd-rust-web-dev:arm64`). Cargo stays rustup's; `RUSTC` points it at
# Debian's compiler, with its own target directory (target/aarch64-cross) so the two
# compilers never share build outputs. qemu-aarch64 emulates NEON, dotprod and i8mm, and
# `is_aarch64_feature_detected!` sees them.
#
# Under qemu the arm64 binaries run against the arm64 glibc that `libstd-rust-web-dev:arm64`
# brings (libc6:arm64, in /lib/aarch64-linux-gnu), loader and libc from the same package. Not
# with `-L /usr/aarch64-linux-gnu`: that takes the loader from the cross package
# (libc6-arm64-cross, another glibc build) while /etc/ld.so.cache still hands it the multiarch
# libc.so.6, and the mismatched pair spins in the first pthread_create (glibc's stack cache
# list, read with another layout) — every test binary hung that way before.

target=aarch64-unknown-linux-gnu
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_DIR="$root/target/aarch64-cross"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# Against the multiarch arm64 glibc (see above): no -L.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64"

have_toolchain() {
  [[ -x /usr/bin/rustc ]] && command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null \
    && [[ -e /lib/ld-linux-aarch64.so.1 ]] \
    && /usr/bin/rustc --print sysroot >/dev/null 2>&1 \
    && [[ -d "$(/usr/bin/rustc --print sysroot)/lib/rustlib/$target" ]]
}

install() {
  if have_toolchain; then
    echo "aarch64 toolchain present: $(/usr/bin/rustc --version)"
    return
  fi
  [[ $(id -u) -eq 0 ]] || { echo "error: installing Debian packages needs root" >&2; exit 1; }
  dpkg --add-architecture arm64
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    rustc-web libstd-rust-web-dev:arm64 libc6:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
  echo "installed: $(/usr/bin/rustc --version), $(aarch64-linux-gnu-gcc --version | head -1), $(qemu-aarch64 --version | head -1)"
}

need_toolchain() {
  have_toolchain || { echo "error: no aarch64 toolchain; run: $0 install" >&2; exit 1; }
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  install) install ;;
  check)
    need_toolchain
    cargo check --workspace --all-targets --target "$target"
    ;;
  build)
    need_toolchain
    cargo build --release -p hearth --target "$target"
    echo "binary: $CARGO_TARGET_DIR/$target/release/hearth (run here with: $CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER BINARY)"
    ;;
  test)
    need_toolchain
    crates=("$@")
    [[ ${#crates[@]} -gt 0 ]] || crates=(hearth-kernels)
    args=()
    for c in "${crates[@]}"; do args+=(-p "$c"); done
    cargo test --release --target "$target" "${args[@]}"
    ;;
  ci)
    have_toolchain || install
    # Kernel tests at each NEON level: a CPU without dotprod, one with dotprod but no i8mm,
    # then one with both (every test checks each level the CPU has; every level must equal
    # the avx2 level's bits).
    for cpu in cortex-a72 cortex-a76 max; do
      echo "== hearth-kernels under qemu-aarch64 -cpu $cpu"
      QEMU_CPU=$cpu cargo test --release --target "$target" -p hearth-kernels --lib
    done
    # A whole model: SmolLM2 Q4_1's greedy tokens equal llama.cpp's (exactly: the NEON
    # kernels sum in the x86 SIMD order) and its logits within 0.05.
    echo "== SmolLM2 under qemu-aarch64 -cpu max"
    QEMU_CPU=max cargo test --release --target "$target" -p hearth-model --test smollm2 -- q4_1_greedy q4_1_logits
    # A mixed cluster: the aarch64 `hearth worker` under qemu with this machine's (x86-64,
    # rustup-built) coordinator, tensor parallel and ring, tokens equal to one node's.
    echo "== mixed cluster: aarch64 worker under qemu, x86-64 coordinator"
    cargo build --release -p hearth --target "$target"
    HEARTH_AARCH64_BIN="$CARGO_TARGET_DIR/$target/release/hearth" QEMU_CPU=max \
      env -u RUSTC -u CARGO_TARGET_DIR cargo test -p hearth --test mixed_arch -- --nocapture
    ;;
  -h | --help | help)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    ;;
  "")
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
  *) echo "error: unknown command $cmd (install, check, build, test, ci; see $0 --help)" >&2; exit 2 ;;
esac
