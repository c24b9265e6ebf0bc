//! Helpers shared by the CLI integration tests.
#![allow(dead_code)] // each test file uses a subset

pub mod server;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The model's SHA-256 in hex (`sha256sum`), as a worker's `--model-sha256` takes it.
pub fn model_sha(m: &Path) -> String {
    let out = Command::new("sha256sum").arg(m).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

/// The default model (fetched by scripts/fetch-models.sh, as README's test command does).
pub fn model() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}

/// Gemma 3 270M Q4_K_M (fetched by scripts/fetch-models.sh too).
pub fn gemma3() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}

/// Run the `hearth` binary with `args` (and no `$HEARTH_MODEL`).
pub fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth")).args(args).env_remove("HEARTH_MODEL").output().unwrap()
}

/// Run the `hearth` binary with `args` and the file `stdin` as its standard input.
pub fn hearth_stdin(args: &[&str], stdin: &Path) -> Output {
    let input = std::fs::File::open(stdin).unwrap_or_else(|e| panic!("{}: {e}", stdin.display()));
    Command::new(env!("CARGO_BIN_EXE_hearth")).args(args).env_remove("HEARTH_MODEL").stdin(input).output().unwrap()
}

/// Wait up to 10 s for `child` to exit; `what` says what should have stopped it.
pub fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "still running 10 s after {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// `cmd` with the tests' cache directory and no cluster key from the environment.
pub fn isolated(cmd: &mut Command) -> &mut Command {
    cmd.env("HEARTH_CACHE_DIR", cache_dir()).env_remove("HEARTH_CLUSTER_KEY")
}

/// A `hearth worker` on an ephemeral loopback port, killed when dropped.
pub struct Worker {
    pub child: Child,
    pub addr: String,
}

pub fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("hearth-cache")
}

impl Worker {
    /// `hearth worker -m model --listen 127.0.0.1:0 -t 1 extra…`.
    pub fn start(model: &Path, extra: &[&str]) -> Worker {
        Self::spawn(&[&["--listen", "127.0.0.1:0", "-m", model.to_str().unwrap()], extra].concat(), Stdio::null())
    }

    /// `hearth worker -t 1 args…` (`-t 1` unless `args` has a `-t`), once it has printed where it listens.
    pub fn spawn(args: &[&str], stderr: Stdio) -> Worker {
        Self::spawn_cmd(Command::new(env!("CARGO_BIN_EXE_hearth")), args, stderr)
    }

