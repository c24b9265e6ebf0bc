//! Constrained decoding with llguidance (the library llama.cpp uses): a grammar (a JSON
//! schema, or a Lark grammar for tool calls) becomes, at every step, the set of tokens
//! that keep the output a prefix of something the grammar accepts; the others get
//! logit −∞ before sampling, so greedy and sampled output are valid by construction.
//!
//! The token trie (every token's bytes) and llguidance's parser factory are built once
//! per model, on the first constrained request, and shared by all sequences; each
//! sequence has its own [`Constraint`] (a matcher), built in the request handler so that
//! a bad grammar is a 400 before the request is queued.

use hearth_tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::sync::{Arc, OnceLock};

/// The per-model part: the factory that compiles grammars against the vocabulary.
#[derive(Default)]
pub struct Grammars {
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("built", &self.factory.get().is_some()).finish()
    }
}

impl Grammars {
    /// The factory for `tok`'s vocabulary (built on first use; later calls share it).
    fn factory(&self, tok: &Tokenizer) -> Result<Arc<ParserFactory>, String> {
        self.factory.get_or_init(|| build_factory(tok).map(Arc::new)).clone()
    }

    /// A matcher for `grammar`, or llguidance's message when it does not compile
    /// (an unsupported or contradictory schema, a Lark syntax error).
    pub fn constraint(&self, tok: &Tokenizer, grammar: TopLevelGrammar) -> Result<Constraint, String> {
        let factory = self.factory(tok)?;
        let parser = factory.create_parser(grammar).map_err(|e| brief(&e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(brief(&e));
        }
        // A grammar that compiles may still match nothing (a schema `{"$ref": "#"}` is
        // only itself): its first mask fails. Found here, it is the client's 400, not a
        // failed request after it was queued.
        let first = match matcher.compute_mask_or_eos() {
            Err(e) => return Err(format!("the grammar matches no text ({})", brief(&e.to_string()))),
            Ok(m) if m.is_zero() => return Err("the grammar matches no text".into()),
            Ok(m) => m,
        };
        Ok(Constraint { matcher, first: Some(first), masked: Vec::new() })
    }
}

/// llguidance's message on one line (at most 400 characters), without the parser state
/// its errors may carry (`<state>…</state><grammar>…`), which is no use to a client.
fn brief(e: &str) -> String {
    let e = e.split("<state>").next().unwrap_or(e);
    // One line; a regex error's reason comes on the lines after "regex parse error:".
    let one: Vec<&str> = e.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let one = if one.is_empty() { "llguidance failed".to_string() } else { one.join(" ") };
    match one.char_indices().nth(400) {
        Some((cut, _)) => format!("{}…", &one[..cut]),
        None => one,
    }
}

/// The token trie and factory for `tok`. A token's bytes are what it adds to the text;
/// control tokens get llguidance's special-token marker (0xFF, never valid UTF-8) in
/// front of their text, so that no grammar literal can be spelled with them (a user
/// schema's `"<|im_end|>"` is text, not the end of the turn). End-of-generation tokens
/// are the grammar's EOS: allowed exactly when the grammar may end.
fn build_factory(tok: &Tokenizer) -> Result<ParserFactory, String> {
    let n = tok.n_vocab();
    let eog: Vec<u32> = tok.eog_tokens().iter().copied().filter(|&t| (t as usize) < n).collect();
    let Some(&first_eos) = tok.eot().or(tok.eos()).filter(|&t| (t as usize) < n).as_ref().or(eog.first()) else {
        return Err("this model has no end-of-generation token, which constrained decoding needs".into());
    };
    let mut eos = vec![first_eos];
    eos.extend(eog.iter().copied().filter(|&t| t != first_eos));
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| {
            if tok.is_control(id) || tok.decode_token(id).is_empty() {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(&tok.piece(id, true));
                w
            } else {
                tok.decode_token(id).to_vec()
            }
        })
        .collect();
    let info = TokRxInfo { tok_bos: tok.bos(), tok_pad: tok.pad(), tok_unk: tok.unk(), ..TokRxInfo::new(n as u32, first_eos) };
    // toktrie asserts on malformed input (it never happens for a loaded vocabulary, but
    // a panic would take the scheduler's request handler with it): turn it into an error.
    let built = std::panic::catch_unwind(|| {
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        ParserFactory::new_simple(&env)
    });
    let mut factory = match built {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return Err(format!("the token trie for constrained decoding failed: {e}")),
        Err(_) => return Err("the token trie for constrained decoding failed on this vocabulary".into()),
    };
    // llguidance's warnings go to its buffer, not the server's stderr.
    factory.quiet();
    Ok(factory)
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    /// The mask of the first step, computed when the constraint was built (a grammar that
    /// matches nothing is refused there): the first `mask` takes it instead of computing it
    /// again, which on a large vocabulary is the costliest mask of the request.
    first: Option<SimpleVob>,
    /// The logits row with the mask applied (the scheduler's rows are shared, read-only).
    masked: Vec<f32>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

impl Constraint {
    /// `logits` with every token the grammar does not allow here set to −∞ (tokens past
    /// the tokenizer's vocabulary, padding rows of the output matrix, are never allowed).
    /// Fails with llguidance's message when the matcher is in an error state.
    pub fn mask<'a>(&'a mut self, logits: &[f32]) -> Result<&'a [f32], String> {
        let allowed = match self.first.take() {
            Some(m) => m,
            None => self.matcher.compute_mask_or_eos().map_err(|e| brief(&e.to_string()))?,
        };
        self.masked.clear();
        self.masked.extend(logits.iter().enumerate().map(|(i, &l)| if allowed.is_allowed(i as u32) { l } else { f32::NEG_INFINITY }));
        if self.masked.iter().all(|l| *l == f32::NEG_INFINITY) {
            return Err("the grammar allows no token here".into());
        }
        Ok(&self.masked)
    }

    /// Advance the grammar by the sampled token.
    pub fn commit(&mut self, id: u32) -> Result<(), String> {
        // The first mask is for the state before any token.
        self.first = None;
        self.matcher.consume_token(id).map_err(|e| brief(&e.to_string()))
    }

    /// The grammar is complete: nothing more may be generated.
    pub fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// The grammar for `response_format`: `json_object` is any JSON object, `json_schema`
