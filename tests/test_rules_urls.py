"""One URL rule for every surface (docs/api.md, "URLs"), each refusal saying which rule refused it.

- A link artifact takes every valid http(s) URL: one-label and short hosts, ``_`` in a
  host, IDNs, ports, IPv4 and IPv6 literals, private hosts; stored as sent.
- A scheme other than http(s) is refused as that ("scheme 'ftp' is not allowed").
- A malformed URL is refused saying what is wrong with it.
- Webhooks take the same URLs by the same rule (an IDN host is resolved by its ASCII
  form), and refuse the same ones with the same reasons; on top, plain http is refused
  naming RELAY_WEBHOOK_ALLOW_HTTP, and private or loopback targets naming
  RELAY_WEBHOOK_ALLOW_PRIVATE.
"""

from __future__ import annotations

import pytest

from tests.conftest import bearer, extra_app, rpc, rpc_error, sql

VALID = [
    "https://a.b/c",
    "http://intranet/wiki",
    "http://localhost:3000/docs",
    "https://my_host.example.com/x",
    "https://_dmarc.example.com/",
    "https://bücher.example/kapitel?seite=2#oben",
    "https://例え.テスト/パス",
    "HTTPS://Example.COM:8443/Path",
    "http://10.1.2.3/internal",
    "http://127.1:8080/",
    "http://[2001:db8::1]:8443/x",
    "http://[::1]/",
    "https://example.com./trailing-dot",
    "https://a.b:/empty-port",
]

SCHEMES = [
    ("ftp://files.example.com/a.txt", "scheme 'ftp' is not allowed (only http and https)"),
    ("file:///etc/passwd", "scheme 'file' is not allowed (only http and https)"),
    ("javascript:alert(1)", "scheme 'javascript' is not allowed (only http and https)"),
]

MALFORMED = [
    ("example.com/x", "is not a valid URL: it has no scheme (start it with https://)"),
    ("https:///x", "is not a valid URL: it has no host (write https://host/...)"),
    ("http:x", "is not a valid URL: it has no host (write http://host/...)"),
    ("https://a..b/", "is not a valid URL: host 'a..b' has an empty label"),
    ("https://a.b:99999/", "is not a valid URL: the port must be a number 1-65535"),
    ("https://a.b:0/", "is not a valid URL: the port must be a number 1-65535"),
    ("https://a b.com/", "is not a valid URL: it holds a space or a control character"),
    ("https://foo.123/", "is not a valid URL: host 'foo.123' ends in a number, so it must be an IPv4 address"),
    ("https://1.2.3.4.5/", "is not a valid URL: host '1.2.3.4.5' ends in a number"),
    ("https://[v1.x]/", "is not a valid URL: host [v1.x] is not an IPv6 address"),
    ("https://a!b.com/", "is not a valid URL: host 'a!b.com' may hold only letters, digits, '-', '_' and '.'"),
    ("https://xn--zz.com/", "is not a valid URL: host label 'xn--zz' is not a valid IDN A-label"),
]


def _link(recipient, url):
    return {
        "recipient": recipient,
        "message": {"parts": [{"type": "text", "text": "see the link"}]},
        "artifacts": [{"type": "link", "url": url, "title": "the page"}],
    }


def _link_refusal(client, key, recipient, url) -> dict:
    """The -32602 refusal of a link to ``url``: its ``data.errors``."""
    error = rpc_error(client, key, "message/send", _link(recipient, url))
    assert error["code"] == -32602, (url, error)
    return error["data"]["errors"]


def _hook(client, handle, key, url):
    return client.post(f"/api/v1/identities/{handle}/webhooks", json={"url": url}, headers=bearer(key))


def _hook_refusal(client, handle, key, url) -> list[str]:
    resp = _hook(client, handle, key, url)
    assert resp.status_code == 422, (url, resp.status_code, resp.get_data(as_text=True))
    details = resp.get_json()["error"]["details"]
    assert list(details) == ["url"], (url, details)
    return details["url"]


def test_a_link_takes_every_valid_http_url_as_sent(client, alice, bob):
    _a, key = alice
    stored = []
    for url in VALID:
        task_id = rpc(client, key, "message/send", _link(bob[0], url))["task_id"]
        [message] = rpc(client, key, "tasks/get", {"task_id": task_id})["messages"]
        stored.append(message["artifacts"][0]["url"])
    assert stored == VALID


def test_a_link_with_another_scheme_is_refused_as_that(app, client, alice, bob):
    _a, key = alice
    said = {url: _link_refusal(client, key, bob[0], url) for url, _reason in SCHEMES}
    assert said == {url: {"artifacts.0.url": [reason]} for url, reason in SCHEMES}
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == 0


