//! [`Tokenizer`]: vocabulary loading (llama.cpp's `llama_vocab::impl::load`), special-token
//! partitioning and encoding.

use crate::bpe::{spm_encode, BpeMerges, NO_PIECE};
use crate::error::TokenizerError;
use crate::fxhash::FxHashMap;
use crate::pretok::{pre_config, PreTokenizer, SUPPORTED_PRE};
use crate::unicode::{byte_to_char, char_to_byte};
use hearth_gguf::{GgufFile, Value};

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// Which algorithm a [`Tokenizer`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenizerKind {
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with a regex pre-tokenizer.
    Bpe,
    /// `tokenizer.ggml.model = "llama"`: SentencePiece BPE with scores and byte fallback.
    Spm,
}

enum Algo {
    Bpe { pre: Box<PreTokenizer>, merges: Box<BpeMerges>, ignore_merges: bool },
    Spm { byte_tokens: Box<[Option<u32>; 256]> },
}

/// A tokenizer built from GGUF metadata that reproduces llama.cpp's token ids.
pub struct Tokenizer {
    algo: Algo,
    pre_name: String,
    tokens: Vec<String>,
    attrs: Vec<u16>,
    scores: Vec<f32>,
    /// Text → id: the vocabulary (first id wins on duplicates), plus merge-only strings
    /// with ids ≥ `n_vocab` for BPE.
    pieces: FxHashMap<Box<str>, u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    special_tokens: Vec<u32>,
    /// Each token rendered as llama.cpp's `token_to_piece(special = true)`.
    rendered: Vec<Box<[u8]>>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// Token texts llama.cpp treats as end-of-generation (`special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// Texts that identify the EOT token when `eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

fn type_name(v: &Value) -> &'static str {
    hearth_gguf::type_name(v.type_id())
}

fn opt_str<'a>(f: &'a GgufFile, key: &str) -> Result<Option<&'a str>, TokenizerError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| TokenizerError::meta(key, format!("expected a string, found {}", type_name(v)))),
    }
}

fn opt_bool(f: &GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(TokenizerError::meta(key, format!("expected a bool, found {}", type_name(v)))),
    }
}

fn opt_array<'a>(f: &'a GgufFile, key: &str) -> Result<Option<&'a [Value]>, TokenizerError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .map(Some)
            .ok_or_else(|| TokenizerError::meta(key, format!("expected an array, found {}", type_name(v)))),
    }
}

