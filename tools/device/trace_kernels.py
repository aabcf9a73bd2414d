"""The CUDA kernels of a Chrome trace (GROVE_BENCH_TRACE), by total time: count, total and mean us."""
import json, sys, collections
events = json.load(open(sys.argv[1]))["traceEvents"]
kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
total = collections.defaultdict(float); count = collections.Counter()
for e in kernels:
    name = e["name"][:110]; total[name] += e.get("dur", 0); count[name] += 1
busy = sum(total.values())
span = (max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0
print(f"kernels {len(kernels)}, busy {busy/1e3:.1f} ms of a {span/1e3:.1f} ms span")
for name, t in sorted(total.items(), key=lambda x: -x[1])[:int(sys.argv[2]) if len(sys.argv) > 2 else 25]:
    print(f"{count[name]:7d} {t/1e3:9.2f} ms {t/count[name]:8.2f} us  {name}")