def test_a_malformed_link_is_refused_saying_what_is_wrong(app, client, alice, bob):
    _a, key = alice
    wrong = {}
    for url, reason in MALFORMED:
        errors = _link_refusal(client, key, bob[0], url)
        if list(errors) != ["artifacts.0.url"] or not errors["artifacts.0.url"][0].startswith(reason):
            wrong[url] = errors
    assert wrong == {}
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == 0


def test_a_link_keeps_a_media_type_as_sent_and_refuses_one_that_is_not(app, client, alice, bob):
    _a, key = alice
    kept = []
    for media_type in ("text/plain", "application/vnd.api+json; charset=utf-8"):
        params = _link(bob[0], "https://example.com/a")
        params["artifacts"][0]["mediaType"] = media_type
        task_id = rpc(client, key, "message/send", params)["task_id"]
        [message] = rpc(client, key, "tasks/get", {"task_id": task_id})["messages"]
        kept.append(message["artifacts"][0]["mediaType"])
    assert kept == ["text/plain", "application/vnd.api+json; charset=utf-8"]
    for bad in ("not a media type", "text/plain\n", "tëxt/plain", "text/", "a/b/c", "text/plain\r\nX-Evil: 1"):
        params = _link(bob[0], "https://example.com/a")
        params["artifacts"][0]["mediaType"] = bad
        resp = client.post(
            "/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": params}, headers=bearer(key)
        )
        errors = resp.get_json()["error"]["data"]["errors"]
        assert errors == {"artifacts.0.mediaType": ["must be a media type such as text/plain"]}, bad
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == 2


@pytest.fixture(scope="module")
def production(base_env, celery_app, redis_url):
    """A relay with production's webhook settings: https only, no private targets."""
    with extra_app(
        base_env, celery_app, redis_url, RELAY_WEBHOOK_ALLOW_PRIVATE="0", RELAY_WEBHOOK_ALLOW_HTTP="0"
    ) as other:
        yield other


def test_webhooks_refuse_what_links_refuse_with_the_same_reason(client, alice):
    handle, key = alice
    wrong = {}
    for url, reason in SCHEMES + MALFORMED:
        said = _hook_refusal(client, handle, key, url)
        if not said[0].startswith(reason):
            wrong[url] = said
    assert wrong == {}


def test_webhooks_take_the_same_urls_and_resolve_an_idn_by_its_ascii_form(client, alice):
    """Literal hosts (private ones allowed here) register; names that cannot resolve get past the URL rule
    and are refused only by DNS, an IDN under the ASCII name it was resolved by."""
    handle, key = alice
    for url in ("http://127.1:9/hook", "http://[::1]:9/hook", "https://10.1.2.3/hook", "HTTP://LOCALHOST:9/x"):
        resp = _hook(client, handle, key, url)
        assert resp.status_code == 201, (url, resp.get_data(as_text=True))
        assert resp.get_json()["url"] == url
    names = {
        "https://bücher.invalid/hook": "host 'xn--bcher-kva.invalid' does not resolve",
        "https://my_host.invalid/hook": "host 'my_host.invalid' does not resolve",
        "https://a.invalid/c": "host 'a.invalid' does not resolve",
    }
    said = {url: _hook_refusal(client, handle, key, url) for url in names}
    assert said == {url: [reason] for url, reason in names.items()}


def test_plain_http_webhook_is_refused_naming_the_setting(production, alice):
    handle, key = alice
    said = _hook_refusal(production.test_client(), handle, key, "http://93.184.216.34/hook")
    assert said == ["plain http is not allowed: must use https (set RELAY_WEBHOOK_ALLOW_HTTP=1 to allow http)"]


def test_private_or_loopback_webhook_is_refused_naming_the_setting(production, alice):
    handle, key = alice
    client = production.test_client()
    for url, reason in (
        ("https://127.0.0.1/hook", "a loopback address"),
        ("https://localhost/hook", "a loopback address"),
        ("https://192.168.1.10/hook", "a private address"),
    ):
        [said] = _hook_refusal(client, handle, key, url)
        assert f"({reason}): private, loopback and other non-public addresses are not allowed" in said, said
        assert said.endswith("set RELAY_WEBHOOK_ALLOW_PRIVATE=1 to allow such targets"), said
    resp = _hook(client, handle, key, "https://93.184.216.34/hook")
    assert resp.status_code == 201, resp.get_data(as_text=True)