/// A token id from metadata; present but outside the vocabulary is an error.
fn opt_id(f: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = f.get(key) else { return Ok(None) };
    let id = v
        .as_int()
        .ok_or_else(|| TokenizerError::meta(key, format!("expected an integer token id, found {}", type_name(v))))?;
    if id < 0 || id >= n_vocab as i128 {
        return Err(TokenizerError::meta(key, format!("token id {id} is outside the vocabulary (0..{n_vocab})")));
    }
    Ok(Some(id as u32))
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Parse a `<0xNN>` byte-token text.
fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// One piece of input after special-token partitioning: raw text (byte range) or a token.
#[derive(Clone, Copy)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    /// Build the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    ///
    /// Follows llama.cpp's defaults: SentencePiece vocabularies add BOS and a leading
    /// space unless the metadata says otherwise; BPE vocabularies add BOS only for the
    /// pre-tokenizers llama.cpp marks so (`llama3`, `tekken`, `chameleon`) or when
    /// `tokenizer.ggml.add_bos_token` is true.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        let model = opt_str(f, KEY_MODEL)?.ok_or_else(|| TokenizerError::meta(KEY_MODEL, "missing"))?;
        let kind = match model {
            "gpt2" => TokenizerKind::Bpe,
            "llama" => TokenizerKind::Spm,
            other => return Err(TokenizerError::UnsupportedModel { model: other.to_string() }),
        };

        // Vocabulary.
        let items = opt_array(f, KEY_TOKENS)?
            .ok_or_else(|| TokenizerError::meta(KEY_TOKENS, "missing (the vocabulary is required)"))?;
        if items.is_empty() {
            return Err(TokenizerError::meta(KEY_TOKENS, "the vocabulary is empty"));
        }
        if items.len() >= u32::MAX as usize / 2 {
            return Err(TokenizerError::meta(KEY_TOKENS, format!("{} tokens is too many", items.len())));
        }
        let n_vocab = items.len();
        let mut tokens = Vec::with_capacity(n_vocab);
        for (i, v) in items.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| {
                TokenizerError::meta(KEY_TOKENS, format!("item {i} is {}, expected a string", type_name(v)))
            })?;
            // llama.cpp renames empty tokens so they can be told apart.
            tokens.push(if s.is_empty() { format!("[EMPTY_{i}]") } else { s.to_string() });
        }
        let mut scores = vec![0.0f32; n_vocab];
        if let Some(arr) = opt_array(f, KEY_SCORES)? {
            if arr.len() < n_vocab {
                return Err(TokenizerError::meta(KEY_SCORES, format!("{} scores for {n_vocab} tokens", arr.len())));
            }
            for (i, v) in arr.iter().take(n_vocab).enumerate() {
                scores[i] = v.as_f64().ok_or_else(|| {
                    TokenizerError::meta(KEY_SCORES, format!("item {i} is {}, expected a number", type_name(v)))
                })? as f32;
            }
        }
        let mut attrs = vec![attr::NORMAL; n_vocab];
        if let Some(arr) = opt_array(f, KEY_TYPES)? {
            if arr.len() < n_vocab {
                return Err(TokenizerError::meta(KEY_TYPES, format!("{} token types for {n_vocab} tokens", arr.len())));
            }
            for (i, v) in arr.iter().take(n_vocab).enumerate() {
                let t = v.as_int().ok_or_else(|| {
                    TokenizerError::meta(KEY_TYPES, format!("item {i} is {}, expected an integer", type_name(v)))
                })?;
                attrs[i] = match t {
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => 0, // undefined
                };
            }
        }
        let mut pieces: FxHashMap<Box<str>, u32> = FxHashMap::with_capacity_and_hasher(n_vocab, Default::default());
        for (i, t) in tokens.iter().enumerate() {
            pieces.entry(t.as_str().into()).or_insert(i as u32);
        }

        // Algorithm and its defaults.
        let pre_name = opt_str(f, KEY_PRE)?.unwrap_or("").to_string();
        let (mut bos, mut eos, mut unk) = (Some(1u32), Some(2u32), Some(0u32));
        let (mut add_bos, mut add_space_prefix, clean_spaces);
        let algo = match kind {
            TokenizerKind::Spm => {
                add_bos = true;
                add_space_prefix = true;
                clean_spaces = false;
                let mut byte_tokens = Box::new([None; 256]);
                for b in 0..256usize {
                    let hex = format!("<0x{b:02X}>");
                    byte_tokens[b] = pieces.get(hex.as_str()).copied().or_else(|| {
                        let one = [b as u8];
                        std::str::from_utf8(&one).ok().and_then(|s| pieces.get(s).copied())
                    });
                }
                Algo::Spm { byte_tokens }
            }
            TokenizerKind::Bpe => {
                let pre = if pre_name.is_empty() { "default" } else { pre_name.as_str() };
                let cfg = pre_config(pre).ok_or_else(|| TokenizerError::UnknownPreTokenizer {
                    pre: pre.to_string(),
                    supported: SUPPORTED_PRE.join(", "),
                })?;
                bos = Some(11);
                eos = Some(11);
                unk = None;
                if cfg.no_default_bos {
                    bos = None;
                }
                add_bos = cfg.add_bos;
                add_space_prefix = false;
                clean_spaces = cfg.clean_spaces;
                let pre_tok = PreTokenizer::new(cfg.exprs).map_err(|(pattern, reason)| TokenizerError::Regex {
                    pre: pre.to_string(),
                    pattern,
                    reason,
                })?;
                let merges = build_merges(f, &mut pieces, n_vocab)?;
                Algo::Bpe { pre: Box::new(pre_tok), merges: Box::new(merges), ignore_merges: cfg.ignore_merges }
            }
        };
        if let Some(v) = opt_bool(f, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }
        // Read for completeness; llama.cpp's SPM tokenizer does not act on it.
        let _ = opt_bool(f, "tokenizer.ggml.remove_extra_whitespaces")?;

        // Special ids: defaults outside the vocabulary are dropped, metadata must be valid.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n_vocab);
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        let id = |key: &str| opt_id(f, key, n_vocab);
        bos = id("tokenizer.ggml.bos_token_id")?.or(bos);
        eos = id("tokenizer.ggml.eos_token_id")?.or(eos);
        unk = id("tokenizer.ggml.unknown_token_id")?.or(unk);
        let pad = id("tokenizer.ggml.padding_token_id")?;
        let mut eot = id("tokenizer.ggml.eot_token_id")?;
        let mut eom = id("tokenizer.ggml.eom_token_id")?;
        let mut fim_pre = id("tokenizer.ggml.fim_pre_token_id")?.or(id("tokenizer.ggml.prefix_token_id")?);
        let mut fim_suf = id("tokenizer.ggml.fim_suf_token_id")?.or(id("tokenizer.ggml.suffix_token_id")?);
        let mut fim_mid = id("tokenizer.ggml.fim_mid_token_id")?.or(id("tokenizer.ggml.middle_token_id")?);
        let mut fim_pad = id("tokenizer.ggml.fim_pad_token_id")?;
        let mut fim_rep = id("tokenizer.ggml.fim_rep_token_id")?;
        let mut fim_sep = id("tokenizer.ggml.fim_sep_token_id")?;
        if let Some(v) = opt_bool(f, "tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        let add_eos = opt_bool(f, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::meta(
                "tokenizer.ggml.add_bos_token",
                "is true, but there is no BOS token (tokenizer.ggml.bos_token_id)",
            ));
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::meta(
                "tokenizer.ggml.add_eos_token",
                "is true, but there is no EOS token (tokenizer.ggml.eos_token_id)",
            ));
        }

        // Recognise EOT/EOM/FIM tokens by their text when the metadata does not name them;
        // whatever is found is forced to be a control token (llama.cpp does the same).
        for (slot, texts) in [
            (&mut eot, EOT_TEXTS),
            (&mut eom, &["<|eom_id|>"][..]),
            (&mut fim_pre, FIM_PRE_TEXTS),
            (&mut fim_suf, FIM_SUF_TEXTS),
            (&mut fim_mid, FIM_MID_TEXTS),
            (&mut fim_pad, FIM_PAD_TEXTS),
            (&mut fim_rep, FIM_REP_TEXTS),
            (&mut fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_some() {
                continue;
            }
            let found = texts.iter().filter_map(|t| pieces.get(*t)).copied().min().map(|i| i as usize);
            if let Some(i) = found {
                *slot = Some(i as u32);
                attrs[i] |= attr::CONTROL;
            }
        }

        // End-of-generation set.
        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for &i in EOG_TEXTS.iter().filter_map(|t| pieces.get(*t)) {
            eog.push(i);
            attrs[i as usize] |= attr::CONTROL;
        }
        // gpt-oss: these always render.
        for &i in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"].iter().filter_map(|t| pieces.get(*t)) {
            attrs[i as usize] = attr::USER_DEFINED;
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        let eog_text = |eog: &[u32], text: &str| eog.iter().copied().find(|&i| tokens[i as usize] == text);
        // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        if let Some(end) = eog_text(&eog, "<|end|>") {
            let has_return = eog_text(&eog, "<|return|>").is_some();
            let has_call = eog_text(&eog, "<|call|>").is_some() || eog_text(&eog, "<|calls|>").is_some();
            let has_flush = eog_text(&eog, "<|flush|>").is_some();
            if has_call && (has_return || has_flush) {
                eog.retain(|&i| i != end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / paddleocr: "</s>" is not end-of-generation next to "<|tool_response>".
        if eog_text(&eog, "<|tool_response>").is_some() {
            if let Some(s) = eog_text(&eog, "</s>") {
                eog.retain(|&i| i != s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        // Special tokens matched before BPE, longest first.
        let mut special_tokens: Vec<u32> = (0..n_vocab as u32)
            .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        special_tokens.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()));

        let rendered = (0..n_vocab).map(|i| render(kind, attrs[i], &tokens[i]).into_boxed_slice()).collect();

        // Per-model strip attributes llama.cpp sets by name (absent from GGUF).
        let name = opt_str(f, "general.name")?.unwrap_or("").to_lowercase();
        let arch = opt_str(f, "general.architecture")?.unwrap_or("");
        let by_text = |text: &str| pieces.get(text).copied().filter(|&i| (i as usize) < n_vocab);
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"].iter().any(|p| pre_name.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|a| arch.contains(a))
        {
            if let Some(i) = by_text("<mask>") {
                attrs[i as usize] |= attr::LSTRIP;
            }
        } else if name.contains("phi-3") || name.contains("phi3") {
            for &i in &special_tokens {
                attrs[i as usize] |= attr::RSTRIP;
            }
            if let Some(i) = by_text("</s>") {
                attrs[i as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(i) = by_text(t) {
                    attrs[i as usize] &= !attr::RSTRIP;
                }
            }
        } else if name.contains("modern-bert") {
            if let Some(i) = by_text("[MASK]") {
                attrs[i as usize] |= attr::LSTRIP;
            }
        }

        Ok(Self {
            algo,
            pre_name,
            tokens,
            attrs,
            scores,
            pieces,
            special_tokens,
            rendered,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
        })
    }

    /// Tokenize `text`.
    ///
    /// `add_special` adds BOS/EOS as the metadata says ([`Tokenizer::add_bos`],
    /// `add_eos_token`). `parse_special` lets control tokens written in the text (e.g.
    /// `<|im_start|>`) become their ids; user-defined tokens are matched either way, as in
    /// llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_parts(text, add_special, parse_special, &[])
    }

    /// [`Tokenizer::encode`] with control tokens parsed except inside the byte ranges
    /// `plain` (a chat's message contents, `hearth_chat::Rendered::contents`): there
    /// their text stays text, as `encode(content, false, false)` would leave it, so
    /// only the template's own markup yields control tokens. Text with no control-token
    /// text inside `plain` gives exactly `encode(text, add_special, true)`.
    pub fn encode_with_plain(&self, text: &str, add_special: bool, plain: &[std::ops::Range<usize>]) -> Vec<u32> {
        self.encode_parts(text, add_special, true, plain)
    }

    /// The first control (or unknown) token whose text occurs in `text`, longest first.
    pub fn control_text_in(&self, text: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .filter(|&&id| self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0)
            .map(|&id| self.tokens[id as usize].as_str())
            .find(|t| !t.is_empty() && text.contains(t))
    }

    fn encode_parts(&self, text: &str, add_special: bool, parse_special: bool, plain: &[std::ops::Range<usize>]) -> Vec<u32> {
        let n_vocab = self.tokens.len() as u32;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.partition(text, parse_special, plain);
        match &self.algo {
            Algo::Spm { byte_tokens } => {
                let mut prev_special = true; // the first fragment gets the space prefix
                let mut buf = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(s, e) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in text[s..e].chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            spm_encode(&buf, &self.pieces, &self.scores, byte_tokens, self.unk, &mut out);
                            prev_special = false;
                        }
                    }
                }
            }
            Algo::Bpe { pre, merges, ignore_merges } => {
                let mut encoded = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s, e) => {
                            for word in pre.split(&text[s..e]) {
                                if *ignore_merges {
                                    encoded.clear();
                                    encoded.extend(word.bytes().map(|b| byte_to_char()[b as usize]));
                                    if let Some(&id) = self.pieces.get(encoded.as_str()) {
                                        if id < n_vocab {
                                            out.push(id);
                                            continue;
                                        }
                                    }
                                }
                                merges.encode_word(word.as_bytes(), n_vocab, &mut out);
                            }
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Split `text` at special tokens (llama.cpp's `tokenizer_st_partition`): longest
    /// tokens first, every occurrence, honouring `lstrip`/`rstrip`. Control and unknown
    /// tokens only take part when `parse_special` is set, and never inside `plain`.
    fn partition(&self, text: &str, parse_special: bool, plain: &[std::ops::Range<usize>]) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let bytes = text.as_bytes();
        let mut frags = vec![Fragment::Text(0, text.len())];
        for &id in &self.special_tokens {
            let a = self.attrs[id as usize];
            let control = a & (attr::CONTROL | attr::UNKNOWN) != 0;
            if !parse_special && control {
                continue;
            }
            let tok = self.tokens[id as usize].as_str();
            if !text.contains(tok) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut s, e) = frag else {
                    next.push(frag);
                    continue;
                };
                let mut from = s;
                while let Some(rel) = text[from..e].find(tok) {
                    let m = from + rel;
                    if control && plain.iter().any(|r| m < r.end && r.start < m + tok.len()) {
                        // Typed by a user: stays text; search on from the next character.
                        from = m + text[m..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > s && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > s {
                        next.push(Fragment::Text(s, left_end));
                    }
                    next.push(Fragment::Token(id));
                    s = m + tok.len();
                    if a & attr::RSTRIP != 0 {
                        while s < e && is_c_space(bytes[s]) {
                            s += 1;
                        }
                    }
                    from = s;
                }
                if s < e {
                    next.push(Fragment::Text(s, e));
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes of one token as generated text: llama.cpp's `token_to_piece` with
    /// `special = false` (control and unknown tokens render as nothing). Empty for ids
    /// outside the vocabulary.
    pub fn decode_token(&self, id: u32) -> &[u8] {
        match self.attrs.get(id as usize) {
            Some(&a) if a & (attr::CONTROL | attr::UNKNOWN) == 0 => &self.rendered[id as usize],
            _ => &[],
        }
    }

    /// One token's piece; `special = true` also renders control/unknown tokens as their text.
    pub fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        if special {
            self.rendered.get(id as usize).map(|p| p.to_vec()).unwrap_or_default()
        } else {
            self.decode_token(id).to_vec()
        }
    }

    /// Concatenated pieces of `ids` (control tokens omitted), invalid UTF-8 replaced.
    /// No space clean-up, so for byte-level BPE `decode(encode(s)) == s` whenever every
    /// merge's result is in the vocabulary (otherwise that piece keeps only its
    /// printable ASCII bytes, as in llama.cpp; the decoded bytes are always a
    /// subsequence of the input's); SentencePiece
    /// output keeps the prefix space. See [`Tokenizer::detokenize`] for llama.cpp's exact
    /// `llama_detokenize`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.decode_token(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// llama.cpp's `llama_detokenize`: optionally drop the BOS/EOS the tokenizer adds
    /// (`remove_special`), render control tokens (`unparse_special`), strip the
    /// SentencePiece prefix space and apply the vocabulary's space clean-up.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> String {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && !ids.is_empty() && Some(ids[0]) == self.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && self.add_eos && !ids.is_empty() && Some(ids[ids.len() - 1]) == self.eos {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let piece = self.piece(id, unparse_special);
            let piece = if remove_space { piece.strip_prefix(b" ").unwrap_or(&piece) } else { &piece[..] };
            text.extend_from_slice(piece);
            remove_space = false;
        }
        if self.clean_spaces {
            text = clean_up_spaces(&text);
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from metadata or recognised by text, e.g. `<|im_end|>`).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token (`<|eom_id|>`).
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether generation stops at `id`: EOS, EOT, EOM, FIM pad/repo/file-separator tokens
    /// and the control texts llama.cpp lists (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`,
    /// `<end_of_turn>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// The raw vocabulary string of a token (`""` outside the vocabulary).
    pub fn token_text(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map(String::as_str).unwrap_or("")
    }

    /// The id of a vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.pieces.get(text).copied().filter(|&i| (i as usize) < self.tokens.len())
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether a token is a control token (renders as nothing in [`Tokenizer::decode`]).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|&a| a & attr::CONTROL != 0)
    }

    /// The tokenizer family.
    pub fn kind(&self) -> TokenizerKind {
        match self.algo {
            Algo::Bpe { .. } => TokenizerKind::Bpe,
            Algo::Spm { .. } => TokenizerKind::Spm,
        }
    }

    /// The `tokenizer.ggml.pre` value (empty when absent).
    pub fn pre(&self) -> &str {
        &self.pre_name
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("pre", &self.pre_name)
            .field("n_vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

/// Intern merge strings and rank every `"left right"` pair (first occurrence wins).
fn build_merges(
    f: &GgufFile,
    pieces: &mut FxHashMap<Box<str>, u32>,
    n_vocab: usize,
) -> Result<BpeMerges, TokenizerError> {
    let arr = opt_array(f, KEY_MERGES)?
        .ok_or_else(|| TokenizerError::meta(KEY_MERGES, "missing (required for a gpt2 BPE tokenizer)"))?;
    let mut next_piece = n_vocab as u32;
    let mut intern = |pieces: &mut FxHashMap<Box<str>, u32>, s: &str| -> u32 {
        if let Some(&id) = pieces.get(s) {
            return id;
        }
        let id = next_piece;
        next_piece += 1;
        pieces.insert(s.into(), id);
        id
    };
    let mut merges = FxHashMap::with_capacity_and_hasher(arr.len(), Default::default());
    let mut joined = String::new();
    for (rank, v) in arr.iter().enumerate() {
        let s = v.as_str().ok_or_else(|| {
            TokenizerError::meta(KEY_MERGES, format!("item {rank} is {}, expected a string", type_name(v)))
        })?;
        // Split at the first space after the first byte (a merge can start with a space).
        let Some(pos) = s.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
            continue;
        };
        let (l, r) = (&s[..pos], &s[pos + 1..]);
        joined.clear();
        joined.push_str(l);
        joined.push_str(r);
        let li = intern(pieces, l);
        let ri = intern(pieces, r);
        let mi = intern(pieces, &joined);
        merges.entry((li, ri)).or_insert((rank as u32, mi));
    }
    let mut byte_piece = [NO_PIECE; 256];
    let mut ascii_token = [None; 128];
    let mut buf = [0u8; 4];
    for b in 0..256usize {
        let c = byte_to_char()[b];
        if let Some(&p) = pieces.get(&*c.encode_utf8(&mut buf)) {
            byte_piece[b] = p;
        }
        // llama.cpp looks up single bytes of the byte-level *encoded* word, and only
        // the printable ASCII bytes (0x21..=0x7E) encode as themselves: a raw space or
        // newline is `Ġ`/`Ċ` there, never a one-byte string.
        if (0x21..=0x7E).contains(&b) {
            let one = [b as u8];
            if let Ok(s) = std::str::from_utf8(&one) {
                ascii_token[b] = pieces.get(s).copied().filter(|&i| (i as usize) < n_vocab);
            }
        }
    }
    Ok(BpeMerges { merges, byte_piece, ascii_token })
}

/// llama.cpp's `token_to_piece(special = true)` for one token.
fn render(kind: TokenizerKind, a: u16, text: &str) -> Vec<u8> {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match kind {
            TokenizerKind::Spm => text.replace('▁', " ").into_bytes(),
            TokenizerKind::Bpe => {
                let mut out = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match char_to_byte(c) {
                        Some(b) => out.push(b),
                        None => {
                            // Not a byte-level char: llama.cpp's marker, kept verbatim.
                            out.extend_from_slice(b"[UNK_BYTE_0x");
                            let mut buf = [0u8; 4];
                            for b in c.encode_utf8(&mut buf).bytes() {
                                out.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            out.extend_from_slice(text.as_bytes());
                            out.push(b']');
                        }
                    }
                }
                out
            }
        };
    }
    if a & attr::BYTE != 0 {
        return byte_token_value(text).map(|b| vec![b]).unwrap_or_default();
    }
    Vec::new()
}

/// llama.cpp's `clean_up_tokenization_spaces` passes over detokenized bytes, done in
/// place exactly as llama.cpp does (the second pass leaves a NUL behind that the next
/// comparison sees).
fn clean_up_spaces(text: &[u8]) -> Vec<u8> {
    let mut t = text.to_vec();
    // " ?" " !" " ." " ," → drop the space.
    let n = t.len();
    let mut total = n.min(1);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
    // " ' " → "'".
    let n = t.len();
    let mut total = n.min(1);
    let mut i = 1;
    while i < n {
        let x = t[i];
        if x == b'\'' && i + 1 < n && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    t.truncate(total);
    // " 's" " 'm" " 're" " 've" → drop the space (" 't" " 'd" " 'll" keep it).
    let n = t.len();
    let mut total = n.min(1);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = t[i + 1];
            let re_ve = i + 2 < n && matches!((x1, t[i + 2]), (b'r', b'e') | (b'v', b'e'));
            if matches!(x1, b's' | b'm') || re_ve {
                total -= 1;
            }
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
    t
}
