//! `--cache-type f32|f16|q8_0`: generate allocates exactly the KV bytes `hearth plan`
//! predicts for each type and reports the type; perplexity and bench accept the flag; an
//! unknown type is a usage error that lists the valid ones.

mod common;
use common::*;

#[test]
fn plan_and_generate_agree_per_cache_type() {
    let m = model();
    let m = m.to_str().unwrap();
    let mut sizes = Vec::new();
    for ty in ["f32", "f16", "q8_0"] {
        let g = ok(hearth(&["generate", "-m", m, "-c", "256", "-t", "2", "-p", "Hello", "-n", "2", "--temperature", "0",
            "--cache-type", ty, "--json"]));
        let p = ok(hearth(&["plan", "-m", m, "-c", "256", "-t", "2", "--membw", "10", "--cache-type", ty, "--json"]));
        assert_eq!(g["memory"]["cache_type"], ty);
        assert_eq!(p["cache_type"], ty);
        assert_eq!(p["kv_cache_bytes"], g["memory"]["kv_cache_bytes"], "{ty}");
        sizes.push(p["kv_cache_bytes"].as_u64().unwrap());
    }
    // SmolLM2: 30 layers, kv_dim 192: 4, 2 and 34/32 bytes per value.
    assert_eq!(sizes, [2 * 30 * 256 * 192 * 4, 2 * 30 * 256 * 192 * 2, 2 * 30 * 256 * 6 * 34]);
    let human = hearth(&["plan", "-m", m, "-c", "256", "--membw", "10", "--cache-type", "q8_0"]);
    let s = String::from_utf8_lossy(&human.stdout);
    assert!(human.status.success() && s.contains("kv_dim / 32 · 34 bytes (q8_0)"), "{s}");
}

#[test]
fn other_commands_accept_it_and_unknown_types_are_rejected() {
    let m = model();
    let m = m.to_str().unwrap();
    let b = ok(hearth(&["bench", "-m", m, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--cache-type", "q8_0", "--json"]));
    assert_eq!(b[0]["type_k"], "q8_0");
    assert_eq!(b[0]["type_v"], "q8_0");
    for cmd in ["generate", "perplexity", "chat", "bench", "plan"] {
        let o = hearth(&[cmd, "-m", m, "--cache-type", "q4_0"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && !err.contains("panicked"), "{cmd}: {err}");
        assert!(err.contains("invalid value 'q4_0'") && err.contains("f32") && err.contains("q8_0"), "{cmd}: {err}");
    }
}
