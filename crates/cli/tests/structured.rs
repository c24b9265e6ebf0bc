//! Structured output and tools through `hearth serve` (SmolLM2 135M): `response_format`
//! JSON schemas, forced and automatic tool calls, streaming of calls, errors, and a
//! constrained request batched beside an unconstrained one. The model is tiny, so what
//! it writes is silly; it must be valid by construction. Schemas are checked with the
//! `jsonschema` crate, independently of llguidance.

mod common;

use common::server::Server;
use serde_json::{json, Value};

/// `value` is valid under `schema` (else the errors).
fn assert_valid(schema: &Value, value: &Value, what: &str) {
    let v = jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("{what}: the test's schema is invalid: {e}"));
    let errors: Vec<String> = v.iter_errors(value).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what}: {value} does not follow {schema}: {errors:?}");
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Twenty prompts with twenty schemas: objects, nesting, arrays, enums, numbers with
/// bounds, booleans, nullable and optional fields, a top-level array, `anyOf`, `$ref`.
/// Strings and arrays are bounded, and all numbers but one are integers: a 135M model
/// may write a number's digits (or a string) until `max_tokens`, which is valid JSON
/// so far but not finished (`finish_reason` `length`; seen with `HEARTH_SIMD=scalar`).
fn cases() -> Vec<(&'static str, Value)> {
    let s = |max: u32| json!({"type": "string", "maxLength": max});
    vec![
        (
            "Give me a person's name and age.",
            json!({"type": "object", "properties": {"name": s(20), "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        ),
        ("What is the capital of France?", json!({"type": "object", "properties": {"capital": s(30)}, "required": ["capital"]})),
        (
            "Is the sky blue?",
            json!({"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": false}),
        ),
        ("Pick a color.", json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]})),
        (
            "List three fruits.",
            json!({"type": "object", "properties": {"fruits": {"type": "array", "items": s(15), "minItems": 3, "maxItems": 3}}, "required": ["fruits"]}),
        ),
        (
            "Rate this movie from 1 to 5.",
            json!({"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": s(40)}, "required": ["stars", "comment"]}),
        ),
        (
            "Describe a book.",
            json!({"type": "object", "properties": {"title": s(30), "author": {"type": "object", "properties": {"first": s(15), "last": s(15)}, "required": ["first", "last"], "additionalProperties": false}, "year": {"type": "integer", "minimum": 1400, "maximum": 2030}}, "required": ["title", "author", "year"], "additionalProperties": false}),
        ),
        (
            "Give the temperature in Oslo.",
            json!({"type": "object", "properties": {"celsius": {"type": "number", "minimum": -60, "maximum": 60}}, "required": ["celsius"]}),
        ),
        ("Name two planets.", json!({"type": "array", "items": s(12), "minItems": 2, "maxItems": 2})),
        ("Say hello.", json!({"type": "string", "maxLength": 30})),
        ("How many legs does a spider have?", json!({"type": "integer", "minimum": 0, "maximum": 100})),
        (
            "Who wrote Hamlet? Say null if unsure.",
            json!({"type": "object", "properties": {"author": {"anyOf": [s(30), {"type": "null"}]}}, "required": ["author"]}),
        ),
        (
            "Make a to-do list.",
            json!({"type": "object", "properties": {"items": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {"task": s(25), "done": {"type": "boolean"}}, "required": ["task", "done"], "additionalProperties": false}}}, "required": ["items"], "additionalProperties": false}),
        ),
        (
            "Give a point on a map.",
            json!({"type": "object", "properties": {"lat": {"type": "integer", "minimum": -90, "maximum": 90}, "lon": {"type": "integer", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"], "additionalProperties": false}),
        ),
        (
            "Is 7 prime? Answer yes or no with a reason.",
            json!({"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}, "reason": s(50)}, "required": ["verdict", "reason"], "additionalProperties": false}),
        ),
        (
            "Describe a dog.",
            json!({"type": "object", "properties": {"breed": s(20), "weight_kg": {"type": "integer", "minimum": 0, "maximum": 100}, "friendly": {"type": "boolean"}}, "required": ["breed", "weight_kg", "friendly"], "additionalProperties": false}),
        ),
        (
            "Convert 3 km to meters.",
            json!({"type": "object", "properties": {"meters": {"type": "integer", "minimum": 0, "maximum": 100000}, "unit": {"const": "m"}}, "required": ["meters", "unit"]}),
        ),
        (
            "Tag this sentence: 'I love pizza'.",
            json!({"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}, "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,10}$"}, "maxItems": 3}}, "required": ["sentiment", "tags"], "additionalProperties": false}),
        ),
        (
            "Describe an address.",
            json!({"$defs": {"street": {"type": "object", "properties": {"name": s(20), "number": {"type": "integer", "minimum": 1, "maximum": 999}}, "required": ["name", "number"], "additionalProperties": false}}, "type": "object", "properties": {"street": {"$ref": "#/$defs/street"}, "city": s(20)}, "required": ["street", "city"], "additionalProperties": false}),
        ),
        (
            "Give a shape.",
            json!({"anyOf": [{"type": "object", "properties": {"circle_radius": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["circle_radius"], "additionalProperties": false}, {"type": "object", "properties": {"square_side": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["square_side"], "additionalProperties": false}]}),
        ),
    ]
}

/// Each of the twenty schemas, greedy and sampled: the content parses and follows the
/// schema, and the answer stops when the JSON is complete (not at `max_tokens`).
#[test]
fn json_schema_output_follows_the_schema() {
    let s = Server::start(&["--parallel", "4"]);
    let cases = cases();
    assert_eq!(cases.len(), 20);
    let results: Vec<(usize, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, (prompt, schema))| {
                let s = &s;
                sc.spawn(move || {
                    // Half greedy, half sampled (sampling must respect the mask too).
                    let temperature = if i % 2 == 0 { 0.0 } else { 0.9 };
                    let body = json!({"messages": user(prompt), "max_tokens": 200, "temperature": temperature, "seed": i,
                        "response_format": {"type": "json_schema", "json_schema": {"name": format!("case{i}"), "schema": schema, "strict": true}}});
                    let (st, r) = s.post("/v1/chat/completions", &body);
                    assert_eq!(st, 200, "case {i}: {r}");
                    (i, r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, r) in results {
        let c = &r["choices"][0];
        let content = c["message"]["content"].as_str().unwrap_or_else(|| panic!("case {i}: {r}"));
        assert_eq!(c["finish_reason"], "stop", "case {i}: {content}");
        let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("case {i}: {e}: {content:?}"));
        assert_valid(&cases[i].1, &value, &format!("case {i} ({})", cases[i].0));
    }
    // json_object, and /v1/completions with a schema.
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": user("Describe a cat in JSON."), "max_tokens": 200, "temperature": 0,
        "response_format": {"type": "json_object"}}),
    );
    assert_eq!(st, 200, "{r}");
    // (Any object: unbounded, so a string may run to `max_tokens`, as with
    // HEARTH_SIMD=scalar; then the text so far is the start of an object.)
    let content = r["choices"][0]["message"]["content"].as_str().unwrap();
    if r["choices"][0]["finish_reason"] == "stop" {
        let obj: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
        assert!(obj.is_object(), "{obj}");
    } else {
        assert!(content.starts_with('{'), "{r}");
    }
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]});
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": "A JSON object with one digit:", "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": schema}}}),
    );
    assert_eq!(st, 200, "{r}");
    let v: Value = serde_json::from_str(r["choices"][0]["text"].as_str().unwrap()).unwrap();
    assert_valid(&schema, &v, "completion");
    // The mask time is exported.
    let m = s.get("/metrics");
    let count: u64 = m.lines().find_map(|l| l.strip_prefix("hearth_constraint_mask_seconds_count ")).unwrap().trim().parse().unwrap();
    assert!(count >= 22, "{m}");
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}}})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}}, "required": ["zone"]}}})
}

