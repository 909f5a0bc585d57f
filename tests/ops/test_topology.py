"""The production topology keeps each kind of background work in a pool of its own.

DESIGN §8: timers, payment execution and webhook delivery never share a process
pool, and the sweeper never waits behind the materialiser. These tests read
the process definitions operators actually run (Procfile, Procfile.dev,
docker-compose.yml) and the routing the code uses, so a change to either
that breaks the isolation fails here.
"""

import itertools
import shlex
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from payments.periodic import PERIODIC_TASKS

ROOT = Path(__file__).resolve().parents[2]
PAYMENT_QUEUES = {f"payments.p{n:02d}" for n in range(settings.PAYMENT_PARTITIONS)}
ALL_QUEUES = set(settings.CELERY_TASK_QUEUES)


def consumed(argv: list[str]) -> set[str] | None:
    """Queues a `celery worker` command line consumes (None: not a worker)."""
    if "worker" not in argv:
        return None
    queues, excluded = ALL_QUEUES, set()
    for flag, value in itertools.pairwise(argv):
        if flag in ("-Q", "--queues"):
            queues = set(value.split(","))
        if flag in ("-X", "--exclude-queues"):
            excluded = set(value.split(","))
    return queues - excluded


def pool(argv: list[str]) -> str:
    for flag, value in itertools.pairwise(argv):
        if flag in ("-P", "--pool"):
            return value
    return "prefork"


def procfile(name: str) -> dict[str, list[str]]:
    lines = (ROOT / name).read_text().splitlines()
    return {
        line.split(":", 1)[0]: shlex.split(line.split(":", 1)[1])
        for line in lines
        if line.strip() and not line.startswith("#")
    }


def compose() -> dict[str, list[str]]:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return {name: list(spec["command"]) for name, spec in services.items() if "command" in spec}


@pytest.mark.parametrize("source", ["Procfile", "Procfile.dev", "docker-compose.yml"])
def test_each_kind_of_work_has_a_pool_of_its_own(source):
    commands = compose() if source.endswith(".yml") else procfile(source)
    workers = {name: q for name, argv in commands.items() if (q := consumed(argv)) is not None}
    argv = {name: commands[name] for name in workers}
    by_role = {
        queue: [name for name, queues in workers.items() if queue in queues]
        for queue in ("timers", "recurring", "webhooks")
    }
    # each of those queues is consumed by exactly one process definition, doing only that
    assert all(len(names) == 1 for names in by_role.values()), by_role
    assert workers[by_role["timers"][0]] == {"timers"}
    assert workers[by_role["recurring"][0]] <= {"recurring", "default"}
    assert workers[by_role["webhooks"][0]] == {"webhooks"}
    assert pool(argv[by_role["webhooks"][0]]) == "threads"
    # payment workers take every partition and nothing of the others' work
    payment_workers = [name for name, queues in workers.items() if queues & PAYMENT_QUEUES]
    assert payment_workers
    for name in payment_workers:
        assert workers[name] == PAYMENT_QUEUES, (name, workers[name] - PAYMENT_QUEUES)
        # the process that takes a chunk runs it (no pool child to hand it to);
        # the batch's time limit is PostgreSQL's (PAYMENT_BATCH_TIMEOUT_SECONDS)
        assert pool(argv[name]) == "solo", name
    # the sweep must not share its single process with anything
    timer_argv = argv[by_role["timers"][0]]
    assert timer_argv[timer_argv.index("--concurrency") + 1] == "1"
    # no queue is left without a consumer
    assert set().union(*workers.values()) == ALL_QUEUES


def test_tasks_are_routed_to_the_pool_meant_for_them():
    routes = {task: route["queue"] for task, route in settings.CELERY_TASK_ROUTES.items()}
    assert routes["payments.sweep"] == routes["payments.reap_leases"] == "timers"
    assert routes["payments.materialize_recurring"] == "recurring"
    assert routes["payments.deliver_webhook"] == routes["payments.retry_webhooks"] == "webhooks"
    # beat's stored schedule agrees with the routing
    for _, task, _, _, queue in PERIODIC_TASKS:
        assert queue == routes.get(task, "default"), task


def test_compose_shares_one_metrics_directory_emptied_at_start():
    """Every app container writes its Prometheus files to one shared volume, so web's
    /metrics adds up the workers' counters; migrate (which every other container
    waits for) empties it first."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    apps = {name: s for name, s in services.items() if s.get("image") == services["web"]["image"]}
    assert {"web", "worker", "timers", "recurring", "webhooks", "beat", "migrate"} <= set(apps)
    for name, service in apps.items():
        directory = service["environment"]["PROMETHEUS_MULTIPROC_DIR"]
        assert f"metrics:{directory}" in service["volumes"], name
        if name != "migrate":
            assert service["depends_on"]["migrate"]["condition"] == (
                "service_completed_successfully"
            ), name
    empty = " ".join(apps["migrate"]["command"])
    assert f"find {directory}" in empty and "-delete" in empty
    assert empty.index("-delete") < empty.index("migrate --noinput")


def test_payment_workers_run_as_several_processes():
    """One solo process is one batch at a time: every definition runs two."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert services["worker"]["deploy"]["replicas"] >= 2
    dev = (ROOT / "scripts" / "dev").read_text()
    assert 'Procfile.dev start -c worker="${PAYMENT_WORKERS:-2}"' in dev


@pytest.mark.parametrize("source", ["Procfile", "Procfile.dev", "docker-compose.yml"])
def test_every_worker_runs_without_events_gossip_or_start_up_sync(source):
    """Nothing reads worker events, gossip or mingle (``control.ping`` goes by the
    remote-control mailbox), and the heartbeat woke each idle worker every 2 s:
    every worker runs so (the benchmark's and the tests' take ``QUIET_WORKER``)."""
    from bench.harness.processes import QUIET_WORKER

    commands = procfile(source) if source.startswith("Procfile") else compose()
    workers = {name: argv for name, argv in commands.items() if consumed(argv) is not None}
    assert {"worker", "timers", "recurring", "webhooks"} <= set(workers)
    for name, argv in workers.items():
        assert set(QUIET_WORKER) <= set(argv), name
