"""hearth serve through the official `openai` Python client.

Run by crates/cli/tests/serve.rs against a running server:
    HEARTH_BASE_URL=http://127.0.0.1:PORT/v1 HEARTH_API_KEY=KEY python test_openai.py
Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""

import json
import os
import sys
import traceback

import jsonschema
import openai

BASE = os.environ["HEARTH_BASE_URL"]
KEY = os.environ["HEARTH_API_KEY"]
client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def chat(**kw):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0, max_tokens=24)
    args.update(kw)
    return client.chat.completions.create(**args)


def complete(**kw):
    args = dict(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12)
    args.update(kw)
    return client.completions.create(**args)


@check
def models_list_names_the_model():
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL] and MODEL.startswith("SmolLM2"), ids


@check
def chat_completion():
    r = chat()
    c = r.choices[0]
    assert r.object == "chat.completion" and c.message.role == "assistant", r
    assert isinstance(c.message.content, str) and c.message.content.strip(), r
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    u = r.usage
    assert u.prompt_tokens > 5 and 0 < u.completion_tokens <= 24 and u.total_tokens == u.prompt_tokens + u.completion_tokens, u


@check
def chat_streaming_matches_the_whole_answer():
    whole = chat().choices[0]
    chunks = list(chat(stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content, (text, whole.message.content)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.finish_reason], finals
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, chunks[-1]


@check
def completion_greedy_says_paris():
    r = complete()
    assert r.object == "text_completion", r
    assert "Paris" in r.choices[0].text, r.choices[0].text


@check
def completion_streaming_matches_the_whole_text():
    whole = complete().choices[0]
    text = "".join(c.choices[0].text for c in complete(stream=True))
    assert text == whole.text, (text, whole.text)


@check
def stop_strings_cut_the_text():
    full = complete(max_tokens=20).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    r = complete(max_tokens=20, stop=[stop, "never-appears"]).choices[0]
    assert r.finish_reason == "stop", r
    assert r.text == full[: full.index(stop)], (r.text, full, stop)
    r = complete(max_tokens=20, stop=stop).choices[0]  # a single string
    assert r.text == full[: full.index(stop)], (r.text, full, stop)


@check
def max_tokens_gives_finish_reason_length():
    r = complete(max_tokens=3)
    assert r.choices[0].finish_reason == "length", r
    assert r.usage.completion_tokens == 3, r.usage
    r = chat(max_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2, r


@check
def seeded_sampling_is_reproducible():
    a = complete(temperature=0.9, seed=42, max_tokens=16).choices[0].text
    b = complete(temperature=0.9, seed=42, max_tokens=16).choices[0].text
    assert a == b, (a, b)


@check
def logprobs_are_reported():
    r = chat(max_tokens=4, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content), content
    # Greedy: the chosen token is the most likely one.
    assert all(t.token == t.top_logprobs[0].token for t in content), content


@check
def bad_request_is_400_with_an_openai_error_body():
    for kw, param in [(dict(n=17), "n"), (dict(temperature=5), "temperature"), (dict(max_tokens=0), "max_tokens")]:
        try:
            chat(**kw)
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
            err = e.body
            assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"], err
        else:
            raise AssertionError(f"{kw} was accepted")
    try:
        complete(prompt="hello " * 5000)
    except openai.BadRequestError as e:
        assert e.code == "context_length_exceeded", e.body
    else:
        raise AssertionError("a prompt beyond the context was accepted")


@check
def wrong_key_is_401():
    bad = openai.OpenAI(base_url=BASE, api_key="wrong-" + KEY, max_retries=0)
    try:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    except openai.AuthenticationError as e:
        assert e.status_code == 401 and e.code == "invalid_api_key", e.body
    else:
        raise AssertionError("a wrong key was accepted")


@check
def n_choices():
    r = chat(n=3, temperature=0.9, seed=11, max_tokens=6)
    assert [c.index for c in r.choices] == [0, 1, 2], r
    assert all(c.finish_reason in ("stop", "length") for c in r.choices), r
    assert client.models.retrieve(MODEL).id == MODEL


@check
def a_fixed_client_model_name_is_served():
    # Clients that send a fixed name get the served model (--strict-model refuses them).
    r = chat(model="gpt-3.5-turbo", max_tokens=4)
    assert r.model == MODEL and r.usage.completion_tokens == 4, r


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@check
def forced_tool_call_validates():
    r = chat(messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=[WEATHER], tool_choice="required", max_tokens=100)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None, r
    [call] = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather", call
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # The call and its result go back into the conversation.
    r2 = chat(
        messages=[
            {"role": "user", "content": "What's the weather in Paris?"},
            c.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'},
        ],
        tools=[WEATHER],
        max_tokens=20,
    )
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls"), r2


@check
def streamed_tool_call_assembles_to_the_whole():
    kw = dict(messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
              tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=100)
    whole = chat(**kw).choices[0].message.tool_calls[0].function
    name, args, finish = "", "", None
    for ch in chat(stream=True, **kw):
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            assert tc.index == 0, tc
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    assert (name, json.loads(args)) == (whole.name, json.loads(whole.arguments)), (name, args, whole)
    assert finish == "tool_calls", finish


@check
def json_schema_response_format_validates():
    schemas = [
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
         "required": ["name", "age"], "additionalProperties": False},
        {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}}, "required": ["colors"]},
        {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
    ]
    for i, schema in enumerate(schemas):
        r = chat(messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=150, temperature=0.5 * i, seed=i,
                 response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
        c = r.choices[0]
        assert c.finish_reason == "stop", r
        jsonschema.validate(json.loads(c.message.content), schema)
    try:
        chat(response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "strnig"}}})
    except openai.BadRequestError as e:
        assert e.body["param"] == "response_format", e.body
    else:
        raise AssertionError("a bad schema was accepted")


failed = 0
for fn in CHECKS:
    try:
        fn()
        print(f"ok   {fn.__name__}")
    except Exception:
        failed += 1
        print(f"FAIL {fn.__name__}")
        traceback.print_exc()
print(f"{len(CHECKS) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