/// The calls of a whole chat answer: (name, arguments as JSON).
fn calls_of(r: &Value) -> Vec<(String, Value)> {
    let m = &r["choices"][0]["message"];
    m["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {r}"))
        .iter()
        .map(|c| {
            assert_eq!(c["type"], "function", "{r}");
            assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{r}");
            let args = c["function"]["arguments"].as_str().unwrap_or_else(|| panic!("arguments not a string: {r}"));
            (c["function"]["name"].as_str().unwrap().to_string(), serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {args}")))
        })
        .collect()
}

/// `required` and a named function force a call whose arguments follow the function's
/// schema: `content` null, `finish_reason` "tool_calls"; greedy and sampled.
#[test]
fn forced_tool_calls_follow_the_parameters_schema() {
    let s = Server::start(&["--parallel", "2"]);
    let tools = json!([weather_tool(), time_tool()]);
    let schema_of =
        |name: &str| tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap()["function"]["parameters"].clone();
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    for (choice, temperature, prompt) in [
        (json!("required"), 0.0, "What's the weather in Paris?"),
        (json!("required"), 0.8, "Is it raining in Tokyo?"),
        (named.clone(), 0.0, "What time is it in Berlin?"),
        (named, 0.7, "Tell me the time."),
    ] {
        let body = json!({"messages": user(prompt), "tools": tools, "tool_choice": choice, "temperature": temperature, "seed": 3, "max_tokens": 120});
        let (st, r) = s.post("/v1/chat/completions", &body);
        assert_eq!(st, 200, "{r}");
        let c = &r["choices"][0];
        assert_eq!((c["finish_reason"].as_str(), &c["message"]["content"]), (Some("tool_calls"), &Value::Null), "{r}");
        let calls = calls_of(&r);
        assert_eq!(calls.len(), 1, "{r}");
        let (name, args) = &calls[0];
        if choice.is_object() {
            assert_eq!(name, "get_time", "{r}");
        }
        assert_valid(&schema_of(name), args, &format!("{prompt}: {name}"));
    }
}

