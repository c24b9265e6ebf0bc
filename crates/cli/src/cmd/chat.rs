//! `hearth chat`: interactive multi-turn chat. The KV cache is kept across turns: each
//! turn re-renders the conversation and evaluates only the tokens past the common prefix.

use super::generate::{chat_prompt, SamplingArgs};
use crate::common::ModelArgs;
use anyhow::{Context as _, Result};
use hearth_chat::Message;
use hearth_model::{generate, StopReason};
use hearth_tokenizer::StreamDecoder;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Flags of `hearth chat`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message to start the conversation with
    #[arg(long)]
    pub system: Option<String>,
    /// Maximum tokens per reply
    #[arg(short = 'n', long, default_value_t = 512)]
    pub max_tokens: usize,
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load()?;
    // With --workers: the group, re-formed without a worker that fails.
    let mut opts = a.model.engine_options(&model, 2048, false)?;
    let mut ctx = hearth_engine::prepare(&model, &opts)?.ctx;
    let sampler = a.sampling.config(model.config.n_vocab)?;
    let mut messages: Vec<Message> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message { role: "system".into(), content: s.clone() });
    }
    // Fail now, not after the first message, if the template cannot render.
    chat_prompt(&model, &[Message { role: "user".into(), content: "hi".into() }])?;
    // Tokens whose K/V are in ctx.
    let mut cached: Vec<u32> = Vec::new();
    // Ctrl-C while a reply streams stops that reply; at the prompt it quits.
    let replying = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (replying, interrupted) = (replying.clone(), interrupted.clone());
        ctrlc::set_handler(move || {
            if replying.load(Ordering::SeqCst) {
                interrupted.store(true, Ordering::SeqCst);
            } else {
                eprintln!();
                std::process::exit(130);
            }
        })
        .context("installing the Ctrl-C handler")?;
    }
    eprintln!("hearth chat — type a message, Enter to send; Ctrl-C stops a reply; /reset starts over; /exit or Ctrl-D quits.");
    let mut stdin = std::io::stdin().lock();
    let (mut sent, mut failed) = (0usize, 0usize);
    let mut raw = Vec::new();
    loop {
        eprint!("> ");
        raw.clear();
        if stdin.read_until(b'\n', &mut raw).context("reading stdin")? == 0 {
            break;
        }
        // A line that is not UTF-8 is sent with U+FFFD in place of its bad bytes (the
        // session goes on).
        if std::str::from_utf8(&raw).is_err() {
            eprintln!("[the line is not valid UTF-8: its bad bytes are sent as U+FFFD]");
        }
        let line = String::from_utf8_lossy(&raw).into_owned();
        let line = line.strip_suffix('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).unwrap_or(&line).to_string();
        let command = line.trim();
        match command {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/help" | "/?" => {
                eprintln!("/reset: forget the conversation · /exit: quit · //text sends \"/text\" · anything else is sent to the model");
                continue;
            }
            "/reset" | "/clear" => {
                messages.retain(|m| m.role == "system");
                cached.clear();
                ctx.truncate(0);
                continue;
            }
            c if c.starts_with('/') && !c.starts_with("//") => {
                eprintln!("[unknown command {c}: /help lists them; start a message with // to send one beginning with /]");
                continue;
            }
            _ => {}
        }
        let line = match command.strip_prefix("//") {
            Some(rest) => format!("/{rest}"),
            None => line,
        };
        sent += 1;
        messages.push(Message { role: "user".into(), content: line });
        let ids = chat_prompt(&model, &messages)?;
        let common = cached.iter().zip(&ids).take_while(|(a, b)| a == b).count().min(ids.len() - 1);
        // Keeps the shared prefix, or nothing where a sliding-window cache cannot go back.
        let common = ctx.truncate(common);
        let mut dec = StreamDecoder::new(&model.tokenizer);
        let mut out = std::io::stdout().lock();
        let tok = &model.tokenizer;
        interrupted.store(false, Ordering::SeqCst);
        replying.store(true, Ordering::SeqCst);
        let result = generate(&mut ctx, &ids[common..], a.max_tokens, &sampler, |id| {
            if !tok.is_eog(id) {
                let _ = out.write_all(dec.push(id).as_bytes());
                let _ = out.flush();
            }
            !interrupted.load(Ordering::SeqCst)
        });
        replying.store(false, Ordering::SeqCst);
        let g = match result {
            Ok(g) => g,
            Err(e) => {
                // The reply may have been cut mid-line.
                eprintln!("\nerror: {e}");
                if let (Some(node), Some(group)) = (hearth_engine::failed_worker(&e), opts.cluster.as_ref()) {
                    // Re-split over the nodes left; the conversation is evaluated again
                    // from the start on the next message.
                    let rest = opts.without_node(node);
                    eprintln!(
                        "[dropping node {node} ({}); re-splitting over {} node(s) — send your message again]",
                        group.workers.get(node - 1).map_or("?", String::as_str),
                        rest.cluster.as_ref().map_or(0, |c| c.workers.len()) + 1
                    );
                    drop(ctx);
                    ctx = hearth_engine::prepare(&model, &rest)?.ctx;
                    opts = rest;
                    cached.clear();
                    messages.pop();
                    continue;
                }
                if !cached.is_empty() {
                    eprintln!("(/reset starts a new conversation with an empty context)");
                }
                messages.pop();
                failed += 1;
                continue;
            }
        };
        dec.finish();
        let _ = writeln!(out);
        match g.stop {
            StopReason::ContextFull => eprintln!("[the context is full: /reset to start over]"),
            StopReason::Length => eprintln!("[reply cut at --max-tokens {}]", a.max_tokens),
            StopReason::Cancelled => eprintln!("[interrupted]"),
            _ => {}
        }
        let reply: Vec<u32> = g.tokens.iter().copied().filter(|&i| !tok.is_eog(i)).collect();
        messages.push(Message { role: "assistant".into(), content: tok.decode(&reply) });
        cached = ids;
        cached.extend(&g.tokens);
        cached.truncate(ctx.n_past());
    }
    eprintln!();
    // Piped input: the exit status says whether every message got its reply.
    if failed > 0 {
        anyhow::bail!("{failed} of {sent} messages got no reply (the errors are above)");
    }
    Ok(())
}
