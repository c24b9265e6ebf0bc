//! A mixed-architecture cluster (issue #19): an aarch64 `hearth worker` under
//! qemu-aarch64 and this (x86-64) machine's coordinator, over loopback. The wire
//! protocol is little-endian and fixed-width, and the NEON kernels compute the avx2
//! level's bits, so the tokens must be exactly the single-node ones.
//!
//! Needs `HEARTH_AARCH64_BIN`: an aarch64 `hearth` (`scripts/aarch64.sh build`;
//! `scripts/aarch64.sh ci` sets it). Without it the test says so and passes.

mod common;

use common::{model, ok, tokens, Worker};
use std::process::{Command, Stdio};

const PROMPT: &str = "The three primary colors are red, blue and";

/// The aarch64 worker: `qemu-aarch64 $HEARTH_AARCH64_BIN worker …` (against the
/// multiarch arm64 glibc: see scripts/aarch64.sh).
fn arm_worker(bin: &str) -> Worker {
    let mut cmd = Command::new("qemu-aarch64");
    cmd.arg(bin).env("HEARTH_CACHE_DIR", common::cache_dir()).env_remove("HEARTH_CLUSTER_KEY");
    Worker::spawn_cmd(cmd, &["--listen", "127.0.0.1:0", "-m", model().to_str().unwrap()], Stdio::null())
}

#[test]
fn an_aarch64_worker_gives_the_single_node_tokens_in_tensor_parallel_and_the_ring() {
    let Ok(bin) = std::env::var("HEARTH_AARCH64_BIN") else {
        eprintln!("skipped: set HEARTH_AARCH64_BIN to an aarch64 hearth (scripts/aarch64.sh build)");
        return;
    };
    let generate = |extra: &[&str]| common::generate_json(PROMPT, extra);
    let single = tokens(&ok(generate(&[])));
    let arm = arm_worker(&bin);
    let x86 = Worker::start(&model(), &[]);
    // Tensor parallel, gather schedule (the single node's float order).
    assert_eq!(tokens(&ok(generate(&["--workers", &arm.addr, "--tp-schedule", "gather"]))), single, "tensor parallel");
    // The sum schedule reorders the blocks' sums: an ARM worker and an x86 one must agree.
    let sum_arm = tokens(&ok(generate(&["--workers", &arm.addr, "--tp-schedule", "sum"])));
    let sum_x86 = tokens(&ok(generate(&["--workers", &x86.addr, "--tp-schedule", "sum"])));
    assert_eq!(sum_arm, sum_x86, "sum schedule: aarch64 worker vs x86 worker");
    // The pipelined ring: this machine, the ARM worker and an x86 one, 3 rounds of windows.
    let workers = format!("{},{}", arm.addr, x86.addr);
    for windows in ["15,15,0", "5,5,5"] {
        let out = ok(generate(&["--workers", &workers, "--parallel", "ring", "--layer-window", windows]));
        assert_eq!(tokens(&out), single, "ring, windows {windows}");
    }
}
