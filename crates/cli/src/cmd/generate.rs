//! `hearth generate`: prefill a prompt, stream the completion to stdout, summary to stderr.

use crate::budget::{io_json, io_line};
use crate::common::{print_out, MemoryReport, ModelArgs};
use anyhow::{Context as _, Result};
use hearth_chat::Message;
use hearth_model::{generate_speculative, sampler::SamplerConfig, Model};
use hearth_tokenizer::StreamDecoder;
use std::io::Write;

/// Sampling flags (shared with `chat`). Defaults are llama.cpp's.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy (argmax)
    #[arg(long, visible_alias = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off)
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability mass reaches P (1.0 = off; 0 = the most likely token only)
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P × the most likely one (0 = off)
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens (prompt and output): positive logits divided by
    /// this factor, negative ones multiplied (1.0 = off)
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every token seen in the last --repeat-last-n tokens, once (OpenAI's
    /// presence_penalty; 0 = off, negative encourages repeats)
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this from a token's logit once per time it was seen in the last --repeat-last-n tokens (OpenAI's
    /// frequency_penalty; 0 = off)
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// How many trailing tokens the penalties look at (0 = off)
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed; the same seed and settings reproduce a run (-1: random, as llama.cpp) [default: random]
    #[arg(long, allow_negative_numbers = true, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// Add BIAS to token ID's logit, written as llama.cpp takes it: 15043+1, 15043-0.5,
    /// 15043-inf (never this token) (repeatable)
    #[arg(long, short = 'l', value_name = "ID(+|-)BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
}

/// A seed, or -1 for a random one.
fn parse_seed(s: &str) -> Result<u64, String> {
    match s.trim() {
        "-1" => Ok(rand::random()),
        t => t.parse::<u64>().map_err(|_| format!("{s:?} is not a seed: give a whole number >= 0, or -1 for a random one")),
    }
}

/// A stop string with `\n`, `\t` and `\\` unescaped, so a shell can pass a newline.
fn parse_stop(s: &str) -> Result<String, String> {
    let (mut out, mut chars) = (String::new(), s.chars());
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            other => out.extend(std::iter::once('\\').chain(other)),
        }
    }
    if out.is_empty() {
        return Err("a stop string cannot be empty".into());
    }
    Ok(out)
}

/// `ID+BIAS` / `ID-BIAS` (`inf` allowed) as llama.cpp's `--logit-bias` takes it.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let s = s.trim();
    let split = s.find(['+', '-']).ok_or_else(|| format!("{s:?}: expected ID+BIAS or ID-BIAS, e.g. 15043+1 or 15043-inf"))?;
    let id = s[..split].trim().parse::<u32>().map_err(|_| format!("{s:?}: {:?} is not a token id", &s[..split]))?;
    let bias = s[split..].trim().parse::<f32>().map_err(|_| format!("{s:?}: {:?} is not a number (or -inf)", &s[split..]))?;
    if bias.is_nan() || bias == f32::INFINITY {
        return Err(format!("{s:?}: the bias must be a number or -inf"));
    }
    Ok((id, bias))
}

