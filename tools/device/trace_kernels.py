"""The CUDA kernels of a Chrome trace (GROVE_BENCH_TRACE), by total time: count, total and mean us.

    python3 trace_kernels.py TRACE.json [TOP]
"""
import collections
import json
import sys


def kernel_summary(path, top=25):
    """busy and span (ms) of the trace's kernels and copies, their count, and the `top` by total time."""
    events = json.load(open(path))["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    total = collections.defaultdict(float)
    count = collections.Counter()
    for e in kernels:
        name = e["name"][:110]
        total[name] += e.get("dur", 0)
        count[name] += 1
    span = (max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0
    return {"kernels": len(kernels), "busy_ms": round(sum(total.values()) / 1e3, 2), "span_ms": round(span / 1e3, 2),
            "top": [{"name": n, "count": count[n], "total_ms": round(t / 1e3, 2), "mean_us": round(t / count[n], 2)}
                    for n, t in sorted(total.items(), key=lambda x: -x[1])[:top]]}


if __name__ == "__main__":
    s = kernel_summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
    print(f"kernels {s['kernels']}, busy {s['busy_ms']:.1f} ms of a {s['span_ms']:.1f} ms span")
    for k in s["top"]:
        print(f"{k['count']:7d} {k['total_ms']:9.2f} ms {k['mean_us']:8.2f} us  {k['name']}")