/// Streamed, the calls come as `delta.tool_calls` chunks (id, type and name first, then
/// the arguments) that assemble to the whole answer's calls at temperature 0.
#[test]
fn streamed_tool_calls_assemble_to_the_whole_answer() {
    let s = Server::start(&["--parallel", "2"]);
    let body = json!({"messages": user("What's the weather in Rome, in celsius?"), "tools": [weather_tool(), time_tool()],
        "tool_choice": "required", "temperature": 0, "max_tokens": 120});
    let (st, whole) = s.post("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{whole}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = s.stream("/v1/chat/completions", &streamed);
    let (mut id, mut name, mut args, mut finish) = (None, String::new(), String::new(), None);
    for ch in &chunks {
        let c = &ch["choices"][0];
        assert!(c["delta"]["content"].as_str().unwrap_or("").is_empty(), "content streamed beside a forced call: {ch}");
        for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(tc["index"], 0, "{ch}");
            if let Some(i) = tc["id"].as_str() {
                assert!(id.replace(i.to_string()).is_none(), "two ids: {ch}");
                assert_eq!(tc["type"], "function");
            }
            name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
            args.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert!(id.is_some_and(|i| i.starts_with("call_")), "{chunks:?}");
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let got = (name, serde_json::from_str::<Value>(&args).unwrap());
    assert_eq!(vec![got], calls_of(&whole));
}

/// A forced call cut by `max_tokens` is still a call, as OpenAI returns one: the tool's
/// name with the arguments so far, `content` null and `finish_reason` "length", whole and
/// streamed alike. (It was returned as `content` holding the `<tool_call>` markup.)
#[test]
fn a_tool_call_cut_by_max_tokens_is_a_call_with_finish_length() {
    let s = Server::start(&["--parallel", "2"]);
    let mut body = json!({"messages": user("What's the weather in Rome, in celsius?"), "tools": [weather_tool(), time_tool()],
        "tool_choice": "required", "temperature": 0, "max_tokens": 120});
    let (st, whole) = s.post("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{whole}");
    let (name, args) = calls_of(&whole).remove(0);
    let n = whole["usage"]["completion_tokens"].as_u64().unwrap();
    // Cut inside the arguments: the name is whole by then.
    body["max_tokens"] = json!(n * 2 / 3);
    let (st, cut) = s.post("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{cut}");
    let c = &cut["choices"][0];
    assert_eq!((c["finish_reason"].as_str(), &c["message"]["content"]), (Some("length"), &Value::Null), "{cut}");
    let calls = c["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("no tool_calls: {cut}"));
    assert_eq!((calls.len(), calls[0]["function"]["name"].as_str()), (1, Some(name.as_str())), "{cut}");
    let partial = calls[0]["function"]["arguments"].as_str().unwrap();
    assert!(partial.starts_with('{') && serde_json::from_str::<Value>(partial).is_err(), "{cut}");
    // Its first key is the whole call's.
    let key = args.as_object().unwrap().keys().next().unwrap();
    assert!(partial.len() < 3 + key.len() || partial.contains(&format!("\"{key}\"")), "{partial} vs {args}");
    // Streamed: the same call, then the same finish.
    body["stream"] = json!(true);
    let (mut got_name, mut got_args, mut finish) = (String::new(), String::new(), None);
    for ch in s.stream("/v1/chat/completions", &body) {
        let c = &ch["choices"][0];
        assert!(c["delta"]["content"].as_str().unwrap_or("").is_empty(), "content streamed: {ch}");
        for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            got_name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
            got_args.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
        finish = c["finish_reason"].as_str().map(String::from).or(finish);
    }
    assert_eq!((got_name.as_str(), got_args.as_str(), finish.as_deref()), (name.as_str(), partial, Some("length")));
}

/// `auto`: the model answers in text or calls a tool; either way the answer is
/// well-formed. A conversation holding an earlier call and its result is accepted, and
/// `none` answers in text.
#[test]
fn auto_and_none_and_tool_results_in_the_conversation() {
    let s = Server::start(&["--parallel", "2"]);
    let tools = json!([weather_tool()]);
    for prompt in ["Hi! How are you?", "What's the weather in Madrid in celsius?"] {
        let (st, r) =
            s.post("/v1/chat/completions", &json!({"messages": user(prompt), "tools": tools, "temperature": 0, "max_tokens": 60}));
        assert_eq!(st, 200, "{r}");
        let c = &r["choices"][0];
        if c["message"]["tool_calls"].is_array() {
            assert_eq!(c["finish_reason"], "tool_calls", "{r}");
            for (_, args) in calls_of(&r) {
                assert_valid(&weather_tool()["function"]["parameters"], &args, prompt);
            }
        } else {
            let text = c["message"]["content"].as_str().unwrap();
            assert!(!text.trim_start().starts_with("<tool_call>"), "{r}");
        }
    }
    let convo = json!([
        {"role": "user", "content": "What's the weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 4}"},
    ]);
    for choice in ["auto", "none"] {
        let (st, r) = s.post(
            "/v1/chat/completions",
            &json!({"messages": convo, "tools": tools, "tool_choice": choice, "temperature": 0, "max_tokens": 30}),
        );
        assert_eq!(st, 200, "{r}");
        if choice == "none" {
            assert!(r["choices"][0]["message"]["content"].is_string() && r["choices"][0]["message"].get("tool_calls").is_none(), "{r}");
        }
    }
}

/// Bad schemas and tools are 400s naming the field, with llguidance's reason; the server
/// goes on.
#[test]
fn bad_schemas_and_tools_are_400_naming_the_field() {
    let s = Server::start(&["--parallel", "1"]);
    let rf = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    for (body, param) in [
        (json!({"messages": user("x"), "response_format": rf(json!({"type": "integer_number"}))}), "response_format"),
        (json!({"messages": user("x"), "response_format": rf(json!({"$ref": "#/$defs/missing"}))}), "response_format"),
        (json!({"messages": user("x"), "response_format": {"type": "json_schema"}}), "response_format"),
        (
            json!({"messages": user("x"), "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}], "tool_choice": "required"}),
            "tools",
        ),
        (
            json!({"messages": user("x"), "tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"messages": user("x"), "tool_choice": "required"}), "tool_choice"),
    ] {
        let (st, r) = s.post("/v1/chat/completions", &body);
        assert_eq!((st, r["error"]["param"].as_str()), (400, Some(param)), "{body}: {r}");
        assert!(r["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{r}");
    }
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "x", "response_format": rf(json!({"type": "objec"}))}));
    assert_eq!((st, r["error"]["param"].as_str()), (400, Some("response_format")), "{r}");
    let (st, r) = s.post("/v1/chat/completions", &json!({"messages": user("x"), "max_tokens": 3}));
    assert_eq!(st, 200, "{r}");
}

/// A constrained request batched beside an unconstrained one leaves the latter's tokens
/// and log-probabilities as they are alone.
#[test]
fn a_constrained_neighbour_leaves_an_unconstrained_request_unchanged() {
    let s = Server::start(&["--parallel", "2"]);
    let plain = json!({"prompt": "The three primary colors are", "max_tokens": 40, "temperature": 0, "logprobs": 1, "ignore_eos": true});
    let tokens = |r: &Value| {
        (
            r["choices"][0]["text"].clone(),
            r["choices"][0]["logprobs"]["tokens"].clone(),
            r["choices"][0]["logprobs"]["token_logprobs"].clone(),
        )
    };
    let (st, alone) = s.post("/v1/completions", &plain);
    assert_eq!(st, 200, "{alone}");
    let schema = json!({"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}}, "required": ["colors"]});
    let constrained = json!({"messages": user("List the primary colors."), "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}});
    let (together, other) = std::thread::scope(|sc| {
        let c = sc.spawn(|| s.post("/v1/chat/completions", &constrained));
        let p = sc.spawn(|| s.post("/v1/completions", &plain));
        (p.join().unwrap(), c.join().unwrap())
    });
    assert_eq!((together.0, other.0), (200, 200), "{} {}", together.1, other.1);
    assert_eq!(tokens(&together.1), tokens(&alone), "the unconstrained request changed beside a constrained one");
    let v: Value = serde_json::from_str(other.1["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_valid(&schema, &v, "the constrained neighbour");
    // They shared steps.
    let m = s.get("/metrics");
    let b = |le: &str| -> u64 {
        m.lines().find_map(|l| l.strip_prefix(&format!("hearth_batch_sequences_bucket{{le=\"{le}\"}} "))).unwrap().trim().parse().unwrap()
    };
    assert!(b("+Inf") > b("1"), "no step ran both:\n{m}");
}
