"""Any 2xx within the timeout is a delivery success (docs/webhooks.md, "Delivery").

A real Celery worker delivers to a real loopback receiver (tests/receiver.py) that
answers 204 (no body), then 299 (the top of the range): both deliveries succeed at
their first attempt and nothing is retried.
"""

from __future__ import annotations

from tests.conftest import bearer, rpc, wait_until
from tests.receiver import Receiver


def _deliveries(client, handle, key, hook_id):
    resp = client.get(f"/api/v1/identities/{handle}/webhooks/{hook_id}/deliveries", headers=bearer(key))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()["items"]


def test_any_2xx_counts_as_delivery_success(client, alice, bob, celery_worker):
    _a, a_key = alice
    b_handle, b_key = bob
    with Receiver() as rx:
        rx.program("/hook", [204, 299], default=500)
        resp = client.post(
            f"/api/v1/identities/{b_handle}/webhooks",
            json={"url": rx.url("/hook"), "events": ["message.created"]},
            headers=bearer(b_key),
        )
        assert resp.status_code == 201, resp.get_data(as_text=True)
        hook_id = resp.get_json()["id"]

        text = {"message": {"parts": [{"type": "text", "text": "please review"}]}}
        task_id = rpc(client, a_key, "message/send", {**text, "recipient": b_handle})["task_id"]
        for n, status in enumerate((204, 299), start=1):
            if n == 2:
                rpc(client, a_key, "message/send", {**text, "task_id": task_id})

            def finished(n=n):
                items = _deliveries(client, b_handle, b_key, hook_id)
                return items if len(items) == n and all(d["attempt_count"] >= 1 for d in items) else None

            newest = wait_until(finished, 15, f"delivery {n} attempted")[0]
            assert newest["status"] == "succeeded", newest
            assert [a["status_code"] for a in newest["attempts"]] == [status], newest
            assert newest["attempt_count"] == 1 and newest["last_error"] is None, newest
            assert newest["next_attempt_at"] is None and newest["completed_at"], newest
        assert rx.count("/hook") == 2