    /// [`Worker::spawn`] with another `hearth` command line (e.g. another
    /// architecture's binary under an emulator).
    pub fn spawn_cmd(mut cmd: Command, args: &[&str], stderr: Stdio) -> Worker {
        let threads: &[&str] = if args.contains(&"-t") { &[] } else { &["-t", "1"] };
        let mut child = isolated(cmd.arg("worker").args(threads).args(args)).stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .strip_prefix("hearth worker listening on ")
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Worker { child, addr }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The figures of the `profile:` line (`HEARTH_PROFILE=1`) in `stderr`: the total, the
/// ms of each of `ops`, of "waiting for weights" (0 when absent), and of the rest.
pub fn profile_figures(stderr: &str, ops: &[&str]) -> (f64, Vec<f64>, f64, f64) {
    let line = stderr.lines().find(|l| l.starts_with("profile: ")).unwrap_or_else(|| panic!("no profile line: {stderr}"));
    let ms = |after: &str| -> Option<f64> {
        let at = line.find(after)? + after.len();
        Some(line[at..].trim_start().split(' ').next().unwrap().parse().unwrap_or_else(|e| panic!("{after:?}: {e}: {line}")))
    };
    let need = |after: &str| ms(after).unwrap_or_else(|| panic!("{after:?} not in {line}"));
    let total = ms("threads:").unwrap_or_else(|| need("thread:"));
    let ops = ops.iter().map(|op| need(&format!("; {op}"))).collect();
    (total, ops, ms("; waiting for weights").unwrap_or(0.0), need("outside the ops)"))
}

/// `completion_tokens` of a `generate --json` output.
pub fn tokens(v: &serde_json::Value) -> Vec<u64> {
    v["completion_tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

/// `--workers` for these workers.
pub fn addrs(ws: &[&Worker]) -> String {
    ws.iter().map(|w| w.addr.as_str()).collect::<Vec<_>>().join(",")
}

/// Start `hearth generate ARGS` (a long greedy run), wait until tokens stream, kill
/// `victim`, and wait for the coordinator to end (failing the test if it hangs 10 s).
/// Returns its exit code, how long it took after the kill, and its stderr.
pub fn kill_mid_generation(args: &[&str], victim: &mut Worker) -> (Option<i32>, Duration, String) {
    interrupt_mid_generation(args, || victim.child.kill().unwrap())
}

/// [`kill_mid_generation`] with any interruption `act` (e.g. stopping a worker).
pub fn interrupt_mid_generation(args: &[&str], act: impl FnOnce()) -> (Option<i32>, Duration, String) {
    let (mut coord, stdout) = started_generation(args, Stdio::piped());
    act();
    let killed = Instant::now();
    drain(stdout);
    let status = loop {
        if let Some(s) = coord.try_wait().unwrap() {
            break s;
        }
        assert!(killed.elapsed() < Duration::from_secs(10), "the coordinator hangs after a worker died");
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = killed.elapsed();
    let mut err = String::new();
    coord.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status.code(), took, err)
}

/// Start `hearth ARGS` (a long generation) with the tests' cache directory and no cluster
/// key, and return once its first 40 bytes of text are out: the child, with `stderr` as
/// given, and its stdout (read on, e.g. by [`drain`], so the child never blocks on it).
pub fn started_generation(args: &[&str], stderr: Stdio) -> (Child, ChildStdout) {
    let mut coord = isolated(Command::new(env!("CARGO_BIN_EXE_hearth")).args(args)).stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
    let mut stdout = coord.stdout.take().unwrap();
    let (mut got, mut buf) = (0, [0u8; 256]);
    while got < 40 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "the generation ended before it streamed 40 bytes");
        got += n;
    }
    (coord, stdout)
}

/// Read `stdout` to its end on a thread of its own.
pub fn drain(mut stdout: ChildStdout) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while stdout.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
    });
}

/// `hearth generate --json` of 20 greedy tokens of `prompt` on one thread with `extra`
/// flags (workers, layouts), with the tests' cache directory and no cluster key.
pub fn generate_json(prompt: &str, extra: &[&str]) -> Output {
    let m = model();
    let args = ["-m", m.to_str().unwrap(), "-p", prompt, "-n", "20", "--temperature", "0", "-t", "1", "--json"];
    generate_cmd(&[&args[..], extra].concat())
}

/// `hearth generate ARGS` with the tests' cache directory, no `$HEARTH_MODEL` and no
/// cluster key.
pub fn generate_cmd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .arg("generate")
        .args(args)
        .env("HEARTH_CACHE_DIR", cache_dir())
        .env_remove("HEARTH_MODEL")
        .env_remove("HEARTH_CLUSTER_KEY")
        .output()
        .unwrap()
}

/// A run interrupted by [`kill_mid_generation`] failed cleanly within 5 s, naming node
/// `node` and its address `addr`.
pub fn assert_failed_naming(out: &(Option<i32>, Duration, String), node: usize, addr: &str) {
    let (status, took, err) = out;
    assert_eq!(*status, Some(1), "{err}");
    assert!(*took < Duration::from_secs(5), "took {took:?}");
    assert!(err.contains(&format!("node {node}")) && err.contains(addr), "the error must name node {node} ({addr}): {err}");
    assert!(!err.contains("panicked"), "{err}");
}
