"""API tokens: revoke and issue from the admin and the command line, audited, effective at once."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import CommandError, call_command
from django.db.models.functions import Now
from django.urls import reverse
from rest_framework.test import APIClient

from payments.models import ApiToken, ApiTokenEvent, ApiTokenVia
from payments.tokens import api_token_active, api_token_revoke, hash_token
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def status_with(token: str) -> int:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api.get("/api/v1/accounts").status_code


def events(user):
    return list(
        ApiTokenEvent.objects.filter(token__user=user)
        .order_by("pk")
        .values_list("token__prefix", "action", "actor__username", "via")
    )


@pytest.fixture
def token_admin(client):
    """Staff with only the dedicated permission (not a superuser)."""
    user = UserFactory(username="tess", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="manage_api_tokens"))
    client.force_login(user)
    return client


# --- command line --------------------------------------------------------------


def test_rotate_revokes_every_active_token_and_prints_the_new_one_once(alice):
    old = alice.token
    second = json.loads(_call("rotate_api_token", "alice", "--json"))["token"]
    assert status_with(old) == 401 and status_with(second) == 200
    out = json.loads(_call("rotate_api_token", "alice", "--name", "ci", "--json"))
    assert set(out) == {"username", "token", "prefix", "revoked"}
    assert out["username"] == "alice" and out["token"].startswith(out["prefix"])
    assert out["revoked"] == [second[:12]]
    assert status_with(old) == 401 and status_with(second) == 401
    assert status_with(out["token"]) == 200
    active = ApiToken.objects.get(user=alice.user, revoked_at__isnull=True)
    assert (active.prefix, active.name) == (out["prefix"], "ci")
    assert out["token"] not in str(list(ApiToken.objects.values()))  # only the hash is stored
    assert events(alice.user) == [
        (old[:12], "issued", None, "cli"),
        (old[:12], "revoked", None, "cli"),
        (second[:12], "issued", None, "cli"),
        (second[:12], "revoked", None, "cli"),
        (out["prefix"], "issued", None, "cli"),
    ]


def test_a_revoked_token_is_refused_on_the_next_request(alice):
    assert alice.api.get("/api/v1/accounts").status_code == 200
    out = json.loads(_call("revoke_api_token", "alice", "--json"))
    assert out == {"username": "alice", "revoked": [alice.token[:12]]}
    response = alice.api.get("/api/v1/accounts")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_a_token_revoked_behind_the_services_back_is_refused_on_the_next_request(alice):
    """Nothing caches a token: a revocation written straight to the database (another
    process, a SQL console) is seen by the next request too."""
    assert status_with(alice.token) == 200
    ApiToken.objects.filter(user=alice.user).update(revoked_at=Now())
    assert status_with(alice.token) == 401


def test_a_deactivated_clients_token_is_refused_until_reactivated(alice):
    assert status_with(alice.token) == 200
    type(alice.user).objects.filter(pk=alice.user.pk).update(is_active=False)
    response = alice.api.get("/api/v1/accounts")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    type(alice.user).objects.filter(pk=alice.user.pk).update(is_active=True)
    assert status_with(alice.token) == 200


def test_the_active_token_and_its_user_are_one_query(alice, django_assert_num_queries):
    with django_assert_num_queries(1):
        record = api_token_active(alice.token)
        assert record.user.pk == alice.user.pk and record.user.username == "alice"
    assert record == ApiToken.objects.get(key_hash=hash_token(alice.token))
    assert api_token_active(alice.token + "x") is None
    assert api_token_active("") is None
    api_token_revoke(token=record, actor=None, via=ApiTokenVia.CLI)
    assert api_token_active(alice.token) is None


def test_revoke_by_prefix_or_by_the_leaked_token_itself(alice):
    _, spare = _issue(alice.user)
    out = json.loads(_call("revoke_api_token", "alice", "--prefix", alice.token, "--json"))
    assert out["revoked"] == [alice.token[:12]]
    assert status_with(alice.token) == 401 and status_with(spare) == 200
    with pytest.raises(CommandError, match="No active token"):
        _call("revoke_api_token", "alice", "--prefix", alice.token[:12])  # already revoked
    with pytest.raises(CommandError, match="No user"):
        _call("revoke_api_token", "nobody")
    with pytest.raises(CommandError, match="No user"):
        _call("rotate_api_token", "nobody")
    assert len(events(alice.user)) == 3  # two issued, one revoked


def test_create_api_client_and_seed_demo_issue_and_revoke_through_the_service(settings, tmp_path):
    call_command("create_api_client", "acme", "--json", stdout=StringIO())
    assert [e[1:] for e in events(UserFactory(username="acme"))] == [("issued", None, "cli")]
    settings.DEBUG = True
    settings.VAR_DIR = tmp_path
    runs = [StringIO() for _ in range(4)]
    call_command("seed_demo", stdout=runs[0])
    call_command("seed_demo", stdout=runs[1])  # a restart: the same token, still valid
    tokens = [_printed_token(runs[0]), _printed_token(runs[1])]
    assert tokens[0] == tokens[1] and status_with(tokens[0]) == 200
    assert (tmp_path / "demo-token").read_text().strip() == tokens[0]
    assert (tmp_path / "demo-token").stat().st_mode & 0o077 == 0  # the owner's only
    demo = UserFactory(username="demo")
    assert [e[1] for e in events(demo)] == ["issued"]
    (tmp_path / "demo-token").unlink()  # the saved token is gone: revoke, issue anew
    call_command("seed_demo", stdout=runs[2])
    tokens.append(_printed_token(runs[2]))
    assert status_with(tokens[0]) == 401 and status_with(tokens[2]) == 200
    ApiToken.objects.filter(user=demo).update(revoked_at=Now())  # revoked by staff
    call_command("seed_demo", stdout=runs[3])
    assert _printed_token(runs[3]) not in tokens and status_with(_printed_token(runs[3])) == 200
    assert [e[1] for e in events(demo)] == ["issued", "revoked", "issued", "issued"]
    assert ApiToken.objects.filter(user=demo).count() == 3  # revoked, not deleted


# --- admin ---------------------------------------------------------------------


def test_admin_issues_a_token_shown_once_and_never_its_hash(token_admin, alice):
    url = reverse("admin:payments_apitoken_issue")
    assert token_admin.get(url).status_code == 200
    response = token_admin.post(url, {"username": "alice", "name": "laptop"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    token = response.context["token"]
    assert token in response.content.decode()
    assert status_with(token) == 200 and status_with(alice.token) == 200
    record = ApiToken.objects.get(user=alice.user, name="laptop")
    assert events(alice.user)[-1] == (record.prefix, "issued", "tess", "admin")
    pages = [
        token_admin.get(reverse("admin:payments_apitoken_changelist")),
        token_admin.get(reverse("admin:payments_apitoken_change", args=[record.pk])),
    ]
    for page in pages:
        text = page.content.decode()
        assert page.status_code == 200 and record.prefix in text
        assert token not in text and record.key_hash not in text
    assert "Issue a new token" in pages[0].content.decode()
    assert "messages" not in token_admin.cookies  # never carried in a message cookie
    error = token_admin.post(url, {"username": "nobody"})
    assert "No user" in error.content.decode()


def test_admin_rotate_revokes_the_other_tokens(token_admin, alice):
    response = token_admin.post(
        reverse("admin:payments_apitoken_issue"), {"username": "alice", "revoke_others": "on"}
    )
    assert status_with(alice.token) == 401 and status_with(response.context["token"]) == 200
    assert [e[1:] for e in events(alice.user)[-2:]] == [
        ("revoked", "tess", "admin"),
        ("issued", "tess", "admin"),
    ]


def test_admin_revoke_action_is_immediate_and_audited_once(token_admin, alice):
    record = ApiToken.objects.get(user=alice.user)
    changelist = reverse("admin:payments_apitoken_changelist")
    for _ in range(2):
        token_admin.post(changelist, {"action": "revoke_tokens", "_selected_action": [record.pk]})
    assert status_with(alice.token) == 401
    assert events(alice.user) == [
        (record.prefix, "issued", None, "cli"),
        (record.prefix, "revoked", "tess", "admin"),
    ]


def test_support_can_neither_see_issue_nor_revoke_tokens(client, alice):
    user = UserFactory(username="sam", is_staff=True)
    user.groups.add(Group.objects.get(name="Support"))
    client.force_login(user)
    record = ApiToken.objects.get(user=alice.user)
    assert client.get(reverse("admin:payments_apitoken_changelist")).status_code == 403
    assert client.get(reverse("admin:payments_apitoken_issue")).status_code == 403
    assert (
        client.post(reverse("admin:payments_apitoken_issue"), {"username": "alice"}).status_code
        == 403
    )
    client.post(
        reverse("admin:payments_apitoken_changelist"),
        {"action": "revoke_tokens", "_selected_action": [record.pk]},
    )
    assert status_with(alice.token) == 200
    assert ApiToken.objects.count() == 1


# --- helpers -------------------------------------------------------------------


def _call(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _issue(user):
    from payments.models import ApiTokenVia
    from payments.tokens import api_token_issue

    return api_token_issue(user=user, actor=None, via=ApiTokenVia.CLI)


def _printed_token(out: StringIO) -> str:
    line = next(line for line in out.getvalue().splitlines() if line.startswith("Token:"))
    return line.split()[1]
