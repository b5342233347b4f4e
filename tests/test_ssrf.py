"""SSRF: every target that leads somewhere private is refused, on every surface (docs/webhooks.md, "Endpoints").

One table of targets, each with what its refusal must say, checked at every place a URL
is judged: the pure check (``outbound.resolve``), webhook registration and PATCH over
REST, A2A push configs (CreateTaskPushNotificationConfig and SendMessage's
configuration), and delivery, where an endpoint whose stored URL was changed behind the
relay's back gets a refused attempt and no connection.

Each surface is one test that walks the whole table and collects what it let through,
so a failure lists every target the surface accepted. The relay under test refuses
private targets (RELAY_WEBHOOK_ALLOW_PRIVATE=0, the production default) and allows
plain http, so the table reaches the address check rather than the scheme check.
Nothing HTTP is mocked; the one delivery that could connect goes to a real loopback
receiver (tests/receiver.py).
"""

from __future__ import annotations

import json
import uuid

import pytest

from relay.ids import parse_ulid
from relay.services import outbound, webhooks
from tests.conftest import bearer, extra_app, rpc_answer, sql
from tests.receiver import Receiver

LOOPBACK = "a loopback address"
LINK_LOCAL = "a link-local (metadata) address"
PRIVATE = "a private address"
DOCS = "a documentation address"
UNRESOLVED = "does not resolve"

