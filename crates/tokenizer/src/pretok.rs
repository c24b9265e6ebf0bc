//! Pre-tokenizers: split text into words before byte-level BPE, exactly as llama.cpp does.
//!
//! llama.cpp (`llm_tokenizer_bpe` + `unicode_regex_split`) gives each `tokenizer.ggml.pre`
//! an ordered list of regexes. Each regex refines the pieces the previous one produced:
//! matches *and* the text between matches become pieces. Two regexes (GPT-2's and
//! Llama 3's) are run by hand-written scanners; every other regex runs on a "collapsed"
//! copy of the text in which each non-ASCII code point is replaced by one placeholder per
//! Unicode category, and `\p{..}` in the regex by a class of that placeholder plus the
//! ASCII members llama.cpp lists. We reproduce both mechanisms rather than running the
//! original regexes with a Unicode-aware engine, because the collapse has observable
//! quirks (`\p{Lu}` matches any letter, `~` is not `\p{S}`, ...) that the reference
//! token ids depend on.

use crate::unicode::{self, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE};
use std::sync::Mutex;

/// GPT-2's pattern; run by [`split_gpt2`].
pub(crate) const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's pattern (case-insensitive contractions spelled out); run by [`split_llama3`].
pub(crate) const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const JAIS2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK3_MAIN: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const SPARK_MAIN: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##;
const YOUTU_MAIN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const CJK_KANA: &str = "[一-龥぀-ゟ゠-ヿ]+";
const CJK_HANGUL: &str = "[一-龥ࠀ-一가-퟿]+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GRANITE_EMB_MULTI: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA: &str = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const EXAONE_MOE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const MINICPM5_MAIN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one `tokenizer.ggml.pre` value configures the BPE tokenizer (llama.cpp's
/// `llama_vocab::impl::load` and `llm_tokenizer_bpe`).
pub(crate) struct PreConfig {
    /// Regexes applied in order.
    pub exprs: &'static [&'static str],
    /// A word that is itself a vocab entry is emitted whole, without merges.
    pub ignore_merges: bool,
    /// `add_bos` default before `tokenizer.ggml.add_bos_token` is consulted.
    pub add_bos: bool,
    /// Detokenizer clean-up of spaces before punctuation (`clean_up_tokenization_spaces`).
    pub clean_spaces: bool,
    /// ChatGLM: no BOS unless the metadata names one.
    pub no_default_bos: bool,
}

const fn cfg(exprs: &'static [&'static str]) -> PreConfig {
    PreConfig { exprs, ignore_merges: false, add_bos: false, clean_spaces: true, no_default_bos: false }
}

impl PreConfig {
    const fn ignore_merges(mut self) -> Self {
        self.ignore_merges = true;
        self
    }
    const fn add_bos(mut self) -> Self {
        self.add_bos = true;
        self
    }
    const fn no_clean(mut self) -> Self {
        self.clean_spaces = false;
        self
    }
}

/// Every `tokenizer.ggml.pre` value this crate accepts (for error messages, and for
/// the fuzz target that runs each one).
pub const SUPPORTED_PRE: &[&str] = &[
    "default",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "hunyuan-dense",
    "joyai-llm",
    "hy_v4",
    "spark2_5",
    "youtu",
    "falcon",
    "mpt",
    "starcoder",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "jais-2",
    "refact",
    "command-r",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "qwen35",
    "stablelm2",
    "olmo",
    "dbrx",
    "smaug-bpe",
    "poro-chat",
    "glm4",
    "chatglm-bpe",
    "viking",
    "jais",
    "tekken",
    "smollm",
    "codeshell",
    "bloom",
    "gpt3-finnish",
    "exaone",
    "exaone4",
    "exaone-moe",
    "chameleon",
    "minerva-7b",
    "megrez",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
    "granite-embed-multi-97m",
    "superbpe",
    "trillion",
    "granite-docling",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "hunyuan",
    "ufakzeka",
    "grok-2",
    "laguna",
    "solar-open",
    "mellum2",
    "minicpm5",
];

