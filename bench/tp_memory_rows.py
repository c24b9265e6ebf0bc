"""Table rows for bench/tp-memory.sh: one per node, from the coordinator's --json and
stderr (its split table) and each worker's log (its peak RSS at session end)."""
import json
import re
import sys

n, sched, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
d = json.load(open(f"{tmp}/c.json"))
err = open(f"{tmp}/c.err").read()
nodes = {}
for line in err.splitlines():
    m = re.match(r"\s*node (\d+) \((.*?)\): .*?([\d.]+) MiB of block weights(?:, KV cache ([\d.]+) MiB)?", line)
    if m:
        nodes[int(m.group(1))] = (m.group(3), m.group(4))
if n == 1:
    sched = "-"
    nodes[0] = (f"{d['memory']['model_file_bytes'] / 2**20:.1f} (file)", None)
rows = [(0, d["peak_rss_bytes"] / 2**20, nodes[0][0], d["memory"]["kv_cache_bytes"] / 2**20)]
for i in range(1, n):
    log = open(f"{tmp}/w{i}.err").read()
    m = re.search(r"worker peak RSS ([\d.]+) MiB", log)
    rows.append((i, float(m.group(1)) if m else float("nan"), nodes[i][0], float(nodes[i][1])))
for i, rss, wb, kv in rows:
    print(f"| {n} | {sched} | {i} | {rss:.1f} | {wb} | {kv:.1f} |")