# (url, what the refusal must say; a tuple: any one of them)
TARGETS: list[tuple[str, str | tuple[str, ...]]] = [
    # IPv4 literals, every special-purpose range
    ("http://127.0.0.1/", LOOPBACK),
    ("http://127.255.255.254:8080/x", LOOPBACK),
    ("http://10.0.0.1/", PRIVATE),
    ("http://172.16.0.1/", PRIVATE),
    ("http://172.31.255.255/", PRIVATE),
    ("http://192.168.1.1/", PRIVATE),
    ("http://169.254.169.254/latest/meta-data/", LINK_LOCAL),
    ("http://169.254.0.1/", LINK_LOCAL),
    ("http://0.0.0.0/", "an unspecified address"),
    ("http://0.1.2.3/", "'this network'"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://100.127.255.254/", "carrier-grade NAT"),
    ("http://192.0.0.1/", "IETF protocol assignment"),
    ("http://192.0.0.170/", "IETF protocol assignment"),
    ("http://192.0.2.1/", DOCS),
    ("http://198.51.100.7/", DOCS),
    ("http://203.0.113.9/", DOCS),
    ("http://198.18.0.1/", "benchmarking"),
    ("http://198.19.255.1/", "benchmarking"),
    ("http://192.88.99.1/", "6to4 relay anycast"),
    ("http://224.0.0.1/", "multicast"),
    ("http://239.255.255.250/", "multicast"),
    ("http://240.0.0.1/", "a reserved address"),
    ("http://255.255.255.254/", "a reserved address"),
    ("http://255.255.255.255/", "the broadcast address"),
    # other spellings of IPv4 (the resolver's inet_aton reads them)
    ("http://2130706433/", LOOPBACK),
    ("http://0x7f.1/", LOOPBACK),
    ("http://0x7f000001/", LOOPBACK),
    ("http://0x7f.0.0.1/", LOOPBACK),
    ("http://0177.0.0.1/", LOOPBACK),
    ("http://017700000001/", LOOPBACK),
    ("http://127.1/", LOOPBACK),
    ("http://0/", "an unspecified address"),
    ("http://3232235777/", PRIVATE),
    ("http://2852039166/", LINK_LOCAL),
    ("http://0xa9.0xfe.0xa9.0xfe/", LINK_LOCAL),
    ("http://0251.0376.0251.0376/", LINK_LOCAL),
    ("http://0xa.0.0.1/", PRIVATE),
    # names
    ("http://localhost/", LOOPBACK),
    ("http://LOCALHOST:8080/", LOOPBACK),
    ("http://localhost./", (LOOPBACK, UNRESOLVED)),
    ("http://127.0.0.1./", (LOOPBACK, UNRESOLVED)),
    ("https://localhost.:443/", (LOOPBACK, UNRESOLVED)),
    # IPv6 literals
    ("http://[::1]/", LOOPBACK),
    ("http://[0:0:0:0:0:0:0:1]:8080/", LOOPBACK),
    ("http://[::]/", "an unspecified address"),
    ("http://[fe80::1]/", "a link-local address"),
    ("http://[fe80::1%251]/", "a link-local address"),
    ("http://[fc00::1]/", "a unique-local address"),
    ("http://[fd00:ec2::254]/", "a unique-local address"),
    ("http://[fdff:ffff::1]/", "a unique-local address"),
    ("https://[fec0::1]/", "a site-local address"),
    ("http://[feff::1]/", "a site-local address"),
    ("http://[ff02::1]/", "a multicast address"),
    ("http://[ff05::1:3]/", "a multicast address"),
    ("http://[100::1]/", "discard-only"),
    ("http://[2001:db8::1]/", DOCS),
    ("http://[3fff::1]/", DOCS),
    ("http://[2001:2::1]/", "benchmarking"),
    ("http://[2001:10::1]/", "IETF protocol assignment"),
    ("http://[5f00::1]/", "SRv6"),
    ("http://[4000::1]/", "a reserved address"),
    ("http://[8000::1]/", "a reserved address"),
    ("http://[::ffff:0:7f00:1]/", "a reserved address"),  # SIIT's IPv4-translated ::ffff:0:0:0/96
    # IPv4-mapped ::ffff:0:0/96
    ("http://[::ffff:127.0.0.1]/", f"IPv4-mapped {LOOPBACK}, 127.0.0.1"),
    ("http://[::ffff:7f00:1]/", f"IPv4-mapped {LOOPBACK}"),
    ("http://[::ffff:169.254.169.254]/", f"IPv4-mapped {LINK_LOCAL}, 169.254.169.254"),
    ("http://[::ffff:10.0.0.1]/", f"IPv4-mapped {PRIVATE}"),
    ("http://[0:0:0:0:0:ffff:192.168.0.1]/", f"IPv4-mapped {PRIVATE}"),
    ("http://[::ffff:0.0.0.0]/", "IPv4-mapped an unspecified address"),
    ("http://[::ffff:100.64.0.1]/", "IPv4-mapped a shared (carrier-grade NAT)"),
    ("http://[::ffff:255.255.255.255]/", "IPv4-mapped the broadcast address"),
    # IPv4-compatible ::/96 (deprecated: refused whatever it carries)
    ("http://[::127.0.0.1]/", f"IPv4-compatible {LOOPBACK}, 127.0.0.1"),
    ("http://[::169.254.169.254]/", f"IPv4-compatible {LINK_LOCAL}"),
    ("http://[::2]/", "IPv4-compatible a 'this network' address"),
    ("http://[::8.8.8.8]/", "deprecated IPv4-compatible address (8.8.8.8)"),
    # NAT64 64:ff9b::/96 and the local-use 64:ff9b:1::/48
    ("http://[64:ff9b::127.0.0.1]/", f"NAT64 of {LOOPBACK}, 127.0.0.1"),
    ("http://[64:ff9b::a9fe:a9fe]/", f"NAT64 of {LINK_LOCAL}, 169.254.169.254"),
    ("http://[64:ff9b::10.1.1.1]/", f"NAT64 of {PRIVATE}"),
    ("http://[64:ff9b:1::7f00:1]/", f"local-use NAT64 of {LOOPBACK}"),
    ("http://[64:ff9b:1::808:808]/", "local-use NAT64 address"),
    # 6to4 2002::/16
    ("https://[2002:7f00:1::]/", f"6to4 of {LOOPBACK}, 127.0.0.1"),
    ("https://[2002:a9fe:a9fe::]/", f"6to4 of {LINK_LOCAL}, 169.254.169.254"),
    ("https://[2002:c0a8:101::]/", f"6to4 of {PRIVATE}, 192.168.1.1"),
    ("https://[2002:a00:1::1]/", f"6to4 of {PRIVATE}, 10.0.0.1"),
    ("https://[2002::]/", "6to4 of an unspecified address, 0.0.0.0"),
    ("https://[2002:6440:1::]/", "6to4 of a shared (carrier-grade NAT) address, 100.64.0.1"),
    ("https://[2002:e000:1::]/", "6to4 of a multicast address, 224.0.0.1"),
    # Teredo 2001::/32: server, then client (stored inverted); refused whatever it carries
    ("http://[2001:0:7f00:1::f7f7:f7f7]/", f"Teredo with its server at {LOOPBACK}, 127.0.0.1"),
    ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", f"Teredo with its client at {LOOPBACK}, 127.0.0.1"),
    ("http://[2001:0:4136:e378::5601:5601]/", f"Teredo with its client at {LINK_LOCAL}, 169.254.169.254"),
    ("http://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/", "a Teredo address"),
]

# Public targets that must stay callable (literals: the check resolves nothing, nothing is sent).
ACCEPTED = [
    "http://93.184.216.34/hook",
    "https://[2606:2800:220:1:248:1893:25c8:1946]/hook",
    "http://[::ffff:93.184.216.34]/hook",  # IPv4-mapped public
    "http://[64:ff9b::93.184.216.34]/hook",  # NAT64 of a public address
    "https://[2002:5db8:d822::1]/hook",  # 6to4 of a public address
    "http://8.8.8.8:8443/hook",
]
PUBLIC = ACCEPTED[0]
URLS = [url for url, _ in TARGETS]


def _says(message: str, expected: str | tuple[str, ...]) -> bool:
    return any(e in message for e in (expected if isinstance(expected, tuple) else (expected,)))


def _violations(error: dict) -> dict:
    return {
        v["field"]: v["description"]
        for d in error.get("data") or []
        if d.get("@type", "").endswith("google.rpc.BadRequest")
        for v in d["fieldViolations"]
    }


def _message(text: str) -> dict:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}


