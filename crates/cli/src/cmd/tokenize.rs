//! `hearth tokenize`: text → token ids. Needs only the tokenizer metadata, so it works
//! on vocab-only GGUF files.

use crate::common::{parse_bool, print_out, resolve_model};
use anyhow::{Context as _, Result};
use hearth_tokenizer::Tokenizer;
use std::path::PathBuf;

/// Flags of `hearth tokenize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file (a full model or a vocab-only file)
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Text to tokenize (or --file)
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    pub text: Option<String>,
    /// File to tokenize (`-` for stdin), as `generate -f` (or --text)
    #[arg(short = 'f', long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Add BOS/EOS as the model's metadata says
    #[arg(long, default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub add_special: bool,
    /// Match special tokens such as <|im_start|> in the text
    #[arg(long, default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub parse_special: bool,
    /// Print a JSON array of ids
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let path = resolve_model(a.model.as_ref())?;
    let f = crate::common::open_gguf(&path)?;
    let tok = Tokenizer::from_gguf(&f).with_context(|| format!("tokenizer of {}", path.display()))?;
    let text = match (&a.text, &a.file) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) => crate::common::read_text(p)?,
        (None, None) => unreachable!("clap requires --text or --file"),
    };
    let ids = tok.encode(&text, a.add_special, a.parse_special);
    let out = if a.json {
        serde_json::to_string(&ids)? + "\n"
    } else {
        ids.iter().map(|&id| format!("{id:>6} -> {:?}\n", String::from_utf8_lossy(&tok.piece(id, true)))).collect()
    };
    print_out(&out)
}
