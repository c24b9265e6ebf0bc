//! Renders the reference chat templates (llama.cpp's `models/templates/`,
//! read from `$HEARTH_REFERENCE_DIR/chat-templates`) and checks the SmolLM2
//! template against the prompt llama.cpp produced.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hearth_chat::{ChatTemplate, Message};

fn reference_dir() -> PathBuf {
    match std::env::var_os("HEARTH_REFERENCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"),
    }
}

const SYSTEM: &str = "You are a terse test assistant.";
const USER_1: &str = "First question from the user?";
const ASSISTANT: &str = "First answer from the assistant.";
const USER_2: &str = "Second question from the user?";

fn conversation() -> Vec<Message> {
    vec![
        Message::new("system", SYSTEM),
        Message::new("user", USER_1),
        Message::new("assistant", ASSISTANT),
        Message::new("user", USER_2),
    ]
}

/// 2025-01-15, so templates that print today's date render reproducibly.
fn fixed_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_736_899_200)
}

fn template_files() -> Option<Vec<PathBuf>> {
    let dir = reference_dir().join("chat-templates");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!(
            "note: {} not found; skipping chat template tests",
            dir.display()
        );
        return None;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    files.sort();
    Some(files)
}

/// Renders every reference template with `extra` context; returns one line per failure.
fn render_all(extra: &serde_json::Map<String, serde_json::Value>) -> (usize, Vec<String>) {
    let Some(files) = template_files() else {
        return (0, Vec::new());
    };
    let messages = conversation();
    let mut failures = Vec::new();
    for path in &files {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let source = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{name}: cannot read: {e}"));
                continue;
            }
        };
        let result = ChatTemplate::with_fixed_time(&source, "<s>", "</s>", fixed_now())
            .and_then(|t| t.render_with_context(&messages, true, extra));
        match result {
            Err(e) => failures.push(format!("{name}: {e}")),
            Ok(out) => {
                for text in [USER_1, USER_2] {
                    if !out.contains(text) {
                        failures.push(format!("{name}: output lacks user text {text:?}:\n{out}"));
                    }
                }
                if !out.contains(SYSTEM) {
                    failures.push(format!("{name}: output lacks system text:\n{out}"));
                }
            }
        }
    }
    (files.len(), failures)
}

