"""The suite's PNG charts (drain progress, lateness CDFs, steady load, peers, capacity)."""

from __future__ import annotations

from pathlib import Path


def charts(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    drains = [(k, results[k]) for k in ("drain", "hot") if "series" in results.get(k, {})]
    if drains:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, data in drains:
            xs, ys = zip(*data["series"]["progress"], strict=True)
            ax.plot(xs, ys, label=f"{name} ({data['payments']:,})")
        ax.set_xlabel("seconds since T0")
        ax.set_ylabel("payments finished (no longer open)")
        ax.set_title("Drain: payments due at the same instant")
        ax.axvline(60, color="grey", linestyle="--", linewidth=0.8)
        ax.legend()
        save(fig, "drain_progress.png")

    cdfs = [
        (k, results[k]["series"]["lateness_cdf"])
        for k in ("drain", "hot", "steady")
        if results.get(k, {}).get("series", {}).get("lateness_cdf")
    ]
    if cdfs:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, values in cdfs:
            ax.plot(values, [i / (len(values) - 1) for i in range(len(values))], label=name)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlabel("lateness, executed_at - due_at (s)")
        ax.set_ylabel("fraction of payments")
        ax.set_title("Lateness CDF")
        ax.legend()
        save(fig, "lateness_cdf.png")

    steady = results.get("steady", {})
    if steady.get("series", {}).get("lateness_per_second"):
        sec, p50, p99 = zip(*steady["series"]["lateness_per_second"], strict=True)
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(sec, [v * 1000 for v in p50], label="p50")
        ax.plot(sec, [v * 1000 for v in p99], label="p99")
        ax.axhline(250, color="grey", linestyle="--", linewidth=0.8, label="target p99 250 ms")
        ax.set_xlabel("due second since T0")
        ax.set_ylabel("lateness (ms)")
        ax.set_title(f"Steady load: {steady['rate_per_second']}/s due continuously")
        ax.legend()
        save(fig, "steady_lateness.png")
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, values in steady["series"]["api_latency_cdf_ms"].items():
            if values:
                ax.plot(values, [i / (len(values) - 1) for i in range(len(values))], label=name)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("API latency under steady load")
        ax.legend()
        save(fig, "api_latency_cdf.png")

    peers = results.get("peers", {})
    rows = [("this service (drain)", results.get("drain", {}))]
    rows += [(k, v) for k, v in peers.items() if isinstance(v, dict) and "lateness_seconds" in v]
    rows = [(k, v) for k, v in rows if v.get("throughput_per_second")]
    if len(rows) > 1:
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
        names = [k for k, _ in rows]
        left.bar(names, [v["throughput_per_second"] for _, v in rows])
        left.set_title("throughput (payments/s)")
        right.bar(names, [v["lateness_seconds"]["p99"] for _, v in rows])
        right.set_title("p99 lateness (s)")
        for ax in (left, right):
            ax.tick_params(axis="x", rotation=20)
        save(fig, "peers.png")

    cap = results.get("capacity", {})
    if cap.get("ours"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, label, marker in (
            ("ours", "this service (API load throughout)", "o"),
            ("peer", "Celery apply_async(eta=…) (no API load)", "s"),
        ):
            points = [
                (s["rate_per_second"], s["lateness_seconds"]["p99"])
                for s in cap.get(key, [])
                if not s.get("skipped") and s["lateness_seconds"].get("p99") is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                # a lateness of 0 has no place on a log axis: floor at 1 ms
                ax.plot(xs, [max(y, 0.001) for y in ys], marker=marker, label=label)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8, label="SLO p99 1 s")
        ax.set_yscale("log")
        ax.set_xlabel("due rate (payments/s)")
        ax.set_ylabel("p99 lateness (s)")
        ax.set_title("Capacity: p99 lateness by steady due rate")
        ax.legend()
        save(fig, "capacity_lateness.png")
    return made
