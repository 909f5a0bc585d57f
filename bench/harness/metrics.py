"""What the suite measures: percentiles, CPU and memory of process trees, PostgreSQL CPU."""

from __future__ import annotations

from dataclasses import dataclass


# ---------------------------------------------------------------- summaries
def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def summarize(values: list[float], scale: float = 1.0, digits: int = 4) -> dict:
    """p50/p95/p99/max (and count) of ``values``, multiplied by ``scale``."""
    ordered = sorted(values)
    out: dict = {"count": len(ordered)}
    for name, p in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100)):
        value = percentile(ordered, p)
        out[name] = round(value * scale, digits) if value is not None else None
    return out


def ms_each(seconds: float, count: int) -> float | None:
    """``seconds`` (of CPU, say) per item in milliseconds; None for no items."""
    return round(seconds * 1000 / count, 3) if count else None


def cdf(values: list[float], points: int = 200) -> list[float]:
    """``points + 1`` evenly spaced quantiles of ``values`` (for CDF charts)."""
    ordered = sorted(values)
    return [percentile(ordered, 100 * i / points) for i in range(points + 1)] if ordered else []


# ---------------------------------------------------------------- process trees
def _tree(pid: int):
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    total = 0.0
    for proc in _tree(pid):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except Exception:  # noqa: S112 - a child that just exited
            continue
    return total


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process, every thread (a load client's)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def host_busy_seconds() -> float:
    """CPU seconds every core of the host has spent busy (not idle, not iowait)."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def tree_rss_mb(pid: int) -> float:
    """Resident memory (MiB, one decimal) of ``pid`` and its live descendants."""
    total = 0
    for proc in _tree(pid):
        try:
            total += proc.memory_info().rss
        except Exception:  # noqa: S112
            continue
    return round(total / 2**20, 1)


# ---------------------------------------------------------------- PostgreSQL
@dataclass(frozen=True)
class PostgresCpu:
    """CPU seconds used so far by each live PostgreSQL server process (all
    databases), and by the server processes that have exited (the postmaster's
    reaped children: backends that closed, autovacuum and parallel workers)."""

    live: dict[int, float]
    exited: float


def postgres_cpu() -> PostgresCpu:
    """The server's CPU so far (see ``PostgresCpu``)."""
    import psutil

    live: dict[int, float] = {}
    exited = 0.0
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if proc.info["name"] not in ("postgres", "postmaster") or not times:
            continue
        live[proc.pid] = times.user + times.system
        if _is_postmaster(proc):
            exited += times.children_user + times.children_system
    return PostgresCpu(live=live, exited=exited)


def _is_postmaster(proc) -> bool:
    """The server's parent process: its own parent is not a PostgreSQL process."""
    import psutil

    try:
        return proc.parent().name() not in ("postgres", "postmaster")
    except (psutil.Error, AttributeError):
        return False


def postgres_cpu_since(before: PostgresCpu) -> float:
    """CPU the server's processes used since ``before``.

    A backend that exited meanwhile is counted too: its CPU moved into the
    postmaster's reaped-children time, less what it had used by ``before``.
    (The payment workers reconnect every ``CONN_MAX_AGE`` seconds, so a
    120 s window sees each of their backends end; counting live processes
    only left 20-40 s of a capacity step's PostgreSQL CPU out.)
    """
    now = postgres_cpu()
    live = sum(cpu - before.live.get(pid, 0.0) for pid, cpu in now.live.items())
    gone = sum(cpu for pid, cpu in before.live.items() if pid not in now.live)
    return live + (now.exited - before.exited) - gone


# ---------------------------------------------------------------- Prometheus
@dataclass(frozen=True)
class Snapshot:
    """Every metric family of a multiprocess directory (the service's
    ``PROMETHEUS_MULTIPROC_DIR``), each family's samples summed over every
    process that wrote to it, read once (``multiprocess_snapshot``). The
    readers below take a snapshot or a directory: a window's edge reads the
    directory once and hands the snapshot to each, instead of every reader
    reading every process's file again."""

    families: dict[str, list]  # by family name: a counter's without ``_total``


def multiprocess_snapshot(path: str) -> Snapshot:
    """The directory ``path`` now (``Snapshot``)."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    return Snapshot({family.name: family.samples for family in registry.collect()})


Source = str | Snapshot  # a multiprocess directory, or a snapshot of one


def _samples(source: Source, names: set[str]) -> list:
    """The samples of the families ``names``; empty when no process has
    exported them. A directory is read for the call."""
    snapshot = source if isinstance(source, Snapshot) else multiprocess_snapshot(source)
    return [sample for name in sorted(names) for sample in snapshot.families.get(name, [])]


def _histogram_samples(source: Source, name: str) -> list:
    """The samples of the histogram ``name`` (``_samples``)."""
    return _samples(source, {name})


def multiprocess_counters(source: Source, names: list[str]) -> dict[str, float]:
    """Each counter of ``names`` (``payments_collapsed_total``, say) summed over
    every process and label value that wrote to ``source``; 0.0 for one that no
    process has incremented (a labelless counter is exported from its creation,
    so a misspelt name reads 0.0 too: the tests read them as the service writes
    them)."""
    totals = dict.fromkeys(names, 0.0)
    for sample in _samples(source, {name.removesuffix("_total") for name in names}):
        if sample.name in totals:
            totals[sample.name] += sample.value
    return totals


def multiprocess_histogram(source: Source, name: str) -> dict[float, float] | None:
    """Cumulative bucket counts ``{upper bound: count}`` (``inf`` for ``+Inf``) of the
    histogram ``name`` (``_histogram_samples``); None when no process has exported it."""
    buckets: dict[float, float] = {}
    for sample in _histogram_samples(source, name):
        if sample.name == f"{name}_bucket":
            le = float(sample.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets or None


def multiprocess_histogram_totals(source: Source, name: str) -> tuple[float, float] | None:
    """(count, sum) of the histogram ``name`` (``_histogram_samples``); None when no
    process has exported it."""
    count = total = 0.0
    found = False
    for sample in _histogram_samples(source, name):
        if sample.name == f"{name}_count":
            count += sample.value
            found = True
        elif sample.name == f"{name}_sum":
            total += sample.value
    return (count, total) if found else None


def histogram_window(
    before: dict[float, float] | None, after: dict[float, float] | None
) -> dict[float, float] | None:
    """The observations between two snapshots of a cumulative histogram
    (``multiprocess_histogram``), per cumulative bucket in bound order; None
    when the histogram is absent from ``after``."""
    if after is None:
        return None
    before = before or {}
    return {le: after[le] - before.get(le, 0.0) for le in sorted(after)}


def histogram_quantile_bound(
    before: dict[float, float] | None, after: dict[float, float] | None, q: float
) -> dict | None:
    """The observations between two snapshots of a cumulative histogram: their count
    and the upper bound of the bucket holding the ``q``-quantile (the quantile is
    ≤ that bound; when it lies above the last finite bucket, ``le_seconds`` is None
    and ``above_seconds`` that bucket's bound). None when the histogram is absent
    from ``after``."""
    import math

    delta = histogram_window(before, after)
    if delta is None:
        return None
    total = delta.get(math.inf, max(delta.values(), default=0.0))
    out: dict = {"observations": int(total), "quantile": q, "le_seconds": None}
    if total <= 0:
        return out
    rank = math.ceil(q * total)
    bound = next((le for le, count in delta.items() if count >= rank), math.inf)
    if math.isinf(bound):
        out["above_seconds"] = max((le for le in delta if not math.isinf(le)), default=None)
    else:
        out["le_seconds"] = bound
    out["buckets"] = {("+Inf" if math.isinf(le) else f"{le:g}"): int(c) for le, c in delta.items()}
    return out