/// its schema (llguidance's JSON-schema subset; unsupported keywords are an error
/// rather than silently ignored).
pub fn json_grammar(schema: Option<&serde_json::Value>) -> TopLevelGrammar {
    let schema = schema.cloned().unwrap_or_else(|| serde_json::json!({"type": "object"}));
    TopLevelGrammar::from_json_schema(schema)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_model::Model;

    fn model() -> Model {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(path.is_file(), "{} is missing: run scripts/fetch-models.sh", path.display());
        Model::load(&path).unwrap()
    }

    /// Walking a schema's valid text token by token, every token is allowed and the
    /// grammar ends; a token that breaks the schema is masked out; control tokens
    /// cannot spell grammar text.
    #[test]
    fn the_mask_follows_the_schema() {
        let model = model();
        let tok = &model.tokenizer;
        let g = Grammars::default();
        let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                                        "additionalProperties": false});
        let mut c = g.constraint(tok, json_grammar(Some(&schema))).unwrap();
        let logits = vec![0.0f32; model.config.n_vocab];
        let text = tok.encode(r#"{"n": 42}"#, false, false);
        let bad = tok.encode("x", false, false)[0];
        let im_end = tok.token_id("<|im_end|>").unwrap();
        for (i, &t) in text.iter().enumerate() {
            let m = c.mask(&logits).unwrap();
            assert!(m[t as usize].is_finite(), "token {i} ({:?}) masked", tok.token_text(t));
            assert_eq!(m[bad as usize], f32::NEG_INFINITY);
            assert_eq!(m[im_end as usize], f32::NEG_INFINITY, "end of turn inside the object");
            c.commit(t).unwrap();
        }
        // The first mask is kept from the refusal check; a token committed before it was
        // asked for makes it stale (control: a second `{` is allowed before the first).
        let open = tok.encode("{", false, false)[0];
        let mut fresh = g.constraint(tok, json_grammar(Some(&schema))).unwrap();
        assert!(fresh.mask(&logits).unwrap()[open as usize].is_finite());
        let mut fresh = g.constraint(tok, json_grammar(Some(&schema))).unwrap();
        fresh.commit(open).unwrap();
        assert_eq!(fresh.mask(&logits).unwrap()[open as usize], f32::NEG_INFINITY, "a stale first mask after a commit");
        // After the closing brace only the end of generation is allowed.
        let m = c.mask(&logits).unwrap().to_vec();
        assert!(m[im_end as usize].is_finite());
        assert_eq!(m.iter().filter(|l| l.is_finite()).count(), tok.eog_tokens().len());
        let bad_schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer_number"}}});
        let e = g.constraint(tok, json_grammar(Some(&bad_schema))).unwrap_err();
        assert!(e.contains("integer_number"), "{e}");
        // Schemas that compile but match nothing are refused before any token, briefly.
        let bad_regex = serde_json::json!({"type": "string", "pattern": "(("});
        let e = g.constraint(tok, json_grammar(Some(&bad_regex))).unwrap_err();
        assert!(e.contains("regex parse error") && e.len() > "regex parse error:".len() + 8 && !e.contains('\n'), "{e}");
        for empty in [serde_json::json!({"$ref": "#"}), serde_json::json!({"allOf": [{"$ref": "#"}]})] {
            let e = g.constraint(tok, json_grammar(Some(&empty))).unwrap_err();
            assert!(e.starts_with("the grammar matches no text") && !e.contains("<state>") && !e.contains('\n'), "{empty}: {e}");
        }
    }
}