#[test]
fn all_reference_templates_render_a_conversation() {
    let (count, failures) = render_all(&serde_json::Map::new());
    if count > 0 {
        assert!(
            count >= 70,
            "expected the 70 reference templates, found {count}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {count} templates failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn all_reference_templates_accept_null_tools() {
    // HF passes `tools=None` when the request has no tools.
    let mut extra = serde_json::Map::new();
    extra.insert("tools".into(), serde_json::Value::Null);
    let (count, failures) = render_all(&extra);
    assert!(
        failures.is_empty(),
        "{} of {count} templates failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// SmolLM2's embedded template, one user message, must reproduce llama.cpp's
/// prompt byte for byte (`smollm2/prompts/p3_chat.txt`).
#[test]
fn smollm2_template_matches_llama_cpp() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        eprintln!(
            "note: {} not found; skipping SmolLM2 template test",
            model.display()
        );
        return;
    }
    let expected_path = reference_dir().join("smollm2/prompts/p3_chat.txt");
    let Ok(expected) = std::fs::read_to_string(&expected_path) else {
        eprintln!(
            "note: {} not found; skipping SmolLM2 template test",
            expected_path.display()
        );
        return;
    };
    let gguf = hearth_gguf::GgufFile::open(&model).expect("open SmolLM2 GGUF");
    let source = gguf
        .get_str("tokenizer.chat_template")
        .expect("tokenizer.chat_template");
    // SmolLM2: <|im_start|> (id 1) / <|im_end|> (id 2); this template prints neither.
    let template = ChatTemplate::new(source, "<|im_start|>", "<|im_end|>").expect("compile");
    let caps = template.capabilities();
    assert!(
        caps.supports_system_role && !caps.requires_typed_content,
        "{caps:?}"
    );
    let prompt = template
        .render(&[Message::new("user", "What is 2+2?")], true)
        .expect("render");
    assert_eq!(prompt, expected);
}

/// Gemma 2 rejects system messages; the system text must reach the model
/// folded into the first user turn, as llama.cpp does.
#[test]
fn system_role_is_polyfilled_when_template_rejects_it() {
    let path = reference_dir().join("chat-templates/google-gemma-2-2b-it.jinja");
    let Ok(source) = std::fs::read_to_string(&path) else {
        eprintln!("note: {} not found; skipping", path.display());
        return;
    };
    let template = ChatTemplate::new(&source, "<bos>", "<eos>").expect("compile");
    assert!(!template.capabilities().supports_system_role);
    let out = template.render(&conversation(), true).expect("render");
    let expected = format!(
        "<bos><start_of_turn>user\n{SYSTEM}\n{USER_1}<end_of_turn>\n<start_of_turn>model\n{ASSISTANT}<end_of_turn>\n\
         <start_of_turn>user\n{USER_2}<end_of_turn>\n<start_of_turn>model\n"
    );
    assert_eq!(out, expected);
}

/// The fuel cap (`hearth_chat::MAX_FUEL`) stops runaway templates only: every
/// reference template renders a 1,000-message conversation within it. (A template that
/// rendered before would fail under the cap if this did not hold.)
#[test]
fn reference_templates_render_long_conversations_within_the_fuel_cap() {
    let Some(files) = template_files() else { return };
    let mut messages = vec![Message::new("system", SYSTEM)];
    for i in 0..500 {
        messages.push(Message::new("user", format!("question {i}?")));
        messages.push(Message::new("assistant", format!("answer {i}.")));
    }
    messages.push(Message::new("user", USER_2));
    let (mut failures, mut rendered) = (Vec::new(), 0);
    for path in &files {
        let source = std::fs::read_to_string(path).unwrap();
        let Ok(t) = ChatTemplate::with_fixed_time(&source, "<s>", "</s>", fixed_now()) else { continue };
        // Templates that reject this conversation for their own reasons (role order,
        // raise_exception) are not about the cap; only running out of fuel is.
        match t.render(&messages, true) {
            Ok(out) => {
                assert!(out.contains("answer 499."), "{}: the conversation is cut short", path.display());
                rendered += 1;
            }
            Err(e) if e.to_string().contains("fuel") => failures.push(format!("{}: {e}", path.display())),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(rendered * 10 >= files.len() * 9, "only {rendered} of {} templates rendered", files.len());
}

/// `render_marked` finds every message's content in the text for the templates that
/// copy contents verbatim, and says `None` (rather than wrong ranges) for the others.
/// Control: a template that trims contents gets `None`.
#[test]
fn marked_render_locates_message_contents() {
    let Some(files) = template_files() else {
        return;
    };
    let messages = conversation();
    let (mut located, mut rendered) = (0, 0);
    for path in &files {
        let Ok(source) = std::fs::read_to_string(path) else {
            continue;
        };
        let Ok(t) = ChatTemplate::with_fixed_time(&source, "<s>", "</s>", fixed_now()) else {
            continue;
        };
        let Ok(r) = t.render_marked(&messages, true) else {
            continue;
        };
        rendered += 1;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        assert_eq!(r.text, t.render(&messages, true).unwrap(), "{name}");
        if let Some(ranges) = &r.contents {
            located += 1;
            for text in [USER_1, ASSISTANT, USER_2] {
                assert!(ranges.iter().any(|g| &r.text[g.clone()] == text), "{name}: {text:?} not among {ranges:?}");
            }
            for g in ranges {
                assert!(messages.iter().any(|m| m.content == r.text[g.clone()]), "{name}: {g:?}");
            }
        }
    }
    eprintln!("contents located in {located} of {rendered} rendered templates");
    assert!(located * 10 >= rendered * 8, "only {located} of {rendered}");
    let trims = ChatTemplate::new("{% for m in messages %}[{{ m.content | trim }}]{% endfor %}", "", "").unwrap();
    let r = trims.render_marked(&[Message::new("user", " padded ")], false).unwrap();
    assert_eq!((r.text.as_str(), r.contents), ("[padded]", None));
    let copies = ChatTemplate::new("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", "", "").unwrap();
    let r = copies.render_marked(&[Message::new("user", "a<b>"), Message::new("assistant", "")], false).unwrap();
    assert_eq!(r.text, "<user>a<b><assistant>");
    assert_eq!(r.contents, Some(std::iter::once(6..10).collect()));
}
