"""``/``: a landing page for people; unknown API paths stay JSON 404s for programs."""

import re

import pytest


@pytest.mark.django_db
def test_root_links_the_api_docs_the_admin_and_health(client):
    page = client.get("/")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    links = set(re.findall(r'href="([^"]+)"', page.content.decode()))
    assert {"/api/docs/", "/admin/", "/healthz", "/readyz", "/api/schema/"} <= links
    for link in links:
        assert client.get(link).status_code in (200, 302), link  # /admin/ → its login page


def test_unknown_paths_are_still_404_and_json_under_the_api(client):
    for path in ("/api/", "/api/v1/nothing-here", "/api/v2/payments"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found", path
    assert client.get("/nothing-here").status_code == 404
