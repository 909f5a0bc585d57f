"""Settings as the deployment builds them: docker-compose's environment, caches, the pool."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys

import pytest
import redis
import yaml
from django.conf import settings
from django.core.cache import cache

from tests.processes import ROOT

COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def compose_environment(given: dict[str, str]) -> dict[str, str]:
    """docker-compose's ``x-app`` environment, ``${VAR:-default}`` / ``${VAR:?msg}`` resolved
    as Compose resolves them with only ``given`` set in the shell."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())

    def resolve(match: re.Match) -> str:
        name, op, arg = match.groups()
        value = given.get(name)
        if op and op.startswith(":") and value == "":
            value = None
        if value is not None:
            return value
        if op in ("-", ":-"):
            return arg
        if op in ("?", ":?"):
            raise AssertionError(f"compose requires {name}: {arg}")
        return ""

    return {
        name: COMPOSE_VARIABLE.sub(resolve, str(value))
        for name, value in compose["x-app"]["environment"].items()
    }


def run_django(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "LOG_FORMAT": "text", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_the_compose_environment(tmp_path):
    env = compose_environment({"SECRET_KEY": secrets.token_urlsafe(50)})
    assert env["DEBUG"] == "false" and env["SECURE_SSL_REDIRECT"] == "true"
    # the compose volume's path exists only in the image: the same setting, here
    assert env["PROMETHEUS_MULTIPROC_DIR"] == "/app/var/metrics"
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.base",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_compose_lets_a_local_user_turn_the_https_redirect_off():
    env = compose_environment({"SECRET_KEY": "x", "SECURE_SSL_REDIRECT": "false"})
    assert env["SECURE_SSL_REDIRECT"] == "false"
    with pytest.raises(AssertionError, match="SECRET_KEY"):
        compose_environment({})


SHOW_SETTINGS = """
import json, django
django.setup()
from django.conf import settings
db = settings.DATABASES["default"]
print(json.dumps({
    "cache": settings.CACHES["default"],
    "conn_max_age": db["CONN_MAX_AGE"],
    "pool": db.get("OPTIONS", {}).get("pool"),
    "proxy_ssl_header": settings.SECURE_PROXY_SSL_HEADER,
}))
"""


def show_settings(**env: str) -> dict:
    base = {
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.base",
        "SECRET_KEY": "x",
        "DATABASE_URL": "postgres://u@127.0.0.1:5432/d",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/3",
    }
    result = run_django(SHOW_SETTINGS, base | env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_throttle_cache_follows_the_redis_broker_or_cache_url(tmp_path):
    shown = show_settings()
    assert shown["cache"]["BACKEND"] == "scheduler_project.cache.RedisCache"
    assert shown["cache"]["LOCATION"] == "redis://127.0.0.1:6379/3"
    assert shown["cache"]["KEY_PREFIX"]
    # A redis:// CACHE_URL: Django's built-in backend, whatever django-environ prefers.
    shown = show_settings(CACHE_URL="redis://127.0.0.1:6379/5")
    assert shown["cache"]["BACKEND"] == "scheduler_project.cache.RedisCache"
    assert shown["cache"]["LOCATION"] == "redis://127.0.0.1:6379/5"
    shown = show_settings(CACHE_URL="locmemcache://")
    assert shown["cache"]["BACKEND"].endswith("LocMemCache")
    # The laptop default (file broker): one process, its own memory.
    shown = show_settings(CELERY_BROKER_URL="", VAR_DIR=str(tmp_path))
    assert shown["cache"]["BACKEND"].endswith("LocMemCache")


def test_pool_only_where_asked_and_never_with_persistent_connections():
    shown = show_settings()
    assert shown["pool"] is None and shown["conn_max_age"] == 60
    shown = show_settings(DB_POOL="true", DB_POOL_MAX_SIZE="3", DB_POOL_TIMEOUT="2.5")
    assert shown["pool"] == {
        "min_size": 1,
        "max_size": 3,
        "timeout": 2.5,
        "reconnect_timeout": 10.0,
    }
    assert shown["conn_max_age"] == 0
    assert show_settings(SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")["proxy_ssl_header"] == [
        "HTTP_X_FORWARDED_PROTO",
        "https",
    ]


def test_gunicorn_config_turns_the_pool_on_for_web_processes_only():
    result = run_django(
        "import os, runpy; runpy.run_path('gunicorn.conf.py'); print(os.environ['DB_POOL'])", {}
    )
    assert result.stdout.strip() == "true", result.stderr
    result = run_django(
        "import os, runpy; runpy.run_path('gunicorn.conf.py'); print(os.environ['DB_POOL'])",
        {"DB_POOL": "false"},
    )
    assert result.stdout.strip() == "false"


NICE_RAISED_BY_CONFIG = (
    "import os, runpy; before = os.nice(0); config = runpy.run_path('gunicorn.conf.py'); "
    "runpy.run_path('gunicorn.conf.py');"  # a reload (SIGHUP) reads it again
    "master = os.nice(0) - before; config['post_fork'](None, None); "
    "print(master, os.nice(0) - before)"
)


def test_gunicorn_config_lowers_only_the_workers_priority_once():
    """WEB_NICE in each worker after the fork: never in the master, where every
    reload would add it again (the default, 0, leaves the priority alone)."""
    expected = min(19, os.nice(0) + 3) - os.nice(0)  # the kernel stops at 19
    assert run_django(NICE_RAISED_BY_CONFIG, {"WEB_NICE": "3"}).stdout.split() == [
        "0",
        str(expected),
    ]
    assert run_django(NICE_RAISED_BY_CONFIG, {}).stdout.split() == ["0", "0"]


def test_cache_clear_leaves_the_brokers_keys_alone():
    """The cache shares the broker's Redis database: clear() must not be FLUSHDB."""
    assert settings.CACHES["default"]["BACKEND"] == "scheduler_project.cache.RedisCache"
    broker = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    broker.set("test-broker-key", "queued message")
    try:
        cache.set("throttle_x", [1, 2])
        cache.clear()
        assert cache.get("throttle_x") is None
        assert broker.get("test-broker-key") == b"queued message"
    finally:
        broker.delete("test-broker-key")


def test_cache_builds_one_redis_client_per_pool():
    """Not a new redis.Redis per get/set (the throttle calls Redis on every request)."""
    client = cache._cache.get_client(None, write=True)
    assert cache._cache.get_client("k") is client
    assert client.connection_pool is cache._cache._get_connection_pool(True)
    cache.set("throttle_y", [3.5, 4.5], 10)
    assert cache.get("throttle_y") == [3.5, 4.5]
    cache.delete("throttle_y")
    assert cache.get("throttle_y") is None


@pytest.mark.django_db
def test_https_redirect_spares_probes_and_metrics_and_trusts_the_proxy_header(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    redirected = client.get("/api/v1/accounts")
    assert redirected.status_code == 301
    assert redirected["Location"] == "https://testserver/api/v1/accounts"
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path).status_code == 200, path
    behind_proxy = client.get("/api/v1/accounts", HTTP_X_FORWARDED_PROTO="https")
    assert behind_proxy.status_code == 401  # reached the API over "https"
    assert behind_proxy["Strict-Transport-Security"] == "max-age=3600"
