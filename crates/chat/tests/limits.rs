//! Templates come from GGUF files, i.e. from strangers: one that loops, recurses or
//! prints without end must fail with an error, quickly, instead of hanging the server
//! or filling memory. (Inputs of this kind hung the `chat_template` fuzz target before
//! the caps; see docs/FUZZING.md.)

use hearth_chat::{ChatError, ChatTemplate, Message};
use std::time::{Duration, Instant};

fn render(source: &str) -> Result<String, ChatError> {
    ChatTemplate::new(source, "<s>", "</s>")?.render(&[Message::new("user", "hi")], true)
}

/// Fails with a render error naming the cause, in well under the time a hang would take.
fn assert_stops(source: &str, cause: &str) {
    let start = Instant::now();
    let err = render(source).expect_err("a runaway template must fail");
    assert!(matches!(err, ChatError::Render { .. }), "{source}: {err:?}");
    assert!(err.to_string().contains(cause), "{source}: {err}");
    assert!(start.elapsed() < Duration::from_secs(30), "{source}: took {:?}", start.elapsed());
}

#[test]
fn nested_huge_ranges_run_out_of_fuel() {
    // 10^10 iterations: each range is within minijinja's 100,000-item cap.
    assert_stops("{% for i in range(99999) %}{% for j in range(99999) %}{{ i }}{% endfor %}{% endfor %}", "fuel");
}

#[test]
fn macro_recursion_in_a_loop_runs_out_of_fuel() {
    // Depth stays under minijinja's recursion limit, the fan-out makes it exponential.
    assert_stops(
        "{% macro f(n) %}{% if n > 0 %}{% for _ in range(4) %}{{ f(n - 1) }}{% endfor %}{% endif %}{% endmacro %}{{ f(40) }}",
        "fuel",
    );
}

#[test]
fn unbounded_recursion_is_an_error() {
    let err = render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").expect_err("endless recursion must fail");
    assert!(matches!(err, ChatError::Render { .. }), "{err:?}");
}

#[test]
fn huge_output_is_cut_off() {
    // 100 MB per iteration (minijinja's limit for one repeated string), far past the
    // output cap after a few iterations and long before the fuel runs out.
    assert_stops("{% for i in range(100) %}{{ 'x' * 99999999 }}{% endfor %}", "exceeds");
}

#[test]
fn ordinary_templates_are_unaffected() {
    let out = render("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
        .unwrap();
    assert_eq!(out, "<|user|>hi<|assistant|>");
}
