//! `hearth profile --quick --json`: sane figures, every requested type at every thread
//! count; a second run loads the cache (same profile), `--refresh` measures again.

mod common;
use common::*;

use std::process::{Command, Output};

/// `hearth profile --quick ARGS` with its cache in `cache`.
fn run(cache: &std::path::Path, args: &[&str]) -> Output {
    let mut all = vec!["profile", "--quick"];
    all.extend_from_slice(args);
    Command::new(env!("CARGO_BIN_EXE_hearth")).args(&all).env("HEARTH_CACHE_DIR", cache).env_remove("HEARTH_MODEL").output().unwrap()
}

/// `--json -t 1,2` on the default model, plus `extra`.
fn profile(cache: &std::path::Path, extra: &[&str]) -> Output {
    let m = model();
    let mut args = vec!["--json", "-t", "1,2", "-m", m.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(cache, &args)
}

fn cache_dir(name: &str) -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn check(p: &serde_json::Value, types: &[&str]) {
    let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {p}"));
    assert!(f("cores") >= 1.0 && !p["simd"].as_str().unwrap().is_empty() && !p["name"].as_str().unwrap().is_empty());
    let (total, avail) = (p["ram_total_bytes"].as_u64().unwrap(), p["ram_available_bytes"].as_u64().unwrap());
    assert!(total > 0 && avail > 0 && avail <= total, "{total} {avail}");
    assert!(p["swap_total_bytes"].is_u64());
    for k in ["mem_read_gbps", "disk_seq_read_gbps", "disk_rand_read_gbps"] {
        assert!(f(k) > 0.0 && f(k).is_finite(), "{k} = {}", f(k));
    }
    let rates = p["matmul"].as_array().unwrap();
    for ty in types {
        for t in [1, 2] {
            let r = rates.iter().find(|r| r["ty"] == *ty && r["threads"] == t).unwrap_or_else(|| panic!("{ty} t={t} missing: {p}"));
            for k in ["decode_gbps", "prefill_gflops"] {
                let v = r[k].as_f64().unwrap();
                assert!(v > 0.0 && v.is_finite(), "{ty} t={t} {k} = {v}");
            }
        }
    }
    assert_eq!(rates.len(), types.len() * 2);
    assert_eq!(p["links"].as_array().unwrap().len(), 0);
}

#[test]
fn quick_profile_is_sane_and_cached() {
    let cache = cache_dir("profile-cache");
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    let first = profile(&cache, &[]);
    assert!(stderr(&first).contains("measured"), "{}", stderr(&first));
    let a = ok(first);
    check(&a, &["q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "f16"]);
    assert!(cache.join("profile.json").is_file());

    let second = profile(&cache, &[]);
    assert!(stderr(&second).contains("loaded from cache"), "{}", stderr(&second));
    let mut b = ok(second);
    // Available RAM is read afresh; everything else comes from the cache.
    b["ram_available_bytes"] = a["ram_available_bytes"].clone();
    assert_eq!(a, b);

    // Other types are another fingerprint; --refresh measures again.
    let other = profile(&cache, &["--types", "q8_0"]);
    assert!(stderr(&other).contains("measured"), "{}", stderr(&other));
    check(&ok(other), &["q8_0"]);
    let refreshed = profile(&cache, &["--refresh"]);
    assert!(stderr(&refreshed).contains("measured"), "{}", stderr(&refreshed));
    check(&ok(refreshed), &["q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "f16"]);
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn table_and_bad_type() {
    let cache = cache_dir("profile-table");
    let out = run(&cache, &["-t", "1", "--types", "q4_0", "-m", model().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["cpu", "ram", "memory", "disk", "| q4_0 | 1 |"] {
        assert!(text.contains(want), "{want:?} missing: {text}");
    }
    assert_clean_error(&run(&cache, &["--types", "q9_9"]), "unknown weight type");
    let _ = std::fs::remove_dir_all(&cache);
}