/// The configuration of a `tokenizer.ggml.pre` value (`None` = unknown). An absent `pre`
/// is `"default"`, as in llama.cpp.
pub(crate) fn pre_config(pre: &str) -> Option<PreConfig> {
    const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];
    const STARCODER: &[&str] = &[r"\p{N}", GPT2];
    const DEEPSEEK3: &[&str] = &[r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3_MAIN];
    Some(match pre {
        "default" => cfg(DEFAULT),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => cfg(&[LLAMA3]).ignore_merges().add_bos(),
        "deepseek-llm" => {
            cfg(&["[\r\n]", DEEPSEEK_LLM_LETTERS, "\\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", CJK_HANGUL, r"\p{N}+"])
                .no_clean()
        }
        "deepseek-coder" => cfg(&["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, r"\p{N}"]).no_clean(),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => cfg(DEEPSEEK3).no_clean(),
        "spark2_5" => cfg(&[r"\p{N}{1,3}", CJK_KANA, SPARK_MAIN, r"\p{N}"]).no_clean(),
        "youtu" => cfg(&["[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+", YOUTU_MAIN])
            .no_clean()
            .ignore_merges(),
        "falcon" => cfg(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => cfg(STARCODER),
        "command-r" | "smollm" => cfg(STARCODER).no_clean(),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo" | "jais" => {
            cfg(&[GPT2])
        }
        "trillion" | "granite-docling" => cfg(&[GPT2]).no_clean(),
        "jais-2" => cfg(&[JAIS2]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" | "grok-2" => {
            cfg(&[QWEN2]).no_clean()
        }
        "stablelm2" | "megrez" => cfg(&[QWEN2]),
        "qwen35" => cfg(&[QWEN35]).no_clean(),
        "dbrx" | "smaug-bpe" => cfg(&[LLAMA3]),
        "poro-chat" => cfg(&[BLOOM]).no_clean(),
        "bloom" | "gpt3-finnish" => cfg(&[BLOOM]),
        "glm4" | "chatglm-bpe" => PreConfig { no_default_bos: true, ..cfg(&[LLAMA3]) },
        "viking" => cfg(&[BLOOM, r"\p{N}"]).no_clean(),
        "tekken" => cfg(&[TEKKEN]).no_clean().ignore_merges().add_bos(),
        "chameleon" => cfg(&[
            "<sentinel:[0-9]+>",
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            r"([\t\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            GPT2,
        ])
        .add_bos()
        .no_clean(),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => cfg(&[GPT4O]).no_clean(),
        "granite-embed-multi-97m" => cfg(&[GRANITE_EMB_MULTI]).no_clean().ignore_merges(),
        "superbpe" => cfg(&[r"\p{N}+", r"(?=(\d{3})+(?!\d))"]).no_clean(),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => cfg(&[BAILINGMOE]).no_clean(),
        "seed-coder" => cfg(&[SEED_CODER]).no_clean(),
        "ufakzeka" => cfg(&[UFAKZEKA]).no_clean(),
        "laguna" => cfg(&["[^\\n]+|[\\n]+", QWEN2]).no_clean(),
        "exaone-moe" => cfg(&[EXAONE_MOE]),
        "minicpm5" => cfg(&[r"\p{N}{1,3}", MINICPM5_MAIN]).ignore_merges(),
        _ => return None,
    })
}

/// One splitting step.
enum Step {
    Gpt2,
    Llama3,
    /// A general regex; `collapsed` = it runs on the category-collapsed text.
    Regex {
        re: fancy_regex::Regex,
        collapsed: bool,
    },
}

/// A compiled pre-tokenizer.
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
    need_collapsed: bool,
    need_plain: bool,
}

/// The `\p{..}` names llama.cpp collapses, and the category each stands for.
const UCAT: &[(&str, u16)] = &[
    (r"\p{N}", NUMBER),
    (r"\p{L}", LETTER),
    (r"\p{P}", PUNCTUATION),
    (r"\p{M}", MARK),
    (r"\p{S}", SYMBOL),
    (r"\p{Lu}", LETTER),
    (r"\p{Ll}", LETTER),
    (r"\p{Lt}", LETTER),
    (r"\p{Lm}", LETTER),
    (r"\p{Lo}", LETTER),
];