@pytest.fixture(scope="module")
def strict(base_env, celery_app, redis_url):
    """The relay refusing private targets (the production default), plain http allowed.

    One endpoint takes every refused attempt here, so its circuit must not open.
    """
    with extra_app(
        base_env,
        celery_app,
        redis_url,
        RELAY_WEBHOOK_ALLOW_PRIVATE="0",
        RELAY_WEBHOOK_ALLOW_HTTP="1",
        RELAY_WEBHOOK_CIRCUIT_FAILURES="1000",
    ) as other:
        yield other


def test_the_table_covers_every_form():
    assert len(TARGETS) >= 80 and len(set(URLS)) == len(URLS)


# --------------------------------------------------------------------------- the pure check


def _check(surface: str, outcomes: list[tuple[str, str | tuple[str, ...], str | None]]) -> None:
    """``outcomes``: (url, what the refusal must say, the refusal's text or None if accepted)."""
    accepted = [url for url, _expected, said in outcomes if said is None]
    assert accepted == [], f"{surface} accepted {len(accepted)} of {len(outcomes)} targets: {accepted}"
    unexplained = [(url, said) for url, expected, said in outcomes if not _says(said, expected)]
    assert unexplained == [], f"{surface} refused without naming the reason: {unexplained}"


def test_resolve_refuses_every_target_and_says_why():
    outcomes = []
    for url, expected in TARGETS:
        try:
            outbound.resolve(url, allow_private=False, allow_http=True)
        except outbound.TargetRefused as exc:
            outcomes.append((url, expected, str(exc)))
        else:
            outcomes.append((url, expected, None))
    _check("outbound.resolve", outcomes)
    for url in ACCEPTED:
        outbound.resolve(url, allow_private=False, allow_http=True)  # raises if refused


