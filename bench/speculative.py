#!/usr/bin/env python3
"""Speculative decoding with n-gram drafts against plain decoding (issue #22).

    python3 bench/speculative.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--delays 1,5,10] [--runs 3]

Two chat prompts, greedy, stopping at the end-of-generation token (at most -n tokens):
  code-edit   rename the variables of a short Rust function and give it back whole
              (most of the answer repeats the prompt: n-gram drafts should hit often)
  summarise   summarise a paragraph (the answer reuses some phrases of it)

Layouts, each with and without `--draft ngram` (the same tokens either way; the script
checks it):
  single      this machine, --threads 2
  ring        this machine and one `hearth worker` on loopback, `--parallel ring
              --layer-window L/2,L/2` (every token crosses both links once per pass),
              1 thread each
  tensor      the same two processes as a tensor-parallel pair (`--workers`, the default
              sum schedule: two allreduces per block per pass), 1 thread each
ring and tensor run at each one-way link delay of --delays: every process sends each
message HEARTH_EMU_LINK_DELAY_MS after it is ready (user space; `netem` is not available
here). Reports per row the median decode tok/s (tokens after the first / decode time),
the speed-up over plain decoding and the acceptance (accepted / drafted guesses). Needs
`cargo build --release -p hearth` first (or HEARTH=path).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTH = os.environ.get("HEARTH", os.path.join(ROOT, "target/release/hearth"))

CODE = """Rename the variables of this Rust function to descriptive names. Change nothing else and \
answer with the whole function.

fn f(a: &[f64], b: f64) -> Vec<f64> {
    let mut r = Vec::with_capacity(a.len());
    let mut s = 0.0;
    for x in a {
        s += x;
    }
    let m = s / a.len() as f64;
    for x in a {
        let d = x - m;
        if d.abs() > b {
            r.push(*x);
        }
    }
    r
}"""

TEXT = """Summarise this paragraph in three sentences.

The town of Alder Creek sits where two rivers meet, and for most of its history it lived \
from the mills that used their water. When the last mill closed in 1987, half of the town's \
jobs went with it, and many young families moved to the city. In the last ten years the town \
has changed again: the old mill buildings now hold a brewery, a bakery and a small software \
company, and the riverside path draws walkers and cyclists every weekend. The council hopes \
that a new railway stop, planned for 2027, will bring commuters who work in the city but want \
to live by the rivers. Some older residents worry that house prices will rise beyond what \
their children can pay."""

PROMPTS = [("code-edit", CODE), ("summarise", TEXT)]


def start_worker(model, env, log):
    args = [HEARTH, "worker", "--listen", "127.0.0.1:0", "-m", model, "-t", "1"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(log, "w"), env=env, text=True)
    line = p.stdout.readline()
    m = re.match(r"hearth worker listening on (\S+)", line)
    if not m:
        p.kill()
        sys.exit(f"worker did not start: {line!r} (see {log})")
    return p, m.group(1)


def generate(model, prompt, args, env, n):
    cmd = [HEARTH, "generate", "-m", model, "-p", prompt, "--chat", "-n", str(n), "--temperature", "0", "-c", "1024", "--json"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--delays", default="1,5,10", help="one-way link delays (ms) of the ring and tensor rows")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-n", type=int, default=256, help="most tokens generated per run")
    ap.add_argument("--only", default="", help="comma-separated layouts (single,ring,tensor)")
    a = ap.parse_args()
    if not os.access(HEARTH, os.X_OK):
        sys.exit(f"no hearth binary at {HEARTH}: cargo build --release -p hearth")
    only = set(x for x in a.only.split(",") if x)
    work = tempfile.mkdtemp(prefix="spec-bench-")
    base_env = dict(os.environ, HEARTH_CACHE_DIR=os.path.join(work, "cache"))
    base_env.pop("HEARTH_CLUSTER_KEY", None)
    base_env.pop("HEARTH_EMU_LINK_DELAY_MS", None)
    info = json.loads(subprocess.run([HEARTH, "inspect", a.model, "--json"], capture_output=True, text=True).stdout)
    meta = info["metadata"]
    n_layer = meta[meta["general.architecture"] + ".block_count"]
    half = f"{n_layer // 2},{n_layer - n_layer // 2}"

    layouts = []
    if not only or "single" in only:
        layouts.append(("single", None, ["-t", "2"]))
    for d in [float(x) for x in a.delays.split(",") if x]:
        if not only or "ring" in only:
            layouts.append((f"ring {d:g} ms", d, ["-t", "1", "--parallel", "ring", "--layer-window", half]))
        if not only or "tensor" in only:
            layouts.append((f"tensor {d:g} ms", d, ["-t", "1"]))

    rows = []
    for name, delay, args in layouts:
        env = dict(base_env)
        worker = None
        if delay is not None:
            env["HEARTH_EMU_LINK_DELAY_MS"] = str(delay)
            worker, addr = start_worker(a.model, env, os.path.join(work, f"worker-{len(rows)}.log"))
            args = args + ["--workers", addr]
        try:
            for pname, prompt in PROMPTS:
                res = {}
                for spec in (False, True):
                    extra = ["--draft", "ngram"] if spec else []
                    runs = [generate(a.model, prompt, args + extra, env, a.n) for _ in range(a.runs)]
                    res[spec] = (statistics.median(r["timings"]["decode_tok_s"] for r in runs), runs[-1])
                    rates = ", ".join("%.1f" % r["timings"]["decode_tok_s"] for r in runs)
                    print(f"{name} {pname} {'ngram' if spec else 'plain'}: {rates} tok/s", file=sys.stderr)
                (plain, pv), (fast, sv) = res[False], res[True]
                s = sv["speculative"]
                same = pv["completion_tokens"] == sv["completion_tokens"]
                rows.append((name, pname, len(sv["completion_tokens"]), plain, fast, fast / plain, s["accepted"], s["drafted"], s["passes"], same))
        finally:
            if worker:
                worker.kill()
                worker.wait()

    print("| layout | prompt | tokens | plain tok/s | n-gram tok/s | speed-up | accepted / drafted | passes | same tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for name, pname, n, plain, fast, up, acc, dr, passes, same in rows:
        print(f"| {name} | {pname} | {n} | {plain:.1f} | {fast:.1f} | **{up:.2f}** | {acc} / {dr} ({100 * acc / max(dr, 1):.0f}%) | {passes} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