impl SamplingArgs {
    /// Checked sampler settings (`--logit-bias` ids against a vocabulary of `n_vocab`).
    pub fn config(&self, n_vocab: usize) -> Result<SamplerConfig> {
        let bad = |flag: &str, v: f32, want: &str| anyhow::anyhow!("--{flag} {v} is out of range: it must be {want}");
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(bad("temperature", self.temperature, "a number >= 0 (0 = greedy)"));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(bad("top-p", self.top_p, "in [0, 1] (1 = off, 0 = the most likely token only)"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min-p", self.min_p, "in [0, 1] (0 = off)"));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(bad("repeat-penalty", self.repeat_penalty, "a number > 0 (1 = off)"));
        }
        for (flag, v) in [("presence-penalty", self.presence_penalty), ("frequency-penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(bad(flag, v, "in [-2, 2] (0 = off)"));
            }
        }
        if let Some((id, _)) = self.logit_bias.iter().find(|(id, _)| *id as usize >= n_vocab) {
            anyhow::bail!("--logit-bias: token {id} is outside the vocabulary (n_vocab {n_vocab})");
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        Ok(SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
            logit_bias: self.logit_bias.clone(),
        })
    }
}

/// Flags of `hearth generate`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text
    #[arg(short, long, required_unless_present = "prompt_file", conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file (`-` for stdin)
    #[arg(short = 'f', long, value_name = "PATH")]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Keep generating past end-of-generation tokens (for benchmarks)
    #[arg(long)]
    pub ignore_eos: bool,
    /// Maximum number of tokens to generate
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Stop when the output contains TEXT, which is not printed (repeatable; as the API's
    /// `stop`). Escapes \n and \t are read as a newline and a tab
    #[arg(long, value_name = "TEXT", value_parser = parse_stop)]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Wrap the prompt as a user message in the model's chat template
    #[arg(long)]
    pub chat: bool,
    /// Print one JSON object (token ids, text, timings, peak RSS) instead of streaming text
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub spec: crate::speculative::SpecArgs,
}

/// Render `messages` with the model's chat template.
pub fn chat_prompt(model: &Model, messages: &[Message]) -> Result<Vec<u32>> {
    if model.chat_template().is_none() {
        anyhow::bail!("this model has no chat template (tokenizer.chat_template): `hearth chat` and --chat need one; run `hearth generate` without --chat on plain text");
    }
    let tmpl = hearth_serve::chat_template(model).map_err(anyhow::Error::msg)?;
    hearth_serve::chat_prompt(&model.tokenizer, &tmpl, messages).map_err(anyhow::Error::msg)
}

pub fn run(a: Args) -> Result<()> {
    // The prompt first: a file that cannot be read is reported before the model loads.
    let text = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => crate::common::read_text(f)?,
        (None, None) => unreachable!("clap requires --prompt or --prompt-file"),
    };
    let model = a.model.load()?;
    let ids = if a.chat {
        chat_prompt(&model, &[Message { role: "user".into(), content: text }])?
    } else {
        model.tokenizer.encode(&text, true, true)
    };
    if ids.is_empty() {
        anyhow::bail!("the prompt is empty: give some text with --prompt or in --prompt-file");
    }
    let crate::common::Prepared { mut ctx, window, cluster } = a.model.prepare(&model, 2048, false)?;
    let comm0 = cluster.as_ref().map(|c| c.snapshot());
    let mut comm1 = None;
    let mut nodes1 = None;
    if ids.len() > ctx.n_ctx() {
        anyhow::bail!("the prompt has {} tokens, more than the context size {} (--ctx-size)", ids.len(), ctx.n_ctx());
    }
    let mut dec = StreamDecoder::new(&model.tokenizer);
    let mut stdout = std::io::stdout().lock();
    let json = a.json;
    let tok = &model.tokenizer;
    let sampler = a.sampling.config(model.config.n_vocab)?;
    let mut spec = a.spec.speculation(&model, ctx.n_ctx(), ctx.n_batch(), ctx.n_threads())?;
    if let (Some(p), Some(_)) = (&a.spec.draft_model, &a.model.budget.mem_budget) {
        eprintln!(
            "warning: the draft model {} is outside --mem-budget's plan: its mapped weights, KV cache and buffers all add to the RSS",
            p.display()
        );
    }
    let (mut write_err, mut streamed) = (None, false);
    // With stop strings, text is released only once it cannot be the start of one.
    let mut stop = (!a.stop.is_empty()).then(|| hearth_serve::stop::StopText::new(a.stop.clone()));
    let (mut released, mut stopped) = (String::new(), false);
    let out = generate_speculative(&mut ctx, &ids, a.max_tokens, &sampler, !a.ignore_eos, spec.as_mut(), |id| {
        // The first token comes right after prefill: split the group's counters there.
        if comm1.is_none() {
            comm1 = cluster.as_ref().map(|c| c.snapshot());
            nodes1 = cluster.as_ref().and_then(|c| c.all_stats());
        }
        if (!json || stop.is_some()) && !tok.is_eog(id) {
            let mut s = dec.push(id);
            if let Some(st) = stop.as_mut() {
                (s, stopped) = st.push(&s);
                released.push_str(&s);
            }
            if !json {
                streamed |= !s.is_empty();
                if let Err(e) = stdout.write_all(s.as_bytes()).and_then(|_| stdout.flush()) {
                    write_err = Some(e);
                    return false;
                }
            }
        }
        !stopped
    });
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            // End the streamed text's line: the error printed right after it ("…but Elerror: …").
            if streamed {
                let _ = writeln!(stdout);
            }
            return Err(e.into());
        }
    };
    if let Some(e) = write_err {
        return Err(e).context("writing to stdout");
    }
    // What a stop string held back when none matched after all.
    let held = match stop.as_mut() {
        Some(st) if !stopped => st.finish(),
        _ => String::new(),
    };
    released.push_str(&held);
    let stop_reason = if stopped { "StopString".to_string() } else { format!("{:?}", out.stop) };
    let t = &out.timings;
    let mem = MemoryReport::now(&ctx);
    // Per node over decode: this node's and every worker's counters after vs before.
    let nodes2 = match (&cluster, &nodes1) {
        (Some(run), Some(_)) if t.decode_tokens > 0 => run.all_stats(),
        _ => None,
    };
    let (decode_s, n_dec) = (t.decode_ms / 1e3, t.decode_tokens);
    let decode_nodes = match (&cluster, &nodes1, &nodes2) {
        (Some(run), Some(n1), Some(n2)) if run.ring().is_none() => Some(crate::cluster::node_rows(run, n1, n2, decode_s, n_dec)),
        _ => None,
    };
    let decode_ring = match (cluster.as_ref().and_then(|c| c.ring()), &nodes1, &nodes2) {
        (Some(r), Some(n1), Some(n2)) => Some(crate::ring::ring_rows(r, n1, n2, decode_s, n_dec, t.decode_io.wait_secs)),
        _ => None,
    };
    if json {
        let text_ids: Vec<u32> = out.tokens.iter().copied().filter(|&i| !tok.is_eog(i)).collect();
        let v = serde_json::json!({
            "prompt_tokens": ids,
            "completion_tokens": out.tokens,
            "text": if stop.is_some() { released } else { StreamDecoder::text_of(tok, &text_ids) },
            "stop_reason": stop_reason,
            "timings": {
                "ttft_ms": (!out.tokens.is_empty()).then_some(t.ttft_ms),
                "prefill_ms": t.prefill_ms,
                "prefill_tok_s": t.prefill_tok_s(),
                "decode_ms": t.decode_ms,
                "decode_tok_s": t.decode_tok_s(),
            },
            "peak_rss_bytes": mem.proc.peak_rss_bytes,
            "memory": mem.json(),
            "seed": sampler.seed,
            "speculative": out.speculative.as_ref().map(|s| crate::speculative::stats_json(&a.spec, s)),
            "ring": decode_ring,
            "tensor_parallel": cluster.as_ref().filter(|c| c.ring().is_none()).map(|c| {
                let now = c.snapshot();
                serde_json::json!({
                    "nodes": c.n_nodes, "wire": c.wire.name(), "passes": now.passes, "allreduces": now.allreduces,
                    "bytes_sent": now.total.bytes_sent, "bytes_received": now.total.bytes_received,
                    "comm_secs": now.total.seconds, "allreduce_secs": now.allreduce_secs, "step_secs": now.step_secs,
                    "decode_nodes": decode_nodes,
                })
            }),
            "window": window.as_ref().map(|w| serde_json::json!({
                "plan": crate::budget::plan_json(w),
                "prefill_io": io_json(&t.prefill_io),
                "decode_io": io_json(&t.decode_io),
            })),
        });
        drop(stdout);
        print_out(&format!("{v}\n"))?;
    } else {
        dec.finish(); // an incomplete last character is not printed as U+FFFD
        write!(stdout, "{held}").and_then(|_| writeln!(stdout)).context("writing to stdout")?;
        // A rate needs two tokens: the first comes with the prefill (TTFT).
        let decode = match out.tokens.len() {
            n @ 0..=1 => hearth_engine::plural(n, "token"),
            n => format!("{n} tokens at {:.1} tok/s", t.decode_tok_s()),
        };
        // No token, no time to first token (-n 0).
        let ttft = if out.tokens.is_empty() { String::new() } else { format!(", TTFT {:.1} ms", t.ttft_ms) };
        // The seed reproduces a sampled run (llama.cpp prints it too); greedy needs none.
        let seed = if sampler.temperature > 0.0 { format!(", seed {}", sampler.seed) } else { String::new() };
        eprintln!(
            "\nprompt {}, prefill {:.1} tok/s, decode {decode}{ttft} ({}{seed}, stop: {})\n\
             {}",
            hearth_engine::plural(t.prompt_tokens, "token"),
            t.prefill_tok_s(),
            hearth_engine::plural(a.model.threads(), "thread"),
            stop_reason,
            mem.human(),
        );
        if let Some(s) = &out.speculative {
            eprintln!("{}", crate::speculative::stats_line(&a.spec, s));
        }
        if let Some(v) = &decode_ring {
            eprintln!("{}", crate::ring::ring_lines(v));
        } else if let (Some(run), Some(c0)) = (&cluster, &comm0) {
            let (c1, c2) = (comm1.clone().unwrap_or_else(|| run.snapshot()), run.snapshot());
            eprintln!("{}", crate::cluster::comm_line("prefill", run.n_nodes, c0, &c1, t.prefill_ms / 1e3, t.prompt_tokens));
            if t.decode_tokens > 0 {
                eprintln!("{}", crate::cluster::comm_line("decode", run.n_nodes, &c1, &c2, t.decode_ms / 1e3, t.decode_tokens));
            }
            if let Some(rows) = &decode_nodes {
                eprintln!("{}", crate::cluster::node_lines("decode", rows));
            }
        }
        if window.is_some() {
            let passes = t.prompt_tokens.div_ceil(ctx.n_batch());
            eprintln!("{}", io_line("prefill", &t.prefill_io, t.prefill_ms / 1e3, passes));
            if t.decode_tokens > 0 {
                eprintln!("{}", io_line("decode", &t.decode_io, t.decode_ms / 1e3, t.decode_tokens));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_stop;

    #[test]
    fn stop_strings_take_newline_and_tab_escapes() {
        assert_eq!(parse_stop("\\n\\n").unwrap(), "\n\n");
        assert_eq!(parse_stop("User:\\t").unwrap(), "User:\t");
        assert_eq!(parse_stop("a\\\\n").unwrap(), "a\\n");
        assert_eq!(parse_stop("\\x").unwrap(), "\\x");
        assert_eq!(parse_stop("end\\").unwrap(), "end\\");
        assert!(parse_stop("").is_err());
    }
}