def test_allow_private_lets_address_refusals_through():
    """RELAY_WEBHOOK_ALLOW_PRIVATE=1 waives the address rules (the tests' receivers), nothing else."""
    for url, expected in TARGETS:
        if expected != (LOOPBACK, UNRESOLVED):
            outbound.resolve(url, allow_private=True, allow_http=True)
    with pytest.raises(outbound.TargetRefused, match="credentials"):
        outbound.resolve("http://user:pw@127.0.0.1/", allow_private=True, allow_http=True)


# --------------------------------------------------------------------------- registration


def _rest_refusal(resp) -> str | None:
    """The 422's message naming ``url``; None if the call succeeded; else a description of what came back."""
    if resp.status_code in (200, 201):
        return None
    error = (resp.get_json() or {}).get("error") or {}
    if resp.status_code == 422 and error.get("code") == "invalid_params" and "url" in error.get("details", {}):
        return error["message"]
    return f"HTTP {resp.status_code}: {resp.get_data(as_text=True)}"


def _a2a_refusal(body: dict, field: str) -> str | None:
    """The -32602's violation of ``field``; None if the call succeeded; else the whole answer."""
    if "result" in body:
        return None
    found = _violations(body["error"])
    return found[field] if body["error"]["code"] == -32602 and field in found else json.dumps(body)


def test_rest_registration_refuses_every_target(app, strict, alice):
    handle, key = alice
    client = strict.test_client()
    hooks = f"/api/v1/identities/{handle}/webhooks"
    outcomes = []
    for url, expected in TARGETS:
        outcomes.append((url, expected, _rest_refusal(client.post(hooks, json={"url": url}, headers=bearer(key)))))
    _check("POST .../webhooks", outcomes)
    assert client.get(hooks, headers=bearer(key)).get_json() == {"items": []}
    resp = client.post(hooks, json={"url": PUBLIC}, headers=bearer(key))
    assert resp.status_code == 201, resp.get_data(as_text=True)


def test_rest_patch_refuses_every_target(strict, alice):
    handle, key = alice
    client = strict.test_client()
    hooks = f"/api/v1/identities/{handle}/webhooks"
    resp = client.post(hooks, json={"url": PUBLIC}, headers=bearer(key))
    assert resp.status_code == 201, resp.get_data(as_text=True)
    hook = f"{hooks}/{resp.get_json()['id']}"
    outcomes = []
    for url, expected in TARGETS:
        outcomes.append((url, expected, _rest_refusal(client.patch(hook, json={"url": url}, headers=bearer(key)))))
    _check("PATCH .../webhooks/{id}", outcomes)
    assert client.get(hook, headers=bearer(key)).get_json()["url"] == PUBLIC


def _push_targets() -> list[tuple[str, str | tuple[str, ...]]]:
    """The table as a push config meets it: a name that does not resolve here (``localhost.``
    on some resolvers) is taken at registration and refused by the delivery's own check,
    which ``test_delivery_refuses_every_target_stored_behind_the_apis_back`` covers."""
    kept = []
    for url, expected in TARGETS:
        try:
            outbound.resolve(url, allow_private=False, allow_http=True)
        except outbound.TargetRefused as exc:
            if exc.kind == "dns":
                continue
        kept.append((url, expected))
    return kept


def test_a2a_push_config_create_refuses_every_target(app, strict, alice, bob):
    _a, key = alice
    peer = bob[0]
    client = strict.test_client()
    task = rpc_answer(client, key, "SendMessage", {"message": _message("push me")}, agent=peer)["result"]["task"]
    outcomes = []
    for url, expected in _push_targets():
        body = rpc_answer(
            client, key, "CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": url}, agent=peer
        )
        outcomes.append((url, expected, _a2a_refusal(body, "url")))
    _check("CreateTaskPushNotificationConfig", outcomes)
    assert sql(app, "SELECT count(*) FROM webhook_endpoints")[0][0] == 0


