//! Source rewrites for Jinja extensions minijinja does not parse.
//!
//! transformers' `AssistantTracker` extension adds a
//! `{% generation %}...{% endgeneration %}` block that renders its body
//! unchanged (it only records which output bytes the assistant produced, for
//! training masks). We rewrite it to `{% if true %}...{% endif %}`, which
//! renders the same and keeps the tag's whitespace-control markers, so
//! `trim_blocks`/`lstrip_blocks` and `-` trimming behave exactly as before.
//! Lines are preserved, so error line numbers still point into the original.

use std::borrow::Cow;

/// Rewrites `{% generation %}` / `{% endgeneration %}` tags (with any `-`/`+`
/// markers) into an always-true `if` block.
pub(crate) fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut changed = false;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match parse_tag(tag) {
            Some((len, left, word, right)) if word == "generation" || word == "endgeneration" => {
                let body = if word == "generation" {
                    "if true"
                } else {
                    "endif"
                };
                out.push_str(&format!("{{%{left} {body} {right}%}}"));
                rest = &tag[len..];
                changed = true;
            }
            _ => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(source)
    }
}

/// Parses `{%[-+]? word [-+]?%}` at the start of `s`; returns the tag's byte
/// length, the two markers and the word.
fn parse_tag(s: &str) -> Option<(usize, &str, &str, &str)> {
    let inner = s.strip_prefix("{%")?;
    let (left, inner) = split_marker(inner);
    let trimmed = inner.trim_start();
    let word_len = trimmed
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(trimmed.len());
    let word = &trimmed[..word_len];
    let after = trimmed[word_len..].trim_start();
    let (right, after) = match after.chars().next() {
        Some(c @ ('-' | '+')) => (&after[..c.len_utf8()], &after[c.len_utf8()..]),
        _ => ("", after),
    };
    let after_close = after.strip_prefix("%}")?;
    Some((s.len() - after_close.len(), left, word, right))
}

fn split_marker(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some(c @ ('-' | '+')) => (&s[..c.len_utf8()], &s[c.len_utf8()..]),
        _ => ("", s),
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite_generation_tags;

    #[test]
    fn rewrites_tags_keeping_markers() {
        let src =
            "a{%- generation -%}b{% endgeneration %}c{% if add_generation_prompt %}d{% endif %}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{%- if true -%}b{% endif %}c{% if add_generation_prompt %}d{% endif %}"
        );
        assert_eq!(
            rewrite_generation_tags("{% if x %}{% endif %}"),
            "{% if x %}{% endif %}"
        );
    }
}
