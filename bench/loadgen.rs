//! Load generator for `hearth serve`: N concurrent streaming clients send completions
//! with prompts of about P tokens and a fixed number of output tokens (`ignore_eos`),
//! and the run reports aggregate output tok/s, TTFT and TPOT percentiles.
//!
//! ```text
//! cargo run --release -p hearth-serve --example loadgen -- \
//!     --url http://127.0.0.1:8080 --clients 8 --requests 16 --prompt-tokens 64 --max-tokens 64
//! ```
//! Std only (raw HTTP/1.1 over TCP, chunked SSE), so the client costs little CPU next to
//! the server. TTFT: request sent → first token chunk. TPOT: (last − first token) /
//! (tokens − 1), per request. Aggregate tok/s: all output tokens / wall time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Opts {
    addr: String,
    clients: usize,
    requests: usize,
    prompt_tokens: usize,
    max_tokens: usize,
    api_key: Option<String>,
    json: bool,
}

fn parse() -> Result<Opts, String> {
    let mut o =
        Opts { addr: "127.0.0.1:8080".into(), clients: 1, requests: 0, prompt_tokens: 64, max_tokens: 64, api_key: None, json: false };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        let num = |v: String| v.parse::<usize>().map_err(|e| format!("{a}: {e}"));
        match a.as_str() {
            "--url" => o.addr = val()?.trim_start_matches("http://").trim_end_matches('/').to_string(),
            "--clients" => o.clients = num(val()?)?.max(1),
            "--requests" => o.requests = num(val()?)?,
            "--prompt-tokens" => o.prompt_tokens = num(val()?)?,
            "--max-tokens" => o.max_tokens = num(val()?)?.max(1),
            "--api-key" => o.api_key = Some(val()?),
            "--json" => o.json = true,
            "-h" | "--help" => {
                return Err("usage: loadgen [--url HOST:PORT] [--clients N] [--requests R (default 2N)] [--prompt-tokens P] \
                            [--max-tokens M] [--api-key KEY] [--json]"
                    .into())
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.requests == 0 {
        o.requests = 2 * o.clients;
    }
    Ok(o)
}

/// One request's measurements.
#[derive(Debug, Clone, Copy)]
struct Sample {
    ttft: f64,
    tpot: Option<f64>,
    tokens: usize,
}

/// A prompt of about `n` tokens, different for each request `i` (common words are mostly one token).
fn prompt(i: usize, n: usize) -> String {
    const WORDS: [&str; 16] = [
        "the", "river", "stone", "light", "house", "green", "music", "paper", "window", "cloud", "bread", "night", "garden", "train",
        "letter", "winter",
    ];
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n.max(1))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            WORDS[(x % 16) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn one(o: &Opts, i: usize) -> Result<Sample, String> {
    let body = format!(
        r#"{{"prompt":"{}","max_tokens":{},"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#,
        prompt(i, o.prompt_tokens),
        o.max_tokens
    );
    let auth = o.api_key.as_ref().map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let t0 = Instant::now();
    let mut s = TcpStream::connect(&o.addr).map_err(|e| format!("connect {}: {e}", o.addr))?;
    s.set_read_timeout(Some(Duration::from_secs(600))).map_err(|e| e.to_string())?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        o.addr,
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    if !line.starts_with("HTTP/1.1 200") {
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        return Err(format!("{} {}", line.trim(), rest.lines().last().unwrap_or("")));
    }
    loop {
        line.clear();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    // Chunked body → SSE lines.
    let (mut first, mut last, mut chunks, mut usage) = (None, t0, 0usize, None);
    let mut pending = Vec::new();
    'body: loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            break;
        }
        let n = usize::from_str_radix(line.trim(), 16).map_err(|e| format!("bad chunk size {line:?}: {e}"))?;
        if n == 0 {
            break;
        }
        let mut buf = vec![0; n + 2];
        r.read_exact(&mut buf).map_err(|e| e.to_string())?;
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let l: Vec<u8> = pending.drain(..=end).collect();
            let l = String::from_utf8_lossy(&l);
            let Some(data) = l.trim_end().strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                break 'body;
            }
            if let Some(u) = data.find("\"completion_tokens\":") {
                let digits: String = data[u + 20..].chars().take_while(char::is_ascii_digit).collect();
                usage = digits.parse().ok();
            } else if data.contains("\"finish_reason\":null") {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                chunks += 1;
            }
        }
    }
    let first = first.ok_or("no token arrived")?;
    let tokens = usage.unwrap_or(chunks);
    let ttft = (first - t0).as_secs_f64();
    let tpot = (tokens > 1).then(|| (last - first).as_secs_f64() / (tokens - 1) as f64);
    Ok(Sample { ttft, tpot, tokens })
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let next = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..o.clients {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= o.requests {
                    break;
                }
                match one(&o, i) {
                    Ok(s) => samples.lock().unwrap().push(s),
                    Err(e) => errors.lock().unwrap().push(e),
                }
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let s = samples.into_inner().unwrap();
    let errors = errors.into_inner().unwrap();
    let tokens: usize = s.iter().map(|x| x.tokens).sum();
    let mut ttft: Vec<f64> = s.iter().map(|x| x.ttft * 1e3).collect();
    let mut tpot: Vec<f64> = s.iter().filter_map(|x| x.tpot).map(|t| t * 1e3).collect();
    let (t50, t99, p50, p99) = (pct(&mut ttft, 50.0), pct(&mut ttft, 99.0), pct(&mut tpot, 50.0), pct(&mut tpot, 99.0));
    let agg = tokens as f64 / wall;
    if o.json {
        println!(
            r#"{{"clients":{},"requests":{},"errors":{},"prompt_tokens":{},"max_tokens":{},"wall_s":{wall:.3},"output_tokens":{tokens},"aggregate_tok_s":{agg:.2},"ttft_ms_p50":{t50:.1},"ttft_ms_p99":{t99:.1},"tpot_ms_p50":{p50:.2},"tpot_ms_p99":{p99:.2}}}"#,
            o.clients,
            s.len(),
            errors.len(),
            o.prompt_tokens,
            o.max_tokens
        );
    } else {
        println!(
            "{} clients, {} requests ({} failed), ~{} prompt + {} output tokens each: {tokens} tokens in {wall:.2} s = {agg:.1} tok/s aggregate; \
             TTFT p50 {t50:.0} ms p99 {t99:.0} ms; TPOT p50 {p50:.1} ms p99 {p99:.1} ms",
            o.clients,
            s.len(),
            errors.len(),
            o.prompt_tokens,
            o.max_tokens
        );
    }
    for e in errors.iter().take(5) {
        eprintln!("error: {e}");
    }
    if !errors.is_empty() {
        std::process::exit(1);
    }
}