def test_a2a_send_message_configuration_refuses_every_target(app, strict, alice, bob):
    _a, key = alice
    peer = bob[0]
    client = strict.test_client()
    outcomes = []
    for url, expected in _push_targets():
        params = {"message": _message("push me"), "configuration": {"taskPushNotificationConfig": {"url": url}}}
        body = rpc_answer(client, key, "SendMessage", params, agent=peer)
        outcomes.append((url, expected, _a2a_refusal(body, "configuration.taskPushNotificationConfig.url")))
    _check("SendMessage configuration.taskPushNotificationConfig", outcomes)
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == 0
    assert sql(app, "SELECT count(*) FROM webhook_endpoints")[0][0] == 0


# --------------------------------------------------------------------------- delivery


def _attempt(delivering, strict, handle, key, hook_id, url):
    """Point the endpoint's stored URL at ``url`` (behind the API's back), send it a test
    event and make one delivery attempt in the app ``delivering``; return (status, the attempt's error)."""
    sql(strict, "UPDATE webhook_endpoints SET url = :u WHERE id = :i", u=url, i=hook_id)
    resp = strict.test_client().post(f"/api/v1/identities/{handle}/webhooks/{hook_id}/test", headers=bearer(key))
    assert resp.status_code == 202, resp.get_data(as_text=True)
    event_id = parse_ulid(resp.get_json()["event_id"].removeprefix("evt_"))
    with strict.app_context():
        [delivery_id] = webhooks.fan_out(event_id)
    with delivering.app_context():
        status = webhooks.deliver(delivery_id)
    [(error,)] = sql(strict, "SELECT error FROM webhook_attempts WHERE delivery_id = :d", d=str(delivery_id))
    return status, error


def test_delivery_refuses_every_target_stored_behind_the_apis_back(strict, alice):
    """Delivery re-checks the stored URL: a row changed in the database is refused before any connection."""
    handle, key = alice
    client = strict.test_client()
    resp = client.post(f"/api/v1/identities/{handle}/webhooks", json={"url": PUBLIC}, headers=bearer(key))
    assert resp.status_code == 201, resp.get_data(as_text=True)
    hook_id = resp.get_json()["id"]
    outcomes = []
    for url, expected in TARGETS:
        status, error = _attempt(strict, strict, handle, key, hook_id, url)
        # A name that does not resolve (localhost. here) is a DNS failure: refused too, before any connection.
        refused = status == "pending" and error is not None and error.startswith(("refused: ", "DNS failure: "))
        outcomes.append((url, expected, error if refused else None))
    _check("delivery", outcomes)


RECEIVER_SPELLINGS = [  # each reaches a receiver on 127.0.0.1 when allowed
    "http://2130706433:{port}/hook",
    "http://0x7f.1:{port}/hook",
    "http://0177.0.0.1:{port}/hook",
    "http://127.1:{port}/hook",
    "http://localhost:{port}/hook",
    "http://[::ffff:127.0.0.1]:{port}/hook",
]


def test_refused_delivery_makes_no_connection_where_an_allowed_one_would(app, strict, alice):
    """End to end: the stored URL is another spelling of a live receiver; the strict relay
    records a refused attempt and the receiver hears nothing, while the permissive relay
    (private targets allowed) reaches it with the same row, so the refusal is what stopped it."""
    handle, key = alice
    client = strict.test_client()
    with Receiver() as rx:
        resp = client.post(f"/api/v1/identities/{handle}/webhooks", json={"url": PUBLIC}, headers=bearer(key))
        assert resp.status_code == 201, resp.get_data(as_text=True)
        hook_id = resp.get_json()["id"]
        for n, spelling in enumerate(RECEIVER_SPELLINGS):
            url = spelling.format(port=rx.port)
            status, error = _attempt(strict, strict, handle, key, hook_id, url)
            assert status == "pending" and error.startswith("refused: ") and LOOPBACK in error, (url, status, error)
            assert rx.count() == n, f"{url}: the refused attempt connected"
            status, error = _attempt(app, strict, handle, key, hook_id, url)
            assert (status, error) == ("succeeded", None), url
            rx.wait_for(n + 1, timeout=5)
