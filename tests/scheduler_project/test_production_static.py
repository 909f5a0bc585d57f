"""Production mode serves its own pages: gunicorn with DEBUG off, as docker-compose runs it,
after the Dockerfile's ``collectstatic``. The admin must be styled and the API docs page
must load its Swagger UI bundle, with no web server in front to serve ``/static/``."""

from __future__ import annotations

import gzip
import itertools
import json
import re
import secrets
import shlex
import subprocess
import sys
from urllib.parse import urljoin

import pytest

from tests.processes import ROOT, Gunicorn
from tests.scheduler_project.test_settings import compose_environment

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

# Behind docker-compose's TLS proxy (SECURE_SSL_REDIRECT=true); without it
# every page would be a redirect to https://.
HTTPS = {"X-Forwarded-Proto": "https"}
HASHED = re.compile(r"\.[0-9a-f]{12}\.\w+$")  # ManifestStaticFilesStorage's names


def dockerfile_collectstatic() -> tuple[dict[str, str], list[str], str]:
    """The Dockerfile's collectstatic step: (its environment, its command, STATIC_ROOT)."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    static_root = next(
        line.split("=", 1)[1] for line in lines if line.startswith("ENV STATIC_ROOT=")
    )
    (run,) = [line for line in lines if line.startswith("RUN ") and "collectstatic" in line]
    words = shlex.split(run)[1:]
    env = dict(word.split("=", 1) for word in itertools.takewhile(lambda w: "=" in w, words))
    return env, words[len(env) :], static_root


def references(html: str) -> list[str]:
    """Stylesheets, icons and scripts a page loads."""
    links = re.findall(r"<link[^>]*\bhref=\"([^\"]+)\"", html)
    scripts = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html)
    return links + scripts


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """STATIC_ROOT filled by the Dockerfile's own command, in a build-like environment."""
    env, command, static_root = dockerfile_collectstatic()
    assert command == ["python", "manage.py", "collectstatic", "--noinput"]
    assert "SECRET_KEY" in env  # the settings refuse to load without one when DEBUG is off
    # The image and docker-compose agree on where the files are.
    assert compose_environment({"SECRET_KEY": "x"}).get("STATIC_ROOT", static_root) == static_root
    root = tmp_path_factory.mktemp("staticfiles")
    result = subprocess.run(
        [sys.executable, *command[1:]],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env, "STATIC_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (root / "staticfiles.json").exists()
    return root


@pytest.fixture(scope="module")
def web(tmp_path_factory, collected, django_db_setup):
    """gunicorn.conf.py with docker-compose's environment (DEBUG=false, secure cookies,
    HTTPS redirect, HSTS) and the base settings, on the test database and broker."""
    env = compose_environment({"SECRET_KEY": secrets.token_urlsafe(50)})
    assert env["DEBUG"] == "false"
    for service in ("DATABASE_URL", "CELERY_BROKER_URL"):  # compose's hosts "db", "redis"
        del env[service]
    # compose's shared metrics volume exists only in the image: the same setting, here
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path_factory.mktemp("metrics"))
    env |= {
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.base",
        "STATIC_ROOT": str(collected),
        "LOG_FORMAT": "text",
    }
    server = Gunicorn(tmp_path_factory.mktemp("gunicorn"), workers=1, **env)
    yield server
    server.stop()


def fetch(web: Gunicorn, path: str, **headers: str) -> tuple[int, dict, bytes]:
    status, response_headers, body = web.request("GET", path, headers=HTTPS | headers)
    return status, {k.lower(): v for k, v in response_headers.items()}, body


def assert_asset(web: Gunicorn, url: str, content_type: str) -> bytes:
    status, headers, body = fetch(web, url)
    assert status == 200, (url, status, web.logs())
    assert headers["content-type"].startswith(content_type), (url, headers["content-type"])
    assert body, url
    # Hashed names never change content: cached for good by browsers and proxies.
    assert HASHED.search(url) and "immutable" in headers["cache-control"], (url, headers)
    return body


def test_admin_and_api_docs_are_served_with_their_assets_under_debug_false(web):
    status, headers, body = fetch(web, "/admin/login/")
    assert status == 200 and headers["content-type"].startswith("text/html"), web.logs()
    assets = references(body.decode())
    stylesheets = [url for url in assets if url.endswith(".css")]
    assert any("/static/admin/css/base." in url for url in stylesheets), assets
    for url in stylesheets:
        css = assert_asset(web, url, "text/css").decode()
        # The stylesheets' own references (icons, other sheets) were rewritten to
        # hashed names by collectstatic and are served too.
        for ref in re.findall(r"url\(['\"]?([^'\")]+)['\"]?\)", css):
            if not ref.startswith(("data:", "#")):
                assert fetch(web, urljoin(url, ref))[0] == 200, (url, ref)
    for url in (u for u in assets if u.endswith(".js")):
        assert_asset(web, url, "text/javascript")

    # Compressed at build time, served to clients that accept it.
    status, headers, body = fetch(web, stylesheets[0], **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("content-encoding") == "gzip"
    assert gzip.decompress(body)

    status, headers, body = fetch(web, "/api/docs/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    html = body.decode()
    assets = references(html)
    assert all(url.startswith("/static/") for url in assets), assets  # works offline
    bundles = [url for url in assets if "swagger-ui-bundle" in url]
    assert bundles, assets
    for url in assets:
        kind = "text/css" if url.endswith(".css") else "image/" if url.endswith(".png") else None
        assert_asset(web, url, kind or "text/javascript")
    status, headers, body = fetch(web, "/api/schema/")
    assert status == 200 and headers["content-type"].startswith("application/vnd.oai.openapi")

    assert fetch(web, "/static/admin/css/no-such-file.css")[0] == 404


def test_health_and_api_errors_keep_their_shape_under_debug_false(web):
    status, headers, body = fetch(web, "/healthz")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"status": "ok"}
    status, headers, body = fetch(web, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'href="/api/docs/"' in body

    status, headers, body = fetch(web, "/api/v1/no-such-thing")
    assert status == 404 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "not_found"
    status, headers, body = fetch(web, "/api/v1/payments")
    assert status == 401 and headers["content-type"] == "application/json"
    assert set(json.loads(body)["error"]) == {"code", "message", "details"}
