"""The embedded broker: kombu's filesystem transport, made safe between processes.

With no ``CELERY_BROKER_URL`` the service runs web, workers and beat on one
machine with no broker server (``filesystem://``). kombu's stock filesystem
transport (5.7) has two races between processes, and the first one stopped
the whole dev service within minutes:

1. ``_put`` creates the message file under its final name and only then
   writes it. A worker polling the folder can take the file while it is
   empty or half-written, ``json.loads`` fails, and the worker exits with
   ``Unrecoverable error: JSONDecodeError`` (honcho then stops everything).
2. ``_get`` claims a file with ``shutil.move`` into the system temp folder;
   when that is another filesystem (often tmpfs) the move is a copy plus a
   delete, not atomic, so two readers can copy the same message.

This transport keeps kombu's message format, options and exchange tables and
changes only how files change hands:

- a message is written under a temporary name and renamed into place; a
  rename within one filesystem is atomic, so a reader sees the whole
  message or nothing;
- a reader claims a message by renaming it, in the same folder, to a name of
  its own: exactly one rename succeeds, the others get ``FileNotFoundError``
  and try the next file; the winner reads and deletes its claim;
- each queue has a folder of its own, so a poll lists one queue's messages
  instead of every queue's;
- exchange tables (bindings) are rewritten the same way, under a lock file.

``tests/ops/test_embedded_broker.py`` runs 4 writer and 3 reader processes
against both transports: the stock one loses a sixth of the messages to
``JSONDecodeError``; this one delivers each exactly once.

Like any virtual transport it keeps no unacknowledged copy: a message taken
by a worker that is then killed is gone, and the payment's lease reaper
brings the payment back (DESIGN §4.1) — nothing in the broker is needed to
recover.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.@-]+$")
MESSAGE_SUFFIX = ".msg"


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class AtomicChannel(filesystem.Channel):
    def _queue_folder(self, queue: str) -> Path:
        if not QUEUE_NAME.match(queue) or queue.strip(".") != queue:
            raise ChannelError(f"Invalid queue name: {queue!r}")
        folder = Path(self.data_folder_in) / queue
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _put(self, queue, payload, **kwargs):
        # time-ordered names: a reader takes the oldest message first
        name = f"{time.time_ns():020d}_{uuid.uuid4().hex}{MESSAGE_SUFFIX}"
        try:
            _write_atomically(self._queue_folder(queue) / name, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise ChannelError(f"Cannot add a message to queue {queue!r}") from exc

    def _get(self, queue):
        folder = self._queue_folder(queue)
        for name in sorted(n for n in os.listdir(folder) if n.endswith(MESSAGE_SUFFIX)):
            claim = folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex}.claim"
            try:
                os.rename(folder / name, claim)
            except FileNotFoundError:
                continue  # another reader claimed it first
            try:
                payload = claim.read_bytes()
            finally:
                claim.unlink(missing_ok=True)
            return loads(bytes_to_str(payload))
        raise virtual.Empty()

    def _messages(self, queue) -> list[Path]:
        folder = self._queue_folder(queue)
        return [folder / n for n in os.listdir(folder) if n.endswith(MESSAGE_SUFFIX)]

    def _size(self, queue):
        return len(self._messages(queue))

    def _purge(self, queue):
        count = 0
        for path in self._messages(queue):
            try:
                path.unlink()
                count += 1
            except FileNotFoundError:
                continue
        return count

    def get_table(self, exchange):
        file = self._exchange_file(exchange)
        try:
            table = loads(bytes_to_str(file.read_bytes()))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        return [filesystem.exchange_queue_t(*q) for q in table]

    def _update_table(self, exchange, change) -> None:
        """Read-modify-write an exchange table under its lock; readers see old or new."""
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        with open(file.with_name(f".{file.name}.lock"), "wb") as lock_file:
            filesystem.lock(lock_file, filesystem.LOCK_EX)
            try:
                queues = self.get_table(exchange)
                updated = change(list(queues))
                if updated != queues:
                    _write_atomically(file, str_to_bytes(dumps(updated)))
            finally:
                filesystem.unlock(lock_file)

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda q: q if binding in q else [binding, *q])

    def _delete(self, queue, exchange, routing_key, pattern, *args, **kwargs):
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda q: [b for b in q if b != binding])


class AtomicFilesystemTransport(filesystem.Transport):
    """``filesystem://`` with atomic hand-over of messages (see the module docstring)."""

    Channel = AtomicChannel


def register() -> None:
    """Make ``filesystem://`` URLs use this transport in every process (settings call it)."""
    TRANSPORT_ALIASES["filesystem"] = f"{__name__}:AtomicFilesystemTransport"
    TRANSPORT_ALIASES["filesystem-stock"] = "kombu.transport.filesystem:Transport"
