#!/usr/bin/env python3
"""The per-token cost of constrained decoding in `hearth serve` (issue #20).

    bench/structured.py MODEL.gguf [TOKENS] [RUNS] [THREADS]

Starts `hearth serve --parallel 1` on a free port and runs, RUNS times each, alternating:
an unconstrained chat completion of exactly TOKENS tokens (`ignore_eos`), and the same
request with a `json_schema` whose output is longer than TOKENS (so it stops at
`max_tokens` too), for two schemas: a long string, and an array of objects (nested
properties, integers with bounds, enums). Each request's TPOT is read from
`hearth_tpot_seconds` (the server's mean per request after the first token) and the mask
time per token from `hearth_constraint_mask_seconds` (sum / count). Prints a Markdown
table of medians. Needs target/release/hearth (cargo build --release).
"""

import json
import statistics
import subprocess
import sys
import urllib.request

HEARTH = "target/release/hearth"
PROMPT = [{"role": "user", "content": "Write a list of people with their name, age and tags, as JSON."}]
SCHEMAS = {
    "string (minLength 2000)": {"type": "string", "minLength": 2000},
    "array of objects": {
        "type": "array",
        "minItems": 200,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 16},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "tags": {"type": "array", "items": {"enum": ["friend", "family", "work"]}, "maxItems": 3},
            },
            "required": ["name", "age", "tags"],
            "additionalProperties": False,
        },
    },
}


def start(model, threads):
    p = subprocess.Popen([HEARTH, "serve", "-m", model, "--port", "0", "-t", str(threads), "--parallel", "1"],
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("hearth serve listening on http://"):
            return p, line.split("http://", 1)[1].strip()
    raise SystemExit("the server exited before listening")


def metrics(addr):
    text = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        for name in ("hearth_tpot_seconds_sum", "hearth_tpot_seconds_count", "hearth_constraint_mask_seconds_sum",
                     "hearth_constraint_mask_seconds_count"):
            if line.startswith(name + " "):
                out[name] = float(line.split()[1])
    return out


def run(addr, tokens, schema):
    body = {"messages": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "b", "schema": schema}}
    before = metrics(addr)
    req = urllib.request.Request(f"http://{addr}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req).read())
    assert r["usage"]["completion_tokens"] == tokens, r
    after = metrics(addr)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    tpot = d["hearth_tpot_seconds_sum"] / d["hearth_tpot_seconds_count"]
    n = d.get("hearth_constraint_mask_seconds_count", 0)
    mask = d["hearth_constraint_mask_seconds_sum"] / n if n else 0.0
    return tpot, mask


def main():
    model = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    p, addr = start(model, threads)
    try:
        cases = {"none": None, **SCHEMAS}
        run(addr, 8, None)  # warm up
        for s in SCHEMAS.values():
            run(addr, 8, s)  # warm up (the first constrained request builds the token trie)
        res = {name: [] for name in cases}
        for _ in range(runs):
            for name, schema in cases.items():
                res[name].append(run(addr, tokens, schema))
        base = statistics.median(t for t, _ in res["none"])
        print(f"| constraint | TPOT ms (median of {runs}) | vs none | mask ms/token (median) |")
        print("| --- | --- | --- | --- |")
        for name, xs in res.items():
            tpot = statistics.median(t for t, _ in xs)
            mask = statistics.median(m for _, m in xs)
            print(f"| {name} | {tpot * 1e3:.2f} | {(tpot / base - 1) * 100:+.1f}% | {mask * 1e3:.3f} |")
    finally:
        p.kill()


if __name__ == "__main__":
    main()
