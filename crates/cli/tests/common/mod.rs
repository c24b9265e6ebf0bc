//! Helpers shared by the CLI integration tests.
#![allow(dead_code)] // each test file uses a subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The default model (fetched by scripts/fetch-models.sh, as README's test command does).
pub fn model() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}

/// Run the `hearth` binary with `args` (and no `$HEARTH_MODEL`).
pub fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth")).args(args).env_remove("HEARTH_MODEL").output().unwrap()
}

/// A successful run's stdout as JSON.
pub fn ok(out: Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// A clean failure: exit 1 (not a panic's 101), one line on stderr starting with `error:`
/// and containing `want` (case-insensitive).
pub fn assert_clean_error(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "panicked: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error:"), "{err}");
    assert!(err.to_lowercase().contains(&want.to_lowercase()), "expected {want:?} in {err}");
}