/// Placeholder char of a collapsed category (llama.cpp uses the bytes 0xD0..0xD5; we use
/// the code points of the same value, which never occur in collapsed text otherwise).
fn placeholder(category: u16) -> char {
    match category {
        NUMBER => '\u{D1}',
        LETTER => '\u{D2}',
        PUNCTUATION => '\u{D3}',
        MARK => '\u{D4}',
        SYMBOL => '\u{D5}',
        _ => '\u{D0}',
    }
}

/// Class body standing for a category in a collapsed regex: the placeholder plus the ASCII
/// members llama.cpp lists (note: no `~` in `\p{S}`).
fn class_body(category: u16) -> String {
    let ascii = match category {
        NUMBER => "0-9",
        LETTER => "A-Za-z",
        PUNCTUATION => r"!-#%-*,-/:-;?-@\[-\]_\{\}",
        MARK => "",
        SYMBOL => r"\$\+<->\^`\|",
        _ => "",
    };
    format!("{}{}", placeholder(category), ascii)
}

fn uses_categories(expr: &str) -> bool {
    UCAT.iter().any(|(name, _)| expr.contains(name))
}

/// Rewrite `\p{..}` for the collapsed text (llama.cpp's `regex_expr_collapsed`).
fn collapse_regex(expr: &str) -> Result<String, String> {
    if !expr.is_ascii() {
        return Err("regex mixes Unicode categories with non-ASCII characters".into());
    }
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && b[i] == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            if let Some(close) = expr[i + 3..].find('}').map(|p| p + i + 3) {
                if close <= i + 10 {
                    if let Some(&(_, cat)) = UCAT.iter().find(|(name, _)| *name == &expr[i..=close]) {
                        if !inside {
                            out.push('[');
                        }
                        out.push_str(&class_body(cat));
                        if !inside {
                            out.push(']');
                        }
                        i = close + 1;
                        continue;
                    }
                }
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    Ok(out)
}

/// Regexes compiled so far in this process, by pattern. The patterns come from the
/// fixed table in [`pre_config`], so this holds at most a few dozen entries; building
/// one costs milliseconds (far more under a sanitizer), and a process may build the same
/// tokenizer more than once (`Model::from_file` builds its own; the structure-aware
/// fuzz target builds two per input and spent half its time compiling these regexes).
/// A clone shares the compiled automata.
static COMPILED: Mutex<Vec<(String, fancy_regex::Regex)>> = Mutex::new(Vec::new());

/// `pattern` compiled (with the backtracking limit every step uses), from [`COMPILED`]
/// when it was compiled before. Failures are not cached.
fn compile(pattern: &str) -> Result<fancy_regex::Regex, String> {
    // A panic while the lock was held cannot leave a half-written entry: recover it.
    let cached = |c: &Vec<(String, fancy_regex::Regex)>| c.iter().find(|(p, _)| p == pattern).map(|(_, re)| re.clone());
    if let Some(re) = cached(&COMPILED.lock().unwrap_or_else(|e| e.into_inner())) {
        return Ok(re);
    }
    let re = fancy_regex::RegexBuilder::new(pattern).backtrack_limit(10_000_000).build().map_err(|e| e.to_string())?;
    let mut c = COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    if cached(&c).is_none() {
        c.push((pattern.to_string(), re.clone()));
    }
    Ok(re)
}

impl PreTokenizer {
    /// Compile a list of regexes; the error names the regex at fault.
    pub(crate) fn new(exprs: &[&str]) -> Result<Self, (String, String)> {
        let mut steps = Vec::with_capacity(exprs.len());
        for &expr in exprs {
            let step = if expr == GPT2 {
                Step::Gpt2
            } else if expr == LLAMA3 {
                Step::Llama3
            } else {
                let collapsed = uses_categories(expr);
                let pattern =
                    if collapsed { collapse_regex(expr).map_err(|e| (expr.to_string(), e))? } else { expr.to_string() };
                let re = compile(&pattern).map_err(|e| (expr.to_string(), e))?;
                Step::Regex { re, collapsed }
            };
            steps.push(step);
        }
        let need_collapsed = steps.iter().any(|s| matches!(s, Step::Regex { collapsed: true, .. }));
        let need_plain = steps.iter().any(|s| matches!(s, Step::Regex { collapsed: false, .. }));
        Ok(Self { steps, need_collapsed, need_plain })
    }

    /// Split `text` into words (sub-slices of `text`, in order, covering it entirely).
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        if text.is_empty() {
            return Vec::new();
        }
        let chars: Vec<char> = text.chars().collect();
        let flags = unicode::flags_of(&chars);
        let collapsed = self.need_collapsed.then(|| Transformed::new(&chars, &flags, true));
        let plain = self.need_plain.then(|| Transformed::new(&chars, &flags, false));

        let mut offsets = vec![chars.len()];
        for step in &self.steps {
            let mut next = Vec::with_capacity(offsets.len() * 2);
            let mut start = 0;
            for &len in &offsets {
                let end = start + len;
                match step {
                    Step::Gpt2 => split_gpt2(&chars, &flags, start, end, &mut next),
                    Step::Llama3 => split_llama3(&chars, &flags, start, end, &mut next),
                    Step::Regex { re, collapsed: c } => {
                        let t = if *c { collapsed.as_ref() } else { plain.as_ref() };
                        // Both are built whenever a step needs them.
                        if let Some(t) = t {
                            t.split(re, start, end, &mut next)
                        }
                    }
                }
                start = end;
            }
            offsets = next;
        }

        let mut byte_at = Vec::with_capacity(chars.len() + 1);
        let mut b = 0;
        for c in &chars {
            byte_at.push(b);
            b += c.len_utf8();
        }
        byte_at.push(b);
        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for len in offsets {
            words.push(&text[byte_at[start]..byte_at[start + len]]);
            start += len;
        }
        words
    }
}

