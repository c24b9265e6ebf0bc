//! `hearth`: run large language models on the CPUs you already own.
//!
//! This binary is the only place that formats for humans and uses `anyhow`; each
//! subcommand lives in `cmd/` and turns its flags into calls on the library crates.

mod budget;
mod cluster;
mod cmd;
mod common;
mod ring;
mod speculative;

use clap::{Parser, Subcommand};

/// Counts heap bytes for the memory reports (`hearth_memory::heap_stats`).
#[global_allocator]
static ALLOC: hearth_memory::CountingAlloc = hearth_memory::CountingAlloc;

#[derive(Parser)]
#[command(
    name = "hearth",
    version,
    about = "Run large language models (GGUF) on CPU-only machines",
    long_about = "Run large language models (GGUF) on CPU-only machines.\n\n\
        Weights stay quantized and memory-mapped; kernels compute directly on quantized blocks.\n\
        Without --model, the default model (SmolLM2-135M-Instruct Q4_1) is used; fetch it with\n\
        `scripts/fetch-models.sh`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(cmd::generate::Args),
    /// Interactive multi-turn chat using the model's chat template.
    Chat(cmd::chat::Args),
    /// Print the token ids of a text.
    Tokenize(cmd::tokenize::Args),
    /// Measure perplexity on a text file, as llama.cpp's llama-perplexity does.
    Perplexity(cmd::perplexity::Args),
    /// Print a GGUF file's metadata and tensor table.
    Inspect(cmd::inspect::Args),
    /// Measure prefill/decode speed as llama-bench does, with decode's weight bandwidth
    /// against the measured memory read bandwidth (or only the latter, with --membw).
    Bench(cmd::bench::Args),
    /// Write a random-weight GGUF of any architecture hearth runs (--arch) and a standard shape (tiny, 1b, 7b, 13b, 70b; the mixtures of experts 30b-a3b, a2.7b), for benchmarks and tests.
    Synth(cmd::synth::Args),
    /// Requantize a GGUF file to another type (f16, q8_0, q4_k, ...), as llama-quantize does.
    Quantize(cmd::quantize::Args),
    /// Predict peak memory and the decode speed bound from metadata; say whether it fits.
    Plan(cmd::plan::Args),
    /// Measure this device (cores, RAM, memory and disk bandwidth, matmul rates per type); cached.
    Profile(cmd::profile::Args),
    /// Serve a share of a model to a coordinator (`generate`, `chat`, `bench`, `serve` with
    /// --workers): a tensor-parallel share of every block, or whole layers of a pipelined ring.
    Worker(cmd::worker::Args),
    /// Serve the model over an OpenAI-compatible HTTP API, batching concurrent requests.
    ///
    /// Endpoints: /v1/chat/completions, /v1/completions (streaming with "stream": true),
    /// /v1/embeddings, /v1/models, /health (200 {"status":"ok"}; 503 with the error once
    /// three forward passes in a row have failed) and /metrics (Prometheus). See
    /// docs/SERVE.md.
    Serve(cmd::serve::Args),
}

/// Serve every heap block of 128 KiB or more (glibc's initial threshold) from its own
/// mapping, for the whole run. glibc raises the threshold each time such a block is
/// freed, so a long-lived process (`hearth worker`, `serve`) took its next context's
/// buffers from the arena instead, where calloc must clear them: a SmolLM2 ring worker's
/// peak went 73 MiB in its first session, 105 MiB in every later one. Prefill and
/// decode allocate no such blocks per token or per batch (minor page faults unchanged).
/// Elsewhere a no-op.
fn fixed_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocation policy; called at startup.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

fn main() {
    // Like C tools, die quietly on a closed pipe (`hearth … | head`) instead of
    // panicking in println!.
    #[cfg(unix)]
    // SAFETY: setting a signal disposition to its default at startup, before any threads.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::signal(libc::SIGBUS, on_sigbus as *const () as libc::sighandler_t);
    }
    fixed_mmap_threshold();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => cmd::generate::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Quantize(a) => cmd::quantize::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::Worker(a) => cmd::worker::run(a),
        Command::Serve(a) => cmd::serve::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// A read of the mapped model file failed (it was truncated under us, or the disk
/// failed): say so instead of dying with "Bus error". Only async-signal-safe calls.
#[cfg(unix)]
extern "C" fn on_sigbus(_: libc::c_int) {
    const MSG: &[u8] = b"\nerror: reading the memory-mapped model file failed (SIGBUS): it was truncated or became \
unreadable while hearth ran. With --mem-budget hearth reads through its own buffers and reports this as an error.\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::_exit(74);
    }
}

/// The error and its causes on one line, skipping a cause whose text the previous
/// message already ends with (typed errors often print their source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if msg.ends_with(&c) || msg.contains(&format!("{c}: ")) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&c);
    }
    msg.replace('\n', " ")
}
