"""The embedded broker hands every message over whole, exactly once, between processes.

Four writer processes and three reader processes share one broker folder,
with messages large enough that writing one takes a while. kombu's stock
filesystem transport lets readers take files that are still being written
(``JSONDecodeError``, which killed ``./scripts/dev``'s workers); the
project's transport must deliver every message exactly once.
"""

import multiprocessing
import time
from queue import Empty as NoReport

import pytest
from kombu import Connection

from scheduler_project.broker import register

WRITERS, READERS, PER_WRITER, PAD = 4, 3, 150, 200_000


def options(root):
    return {
        "data_folder_in": str(root / "data"),
        "data_folder_out": str(root / "data"),
        "control_folder": str(root / "control"),
        "store_processed": False,
        "polling_interval": 0.01,
    }


def write(url, root, index):
    register()
    with Connection(url, transport_options=options(root)) as conn:
        queue = conn.SimpleQueue("race")
        for i in range(PER_WRITER):
            queue.put({"writer": index, "i": i, "pad": "x" * PAD})
        queue.close()


def read(url, root, results, stop):
    register()
    received, errors = [], []
    with Connection(url, transport_options=options(root)) as conn:
        queue = conn.SimpleQueue("race")
        while not stop.is_set():
            try:
                message = queue.get(timeout=0.2)
            except queue.Empty:
                continue
            except Exception as exc:  # what the stock transport raises mid-race
                errors.append(type(exc).__name__)
                continue
            received.append((message.payload["writer"], message.payload["i"]))
            message.ack()
        queue.close()
    results.put((received, errors))


def died(processes):
    return [p for p in processes if p.exitcode not in (None, 0)]


def race(url, root):
    for sub in ("data", "control"):
        (root / sub).mkdir(parents=True)
    # spawn, not fork: a fork of the test process (threads, open connections)
    # can inherit a held lock and hang
    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    readers = [ctx.Process(target=read, args=(url, root, results, stop)) for _ in range(READERS)]
    writers = [ctx.Process(target=write, args=(url, root, i)) for i in range(WRITERS)]
    for process in readers + writers:
        process.start()
    for process in writers:
        process.join(120)
    if any(process.exitcode != 0 for process in writers):
        # A writer died: the stock transport's control file (queue bindings) is
        # written in place too, and a writer declaring its queue read it empty.
        errors_in_writers = [process.exitcode for process in writers]
    else:
        errors_in_writers = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any((root / "data").rglob("*.msg")):
        time.sleep(0.2)
    time.sleep(0.5)
    stop.set()
    received, errors = [], []
    reported, deadline = 0, time.monotonic() + 60
    # A reader reports once, on its way out; one that died first never will
    # (the stock transport can fail it as it declares its queue: the binding
    # file read empty), so it is counted as an error instead of waited for.
    while reported + len(died(readers)) < len(readers) and time.monotonic() < deadline:
        try:
            got, failed = results.get(timeout=0.5)
        except NoReport:
            continue
        received += got
        errors += failed
        reported += 1
    errors += ["ReaderDied"] * len(died(readers))
    for process in readers:
        process.join(30)
        if process.is_alive():
            process.kill()
    return received, errors, errors_in_writers


@pytest.mark.slow
def test_stock_filesystem_transport_loses_half_written_messages(tmp_path):
    """The reproduction: proves the race is real and that this test can see it.

    A race: one round hit it in every run before, but a quiet moment can let
    every reader miss the empty file (seen once in a full-suite run), so up to
    five rounds, stopping at the first that shows it — a reader that read a
    message file empty, or a writer or reader that read the queue-binding file
    empty as it declared its queue and died (seen in other runs: the stock
    transport writes both in place)."""
    for attempt in range(5):
        received, errors, writers_failed = race(
            "filesystem-stock://", tmp_path / f"round-{attempt}"
        )
        if errors or writers_failed:
            break
    assert errors or writers_failed, "no round showed the race"
    assert set(errors) <= {"JSONDecodeError", "ChannelError", "ReaderDied"}, errors[:3]
    assert len(received) < WRITERS * PER_WRITER


@pytest.mark.slow
def test_embedded_transport_delivers_every_message_exactly_once(tmp_path):
    received, errors, writers_failed = race("filesystem://", tmp_path)
    assert errors == [] and writers_failed == []
    assert sorted(received) == [(w, i) for w in range(WRITERS) for i in range(PER_WRITER)]