/// The text as a regex step sees it: either category-collapsed, or with non-ASCII
/// whitespace replaced by U+000B (llama.cpp's `std::wregex` path), plus the byte offset
/// of every char so matches map back to char indices.
struct Transformed {
    text: String,
    byte_at: Vec<usize>,
}

impl Transformed {
    fn new(chars: &[char], flags: &[u16], collapse: bool) -> Self {
        let mut text = String::with_capacity(chars.len() * 2);
        let mut byte_at = Vec::with_capacity(chars.len() + 1);
        for (&c, &f) in chars.iter().zip(flags) {
            byte_at.push(text.len());
            let t = if (c as u32) < 128 {
                c
            } else if f & WHITESPACE != 0 {
                '\u{0B}'
            } else if collapse {
                placeholder(f & unicode::CATEGORIES)
            } else {
                c
            };
            text.push(t);
        }
        byte_at.push(text.len());
        Self { text, byte_at }
    }

    fn char_index(&self, byte: usize) -> usize {
        self.byte_at.partition_point(|&b| b < byte)
    }

    /// Split chars `start..end`: each match and each gap between matches is a piece.
    fn split(&self, re: &fancy_regex::Regex, start: usize, end: usize, out: &mut Vec<usize>) {
        let base = self.byte_at[start];
        let hay = &self.text[base..self.byte_at[end]];
        let mut prev = start;
        for m in re.find_iter(hay) {
            // A backtracking limit hit leaves the rest of the fragment as one piece.
            let Ok(m) = m else { break };
            let (ms, me) = (self.char_index(base + m.start()), self.char_index(base + m.end()));
            if ms > prev {
                out.push(ms - prev);
            }
            if me > ms {
                out.push(me - ms);
            }
            prev = me;
        }
        if end > prev {
            out.push(end - prev);
        }
    }
}

/// Character access limited to one fragment: outside it, `'\u{FFFFFFFF}'`-like "none"
/// and zero flags, as llama.cpp's `_get_cpt` / `_get_flags`.
struct Frag<'a> {
    chars: &'a [char],
    flags: &'a [u16],
    start: usize,
    end: usize,
}

impl Frag<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.start <= pos && pos < self.end).then(|| self.chars[pos])
    }
    #[inline]
    fn flags(&self, pos: usize) -> u16 {
        if self.start <= pos && pos < self.end {
            self.flags[pos]
        } else {
            0
        }
    }
}

