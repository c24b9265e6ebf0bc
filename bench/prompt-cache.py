#!/usr/bin/env python3
"""TTFT per turn of a multi-turn chat through `hearth serve`, with and without the
prompt cache (issue #20).

    bench/prompt-cache.py MODEL.gguf [TURNS] [THREADS]

Starts `hearth serve` twice on a free port (the default, then `--no-prompt-cache`),
plays the same conversation on each (a system message, then TURNS user messages of about
60 tokens, each reply of 16 greedy tokens joining the conversation), and prints a
Markdown table: per turn the prompt tokens, the cached tokens the server reported, and
TTFT (from sending the request to the first streamed content chunk) with and without the
cache. Needs target/release/hearth (cargo build --release).
"""

import json
import subprocess
import sys
import time
import urllib.request

HEARTH = "target/release/hearth"
USER = ("Tell me about the history of the town, its river, the old bridge, the market square and the "
        "people who lived there in the winter of that long year, turn {i}.")


def start(model, threads, extra):
    p = subprocess.Popen([HEARTH, "serve", "-m", model, "--port", "0", "-t", str(threads), "--parallel", "2",
                          "-c", "4096", *extra], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("hearth serve listening on http://"):
            return p, line.split("http://", 1)[1].strip()
    raise SystemExit("the server exited before listening")


def turn(addr, messages):
    body = json.dumps({"messages": messages, "max_tokens": 16, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"http://{addr}/v1/chat/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or (time.perf_counter() - t0) * 1000
                    text += piece
    return text, ttft, usage


def converse(model, turns, threads, extra):
    p, addr = start(model, threads, extra)
    try:
        messages = [{"role": "system", "content": "You are a patient local historian."}]
        rows = []
        for i in range(turns):
            messages.append({"role": "user", "content": USER.format(i=i + 1)})
            text, ttft, usage = turn(addr, messages)
            rows.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], ttft, text))
            messages.append({"role": "assistant", "content": text})
        return rows
    finally:
        p.terminate()
        p.wait()


def main():
    model = sys.argv[1]
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    on = converse(model, turns, threads, [])
    off = converse(model, turns, threads, ["--no-prompt-cache"])
    print("| turn | prompt tokens | cached | TTFT cache on (ms) | TTFT cache off (ms) | off / on | same reply |")
    print("|---|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(on, off)):
        ratio = (b[2] or 0) / (a[2] or float("nan"))
        print(f"| {i + 1} | {a[0]} | {a[1]} | {a[2]:.0f} | {b[2]:.0f} | {ratio:.1f}x | {'yes' if a[3] == b[3] else 'NO'} |")


if __name__ == "__main__":
    main()
