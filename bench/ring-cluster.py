#!/usr/bin/env python3
"""Pipelined ring vs tensor parallel vs one device on 4 emulated devices (issue #7).

    python3 bench/ring-cluster.py [--model models/synth-1b-q4_0.gguf] [--delay-ms 5] [--runs 3]

Four "devices" on this machine: this process's coordinator and three `hearth worker`s,
each with its own --threads and --mem-budget (below), none of which can hold the model
alone. Every process sends each message HEARTH_EMU_LINK_DELAY_MS after it is ready (a
one-way link delay added in user space: `netem` is not available here), so every ring
hop and every allreduce exchange pays the emulated latency.

Configurations (each run `--runs` times; medians of decode ms/token over -n tokens):
  ring-solver     --parallel ring, windows chosen by the layer solver from the devices'
                  profiles (each worker profiles itself on first request), budgets as set
  ring-noprefetch the same windows, every device with --no-prefetch (a streamed layer is
                  read only when needed)
  ring-equal      --layer-window as equal as the layer count allows over all 4 devices
  tensor          --parallel tensor (star allreduce, sum schedule) over the 4; the
                  coordinator runs mapped (a TP coordinator takes no budget yet)
  single-t1/t2    this machine alone under the coordinator's budget (sliding window)

Prints a Markdown table: TPOT measured, the solver's prediction and their ratio, the
windows and k, and per-device compute/disk/network from the ring report. Needs
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTH = os.environ.get("HEARTH", os.path.join(ROOT, "target/release/hearth"))
PROMPT = "In the old harbour town, the fishermen rose before dawn and"

# (threads, --mem-budget) of the coordinator and each worker.
# Together they hold less than the model's 630 MiB once each keeps its KV cache, scratch
# and runtime, so some must stream layers from disk.
COORD = (1, "300MiB")
WORKERS = [(1, "200MiB"), (2, "180MiB"), (1, "150MiB")]


def start_worker(model, threads, budget, env, extra, log):
    args = [HEARTH, "worker", "--listen", "127.0.0.1:0", "-m", model, "-t", str(threads), "--mem-budget", budget] + extra
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(log, "w"), env=env, text=True)
    line = p.stdout.readline()
    m = re.match(r"hearth worker listening on (\S+)", line)
    if not m:
        p.kill()
        sys.exit(f"worker did not start: {line!r} (see {log})")
    return p, m.group(1)


def generate(model, args, env, n, ctx):
    cmd = [HEARTH, "generate", "-m", model, "-p", PROMPT, "-n", str(n), "--temperature", "0", "--ignore-eos", "-c", str(ctx), "--json"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout), r.stderr


def tpot(v):
    t = v["timings"]
    return 1e3 / t["decode_tok_s"] if t["decode_tok_s"] > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models/synth-1b-q4_0.gguf"))
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-n", type=int, default=16, help="tokens generated per run")
    ap.add_argument("-c", type=int, default=512, help="context size")
    ap.add_argument("--only", default="", help="comma-separated configurations to run")
    a = ap.parse_args()
    if not os.access(HEARTH, os.X_OK):
        sys.exit(f"no hearth binary at {HEARTH}: cargo build --release -p hearth")
    work = tempfile.mkdtemp(prefix="ring-bench-")
    env = dict(os.environ, HEARTH_EMU_LINK_DELAY_MS=str(a.delay_ms), HEARTH_CACHE_DIR=os.path.join(work, "cache"))
    env.pop("HEARTH_CLUSTER_KEY", None)
    only = set(x for x in a.only.split(",") if x)
    procs = []

    def workers(extra=()):
        for p in procs:
            p.kill()
            p.wait()
        procs.clear()
        addrs = []
        for i, (t, b) in enumerate(WORKERS):
            p, addr = start_worker(a.model, t, b, env, list(extra), os.path.join(work, f"w{i}-{len(procs)}.log"))
            procs.append(p)
            addrs.append(addr)
        return ",".join(addrs)

    coord = ["-t", str(COORD[0]), "--mem-budget", COORD[1]]
    rows = []

    def run(name, args, env_=env):
        if only and name not in only:
            return None
        vals, last = [], None
        for _ in range(a.runs):
            v, err = generate(a.model, args, env_, a.n, a.c)
            vals.append(tpot(v))
            last = (v, err)
        med = statistics.median(vals)
        v, err = last
        ring = v.get("ring") or {}
        pred = ring.get("predicted_tpot_ms")
        windows = ",".join(str(d["window"]) for d in ring.get("devices", [])) if ring else ""
        devs = "; ".join(
            f"{d['window']}L {d['compute_ms']:.0f}+{d['disk_wait_ms']:.0f}"
            + (f" ({d['predicted_compute_ms']:.0f}+{d['predicted_disk_ms']:.0f})" if d.get("predicted_compute_ms") is not None else "")
            for d in ring.get("devices", [])
        )
        net = f"{ring['network_ms']:.0f}" + (f" ({ring['predicted_network_ms']:.0f})" if ring.get("predicted_network_ms") is not None else "") if ring else ""
        rows.append((name, med, min(vals), max(vals), pred, ring.get("k", ""), windows, devs, net))
        print(f"{name}: TPOT median {med:.1f} ms over {a.runs} runs ({', '.join(f'{x:.1f}' for x in vals)})"
              + (f", predicted {pred:.1f}" if pred else ""), file=sys.stderr)
        return v, err

    try:
        addrs = workers()
        solved = run("ring-solver", ["--workers", addrs, "--parallel", "ring"] + coord)
        windows = None
        if solved:
            # the solver's windows, for the worker addresses in --workers order (dropped ones 0)
            m = re.search(r"windows \[([0-9, ]+)\]", solved[1])
            windows = m.group(1).replace(" ", "") if m else None
        info = json.loads(subprocess.run([HEARTH, "inspect", a.model, "--json"], capture_output=True, text=True).stdout)
        meta = info["metadata"]
        n_layer = meta[meta["general.architecture"] + ".block_count"]
        per = [n_layer // 4 + (1 if i < n_layer % 4 else 0) for i in range(4)]
        run("ring-equal", ["--workers", addrs, "--parallel", "ring", "--layer-window", ",".join(map(str, per))] + coord)
        if windows and (not only or "ring-noprefetch" in only):
            addrs = workers(["--no-prefetch"])
            run("ring-noprefetch", ["--workers", addrs, "--parallel", "ring", "--layer-window", windows] + coord + ["--no-prefetch"])
        if not only or "tensor" in only:
            addrs = workers()
            run("tensor", ["--workers", addrs, "-t", str(COORD[0])])
        for p in procs:
            p.kill()
        run("single-t1", ["-t", "1", "--mem-budget", COORD[1]])
        run("single-t2", ["-t", "2", "--mem-budget", COORD[1]])
    finally:
        for p in procs:
            p.kill()

    print(f"\nmodel {os.path.basename(a.model)}, one-way link delay {a.delay_ms} ms, -n {a.n}, -c {a.c}, {a.runs} runs; "
          f"coordinator -t {COORD[0]} --mem-budget {COORD[1]}, workers " + ", ".join(f"-t {t} --mem-budget {b}" for t, b in WORKERS))
    print("\n| configuration | TPOT ms (median) | min–max | solver's prediction | measured / predicted | k | windows | per device: layers compute+disk ms (predicted) | network ms (predicted) |")
    print("|---|---:|---:|---:|---:|---:|---|---|---:|")
    for name, med, lo, hi, pred, k, windows, devs, net in rows:
        ratio = f"{med / pred:.2f}" if pred else ""
        print(f"| {name} | {med:.1f} | {lo:.1f}–{hi:.1f} | {pred:.1f} | {ratio} | {k} | {windows} | {devs} | {net} |" if pred
              else f"| {name} | {med:.1f} | {lo:.1f}–{hi:.1f} | | | {k} | {windows} | {devs} | {net} |")


if __name__ == "__main__":
    main()