/// Emits pieces ending at given positions, skipping empty ones.
struct Emit<'o> {
    prev: usize,
    out: &'o mut Vec<usize>,
}

impl Emit<'_> {
    fn to(&mut self, end: usize) -> usize {
        let len = end - self.prev;
        if len > 0 {
            self.out.push(len);
        }
        self.prev = end;
        len
    }
}

const NOT_WORDLIKE: u16 = WHITESPACE | LETTER | NUMBER;

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` by hand
/// (llama.cpp's `unicode_regex_split_custom_gpt2`).
fn split_gpt2(chars: &[char], flags: &[u16], start: usize, end: usize, out: &mut Vec<usize>) {
    let f = Frag { chars, flags, start, end };
    let mut emit = Emit { prev: start, out };
    let mut pos = start;
    while pos < end {
        let cpt = chars[pos];
        let fl = flags[pos];
        if cpt == '\'' && pos + 1 < end {
            let next = chars[pos + 1];
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += emit.to(pos + 2);
                continue;
            }
            if pos + 2 < end {
                let nn = chars[pos + 2];
                if matches!((next, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += emit.to(pos + 3);
                    continue;
                }
            }
        }
        let space = cpt == ' ';
        let mut f2 = if space { f.flags(pos + 1) } else { fl };
        if f2 & LETTER != 0 {
            pos += space as usize;
            while f2 & LETTER != 0 {
                pos += 1;
                f2 = f.flags(pos);
            }
            emit.to(pos);
            continue;
        }
        if f2 & NUMBER != 0 {
            pos += space as usize;
            while f2 & NUMBER != 0 {
                pos += 1;
                f2 = f.flags(pos);
            }
            emit.to(pos);
            continue;
        }
        if f2 & NOT_WORDLIKE == 0 && f2 != 0 {
            pos += space as usize;
            while f2 & NOT_WORDLIKE == 0 && f2 != 0 {
                pos += 1;
                f2 = f.flags(pos);
            }
            emit.to(pos);
            continue;
        }
        let mut n_ws = 0;
        while f.flags(pos + n_ws) & WHITESPACE != 0 {
            n_ws += 1;
        }
        pos = whitespace_end(&f, pos, n_ws);
        emit.to(pos);
    }
}

/// End of the piece starting at `pos` with `n_ws` whitespace characters, the common tail
/// of llama.cpp's hand-written splitters: `\s+(?!\S)` keeps the last space for the next
/// word, `\s+` takes the run, anything else is a single character.
fn whitespace_end(f: &Frag<'_>, pos: usize, n_ws: usize) -> usize {
    if n_ws > 1 && f.cpt(pos + n_ws).is_some() {
        pos + n_ws - 1
    } else if n_ws > 0 {
        pos + n_ws
    } else {
        pos + 1
    }
}

/// [`LLAMA3`] by hand (llama.cpp's `unicode_regex_split_custom_llama3`).
fn split_llama3(chars: &[char], flags: &[u16], start: usize, end: usize, out: &mut Vec<usize>) {
    let f = Frag { chars, flags, start, end };
    let mut emit = Emit { prev: start, out };
    let mut pos = start;
    while pos < end {
        let cpt = chars[pos];
        let fl = flags[pos];
        if cpt == '\'' && pos + 1 < end {
            let next = chars[pos + 1].to_ascii_lowercase();
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += emit.to(pos + 2);
                continue;
            }
            if pos + 2 < end {
                let nn = chars[pos + 2].to_ascii_lowercase();
                if matches!((next, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += emit.to(pos + 3);
                    continue;
                }
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == '\r' || cpt == '\n' || fl & NUMBER != 0) && (fl & LETTER != 0 || f.flags(pos + 1) & LETTER != 0) {
            pos += 1;
            while f.flags(pos) & LETTER != 0 {
                pos += 1;
            }
            emit.to(pos);
            continue;
        }
        // \p{N}{1,3}
        if fl & NUMBER != 0 {
            let mut ini = pos;
            while f.flags(pos) & NUMBER != 0 {
                pos += 1;
                if pos - ini >= 3 {
                    emit.to(pos);
                    ini = pos;
                }
            }
            emit.to(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let space = cpt == ' ';
        let mut f2 = if space { f.flags(pos + 1) } else { fl };
        if f2 & NOT_WORDLIKE == 0 && fl != 0 {
            pos += space as usize;
            while f2 & NOT_WORDLIKE == 0 && f2 != 0 {
                pos += 1;
                f2 = f.flags(pos);
            }
            while matches!(f.cpt(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            emit.to(pos);
            continue;
        }
        let mut n_ws = 0;
        let mut last_rn = 0;
        while f.flags(pos + n_ws) & WHITESPACE != 0 {
            if matches!(chars[pos + n_ws], '\r' | '\n') {
                last_rn = pos + n_ws + 1;
            }
            n_ws += 1;
        }
        // \s*[\r\n]+
        if last_rn > 0 {
            pos = last_rn;
            emit.to(pos);
            continue;
        }
        pos = whitespace_end(&f, pos, n_ws);
        emit.to(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(exprs: &[&str], text: &str) -> Vec<String> {
        PreTokenizer::new(exprs).unwrap().split(text).into_iter().map(String::from).collect()
    }

    #[test]
    fn every_supported_pre_compiles() {
        for pre in SUPPORTED_PRE {
            let cfg = pre_config(pre).unwrap_or_else(|| panic!("{pre} listed but unknown"));
            PreTokenizer::new(cfg.exprs).unwrap_or_else(|e| panic!("{pre}: {e:?}"));
        }
    }

    /// A second tokenizer with the same pre-tokenizer reuses the compiled regexes, and
    /// splits the same way.
    #[test]
    fn compiled_regexes_are_reused() {
        let text = "Hello world's 12345 ok\n\n  x é中";
        let a = PreTokenizer::new(&[QWEN2]).unwrap();
        let b = PreTokenizer::new(&[QWEN2]).unwrap();
        assert_eq!(a.split(text), b.split(text));
        let pattern = collapse_regex(QWEN2).unwrap();
        assert_eq!(COMPILED.lock().unwrap().iter().filter(|(p, _)| *p == pattern).count(), 1);
    }

    #[test]
    fn gpt2_scanner_matches_regex_semantics() {
        assert_eq!(split(&[GPT2], "Hello world's   end!!\n"), ["Hello", " world", "'s", "  ", " end", "!!", "\n"]);
        assert_eq!(split(&[GPT2], "a  b"), ["a", " ", " b"]);
    }

    #[test]
    fn llama3_scanner() {
        assert_eq!(split(&[LLAMA3], "I'M 12345 ok\n\n  x"), ["I", "'M", " ", "123", "45", " ok", "\n\n", " ", " x"]);
    }

    /// The hand-written scanners agree with the general regex path on the same patterns
    /// (a self-check of both the scanners and the category collapse).
    #[test]
    fn scanners_agree_with_collapsed_regex() {
        let pool: Vec<char> =
            "aZé中ß 1٣½\n\r\t'sStTmMdDlLrReEvV!?.,~$😀\u{301}\u{A0}\u{3000}\u{2028}-_\"".chars().collect();
        let mut seed = 0x1234_5678u64;
        let mut texts = Vec::new();
        for _ in 0..3000 {
            let mut t = String::new();
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = (seed >> 59) as usize + 1;
            for _ in 0..len {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                t.push(pool[(seed >> 33) as usize % pool.len()]);
            }
            texts.push(t);
        }
        for (fast, general) in [(GPT2, format!("{GPT2}|\\s+")), (LLAMA3, format!("(?:{LLAMA3})"))] {
            let fast = PreTokenizer::new(&[fast]).unwrap();
            let general = PreTokenizer::new(&[general.as_str()]).unwrap();
            for t in &texts {
                assert_eq!(fast.split(t), general.split(t), "{t:?}");
            }
        }
    }

    #[test]
    fn collapsed_regex_rewrite() {
        assert_eq!(collapse_regex(r"[^\s\p{L}]\p{N}").unwrap(), "[^\\s\u{D2}A-Za-z][\u{D1}0-9]");
        // Digits split one by one, the rest kept as gaps.
        assert_eq!(split(&[r"\p{N}"], "ab12٣"), ["ab", "1", "2", "٣"]);
    }
}
