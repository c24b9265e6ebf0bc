//! Speculative decoding flags (`--draft`, `--draft-model`, `--draft-max`, `--draft-min`),
//! shared by `generate` and `bench`, and their report.

use anyhow::{bail, Context as _, Result};
use hearth_model::speculative::{Drafter, ModelDraft, NgramDraft, SpecStats, Speculation};
use hearth_model::{Context, Model};
use std::path::PathBuf;
use std::sync::Arc;

/// Where guesses come from.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    /// Prompt lookup: continue the latest earlier occurrence of the last 2-4 tokens (no second model)
    Ngram,
}

/// Speculative decoding flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding with n-gram drafts: guess the next tokens from what followed the same
    /// tokens earlier in the prompt or output, check them all in one pass, keep those the model
    /// would have produced (the output is the same as without; faster when text repeats, e.g.
    /// code editing, summaries)
    #[arg(long, value_enum, value_name = "KIND", conflicts_with = "draft_model")]
    pub draft: Option<DraftKind>,
    /// Speculative decoding with a draft model: a smaller GGUF with the same vocabulary (e.g. a
    /// 0.5B of the model's family) guesses greedily on this machine (serve: one draft KV slot per
    /// slot, drafting for all sequences in one batch); the output is the same as without
    #[arg(long, value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// Most tokens guessed per pass [default: 16]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub draft_max: Option<u32>,
    /// Fewest guesses worth a pass; a shorter draft is dropped and the step decodes one token [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub draft_min: Option<u32>,
}

impl SpecArgs {
    /// Whether speculation is asked for.
    pub fn enabled(&self) -> bool {
        self.draft.is_some() || self.draft_model.is_some()
    }

    /// The flags' values are consistent: --draft-max/--draft-min only with a drafter, min ≤ max.
    pub fn check(&self) -> Result<()> {
        if !self.enabled() && (self.draft_max.is_some() || self.draft_min.is_some()) {
            bail!("--draft-max and --draft-min set how speculative decoding guesses: add --draft ngram or --draft-model PATH");
        }
        let (max, min) = (self.draft_max.unwrap_or(16), self.draft_min.unwrap_or(1));
        if min > max {
            bail!("--draft-min {min} exceeds --draft-max {max}: no draft could be long enough");
        }
        Ok(())
    }

    /// The drafter these flags ask for (`None`: no speculation), drafting for `target` with
    /// a context of `n_ctx` positions, passes of `n_batch` tokens and `n_threads` threads.
    pub fn speculation(&self, target: &Model, n_ctx: usize, n_batch: usize, n_threads: usize) -> Result<Option<Speculation>> {
        self.check()?;
        if !self.enabled() {
            return Ok(None);
        }
        let drafter: Box<dyn Drafter> = match &self.draft_model {
            Some(path) => {
                let draft = Model::load(path).with_context(|| format!("loading the draft model {}", path.display()))?;
                warn_short_draft(path, &draft, n_ctx);
                let ctx = draft_context(path, Arc::new(draft), n_ctx, n_batch, n_threads)?;
                Box::new(ModelDraft::new(ctx, target).with_context(|| format!("--draft-model {}", path.display()))?)
            }
            None => Box::new(NgramDraft::default()),
        };
        let mut spec = Speculation::new(drafter);
        spec.max = self.draft_max.map_or(spec.max, |n| n as usize);
        spec.min = self.draft_min.map_or(spec.min, |n| n as usize);
        Ok(Some(spec))
    }

    /// What drafts: `ngram` or the draft model's path.
    pub fn describe(&self) -> String {
        match (&self.draft_model, self.draft) {
            (Some(p), _) => format!("draft model {}", p.display()),
            (None, Some(DraftKind::Ngram)) => "n-gram drafts".into(),
            (None, None) => "none".into(),
        }
    }
}

/// The draft model's context, `n_ctx` positions like the target's.
pub fn draft_context(path: &std::path::Path, draft: Arc<Model>, n_ctx: usize, n_batch: usize, n_threads: usize) -> Result<Context> {
    Context::new(draft, n_ctx, n_batch, n_threads).with_context(|| format!("a context for the draft model {}", path.display()))
}

/// A draft model trained on a shorter context than `n_ctx` still runs past it (its guesses
/// are only checked, never trusted), but at RoPE positions it never saw, so its guesses
/// there will mostly be rejected: said on stderr rather than left to show as a silent
/// drop in acceptance.
pub fn warn_short_draft(path: &std::path::Path, draft: &Model, n_ctx: usize) {
    let train = draft.config.n_ctx_train;
    if n_ctx > train {
        eprintln!(
            "warning: the draft model {} was trained on {train} positions, fewer than the context size {n_ctx}: \
             past {train} tokens its guesses will rarely be accepted (the output stays the same)",
            path.display()
        );
    }
}

/// `{"drafter", "passes", "drafted", "accepted", "acceptance"}` for `--json` output.
pub fn stats_json(args: &SpecArgs, s: &SpecStats) -> serde_json::Value {
    serde_json::json!({
        "drafter": args.describe(),
        "passes": s.passes,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance": s.acceptance(),
    })
}

/// One line for stderr: guesses made and taken.
pub fn stats_line(args: &SpecArgs, s: &SpecStats) -> String {
    format!(
        "speculative ({}): {} of {} guessed tokens accepted ({:.0}%) in {} passes",
        args.describe(),
        s.accepted,
        s.drafted,
        100.0 * s.acceptance(),
        s.passes
    )
}
