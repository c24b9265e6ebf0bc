#!/usr/bin/env bash
# Build the fuzz targets' seed corpora under fuzz/corpus/<target>/ (git-ignored) from
# the real files: the reference data (../shared/reference or $HEARTH_REFERENCE_DIR:
# tokenizer vocabularies and test strings, 71 chat templates), models/ when fetched,
# and hand-written request bodies. Nothing here is committed; rerunning is cheap and
# keeps what the fuzzer already added to each corpus.
set -euo pipefail
cd "$(dirname "$0")"
ref="${HEARTH_REFERENCE_DIR:-$(cd .. && pwd)/../shared/reference}"
c=corpus
mkdir -p $c/gguf_header $c/gguf_model $c/gguf_struct $c/tokenizer $c/chat_template $c/wire $c/handshake $c/http_request

# GGUF: the first 64 KiB of each real file (the whole header of the vocabularies'
# metadata is larger, so these stop in the middle of a value: the parser's truncation
# paths), and the real files' headers are seeds for the header target as well.
for f in "$ref"/vocab/*.gguf ../models/*.gguf; do
  [ -f "$f" ] || continue
  head -c 65536 "$f" > "$c/gguf_header/$(basename "$f").head"
  cp "$c/gguf_header/$(basename "$f").head" "$c/gguf_model/"
done

# Tokenizer: byte 0 picks the tokenizer (reference vocabularies first, in the target's
# VOCABS order), byte 1 the flags, then one of llama.cpp's test strings.
i=0
for v in llama-spm phi-3 gpt-2 llama-bpe qwen2 deepseek-coder starcoder; do
  inp="$ref/vocab/ggml-vocab-$v.gguf.inp"
  [ -f "$inp" ] || continue
  python3 - "$inp" "$c/tokenizer/$v" "$i" <<'PY'
import sys
inp, out, pick = sys.argv[1], sys.argv[2], int(sys.argv[3])
cases = open(inp, encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
for n, text in enumerate(cases[:40]):
    with open(f"{out}.{n}", "wb") as f:
        f.write(bytes([pick, n % 4]) + text.encode("utf-8"))
PY
  i=$((i + 1))
done

# Long runs of one character (8 KB, the target's -max_len) for the reference
# vocabularies and some of the small ones, so super-linear encoding shows from the start
# (libFuzzer grows input lengths slowly on its own).
python3 - "$c/tokenizer" <<'PY'
import sys
out = sys.argv[1]
for pick in list(range(7)) + [7, 20, 40, 60, 88]:
    for i, ch in enumerate(["a", " ", "1", "\n", "\t", "中", "🦙", ".", "é", "'", "\u200b"]):
        data = bytes([pick, 0]) + (ch * (8000 // len(ch.encode()))).encode()
        open(f"{out}/run-{pick}-{i}", "wb").write(data)
PY

# Chat templates: the real ones, as they are (rendered over a default conversation).
cp "$ref"/chat-templates/*.jinja $c/chat_template/ 2>/dev/null || true

# HTTP: byte 0 = endpoint (even: chat, odd: completion) and streaming step.
put() { printf "$1" > "$c/http_request/$2"; printf '%s' "$3" >> "$c/http_request/$2"; }
put '\x00' chat-basic '{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}'
put '\x02' chat-full '{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"say STOP now"}],"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"repeat_penalty":1.1,"seed":-3,"max_completion_tokens":16,"stop":["STOP","\n\n"],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":5,"presence_penalty":0.5,"frequency_penalty":-0.5,"n":1,"logit_bias":{"50256":-100},"ignore_eos":false}'
put '\x01' completion-text '{"prompt":"The capital of France is","max_tokens":8,"stop":"."}'
put '\x03' completion-ids '{"prompt":[[1,2,3,4294967295]],"logprobs":3,"echo":false,"best_of":1}'
put '\x05' completion-list '{"prompt":["one"],"stream":false,"stream_options":null,"temperature":2}'

# Wire and handshake frames: u32 length, type byte, payload. A few empty/short frames
# of each type give the fuzzer the framing; the decoders' layouts it finds itself.
python3 - "$c" <<'PY'
import struct, sys
c = sys.argv[1]
for ty in range(0, 32):
    for n, payload in enumerate([b"", b"\0" * 8, bytes(range(48)), b"\xff" * 80]):
        frame = struct.pack("<I", 1 + len(payload)) + bytes([ty]) + payload
        open(f"{c}/wire/t{ty}-{n}", "wb").write(frame)
        for mode in range(6):
            if n == 2:
                open(f"{c}/handshake/m{mode}-t{ty}", "wb").write(bytes([mode]) + frame)
PY
echo "seed corpora in $(pwd)/$c:"
for d in $c/*/; do echo "  $(basename "$d"): $(ls "$d" | wc -l) files"; done

# Tiny model files of every architecture for the raw GGUF target: the structure-aware
# target writes the ones that load while it runs briefly (needs the built targets).
bin=target/x86_64-unknown-linux-gnu/release/gguf_struct
if [ -x "$bin" ] && ! ls $c/gguf_model/tiny-* >/dev/null 2>&1; then
  HEARTH_FUZZ_DUMP=$c/gguf_model "$bin" -runs=3000 -seed=1 -rss_limit_mb=2048 $c/gguf_struct >/dev/null 2>&1 || true
  echo "  gguf_model after the dump: $(ls $c/gguf_model | wc -l) files"
fi
