"""Django's built-in Redis cache, safe to share a Redis database with Celery."""

from __future__ import annotations

import re

from django.core.cache.backends import redis


class RedisCache(redis.RedisCache):
    """``django.core.cache.backends.redis.RedisCache`` whose ``clear()`` deletes only its own keys.

    The built-in ``clear()`` is ``FLUSHDB``. When the cache shares the broker's
    Redis database (settings: no ``CACHE_URL``, Redis broker), that would also
    drop every queued Celery message; here it deletes the keys under this
    cache's ``KEY_PREFIX`` and nothing else.
    """

    def clear(self) -> bool:
        client = self._cache.get_client(None, write=True)
        pattern = re.sub(r"([\\*?\[\]])", r"\\\1", self.key_prefix) + ":*"
        batch = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) == 1000:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
        return True
