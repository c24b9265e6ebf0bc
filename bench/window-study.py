#!/usr/bin/env python3
"""Larger than RAM: hearth's sliding window vs plain mmap under the same memory limit.

    bench/window-study.py MODEL.gguf [--budgets 2GiB,1GiB,512MiB] [-n 4] [-t 2] [-c 128]

For each budget B it runs `hearth generate` (greedy, a fixed prompt, -n tokens with
--ignore-eos, --cold so every run starts from the disk):
  * window: `--mem-budget B`, inside a memory cgroup limited to B (page cache counts);
  * mmap:   no budget (plain mapping), inside the same cgroup, so the kernel must evict
            and re-fault the mapped weights (what prima.cpp-style mmap does when the
            model exceeds RAM);
and once without any limit, as the reference output. It prints a Markdown table: peak
RSS (VmHWM), the cgroup's peak usage, seconds per decoded token, the window's read rate
and its disk-read bound (bytes per token / read rate, both from the same run), and
whether the tokens equal the unlimited run's.

The cgroup is the v1 memory controller (/sys/fs/cgroup/memory, root needed); without it
the mmap rows are skipped and the window rows run without a cgroup.
Environment: HEARTH (binary, default target/release/hearth), OUT (JSON dir, default
/tmp/window-study).
"""
import argparse, json, os, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTH = os.environ.get("HEARTH", os.path.join(ROOT, "target/release/hearth"))
OUT = os.environ.get("OUT", "/tmp/window-study")
CG_ROOT = "/sys/fs/cgroup/memory"
PROMPT = "The capital of France is"


def size(s):
    units = {"gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "": 1}
    num = s.rstrip("GiBMKgibmk")
    return int(float(num) * units[s[len(num):].lower()])


def cgroup(name, limit):
    if not os.access(CG_ROOT, os.W_OK):
        return None
    path = os.path.join(CG_ROOT, name)
    os.makedirs(path, exist_ok=True)
    for f, v in (("memory.limit_in_bytes", limit), ("memory.max_usage_in_bytes", 0)):
        with open(os.path.join(path, f), "w") as fh:
            fh.write(str(v))
    return path


def run(tag, model, args, cg):
    os.makedirs(OUT, exist_ok=True)
    cmd = [HEARTH, "generate", "-m", model, "-p", PROMPT, "--temp", "0", "--ignore-eos", "--json", "--cold"] + args
    pre = None
    if cg:
        def pre():
            with open(os.path.join(cg, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pre, timeout=3600)
    wall = time.time() - t0
    with open(os.path.join(OUT, tag + ".err"), "w") as fh:
        fh.write(p.stderr)
    if p.returncode != 0:
        sys.exit(f"{tag}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    v = json.loads(p.stdout)
    v["wall_s"] = wall
    if cg:
        with open(os.path.join(cg, "memory.max_usage_in_bytes")) as fh:
            v["cgroup_peak_bytes"] = int(fh.read())
    with open(os.path.join(OUT, tag + ".json"), "w") as fh:
        json.dump(v, fh)
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--budgets", default="2GiB,1GiB,512MiB")
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-c", type=int, default=128)
    a = ap.parse_args()
    common = ["-n", str(a.n), "-t", str(a.t), "-c", str(a.c)]
    mib = lambda b: f"{b / (1 << 20):.0f}"
    ref = run("unlimited", a.model, common, None)
    rows = []
    def row(budget, mode, v):
        t = v["timings"]
        steps = max(len(v["completion_tokens"]) - 1, 1)
        tok_s = t["decode_ms"] / steps / 1e3
        w = v.get("window")
        same = "yes" if v["completion_tokens"] == ref["completion_tokens"] else "**no**"
        cgp = mib(v["cgroup_peak_bytes"]) if "cgroup_peak_bytes" in v else "-"
        if w:
            io = w["decode_io"]
            bpt = w["plan"]["read_bytes_per_token"]
            bound = bpt / (io["read_gbps"] * 1e9) if io["read_gbps"] else 0
            extra = f"{w['plan']['slots']}/{w['plan']['n_units']} | {io['read_gbps']:.2f} | {bound:.2f} | {tok_s / bound if bound else 0:.2f}"
        else:
            extra = "- | - | - | -"
        rows.append(f"| {budget} | {mode} | {mib(v['peak_rss_bytes'])} | {cgp} | {tok_s:.2f} | {extra} | {same} |")
    row("none", "mmap", ref)
    for b in a.budgets.split(","):
        limit = size(b)
        cg = cgroup(f"hearth-study-{b}", limit)
        row(b, "window", run(f"window-{b}", a.model, common + ["--mem-budget", b], cg))
        if cg:
            row(b, "mmap in cgroup", run(f"mmap-{b}", a.model, common, cg))
            os.rmdir(cg) if not open(os.path.join(cg, "cgroup.procs")).read().strip() else None
    print(f"model {a.model}, {a.t} threads, -c {a.c}, {a.n} tokens (s/token over the {a.n - 1} decode steps), --cold runs\n")
    print("| budget | mode | peak RSS MiB | cgroup peak MiB | s/token | window | read GB/s | disk bound s/token | ratio | same tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
