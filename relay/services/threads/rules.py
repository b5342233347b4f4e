"""The handoff state machine: each transition's states and caller, what it stamps, what a lease fences."""

from __future__ import annotations

# tasks/update's transitions (docs/api.md, "Transition result"): transition -> (from state,
# to state, who may call it)
TRANSITIONS: dict[str, tuple[str, str, str]] = {
    "accept": ("pending", "accepted", "recipient"),
    "complete": ("accepted", "completed", "recipient"),
    "cancel": ("pending", "cancelled", "sender"),
    "decline": ("pending", "declined", "recipient"),
    "fail": ("accepted", "failed", "recipient"),
    "release": ("accepted", "pending", "recipient"),
    "renew": ("accepted", "accepted", "recipient"),
    "request_input": ("accepted", "input_required", "recipient"),
}
# A worker waiting on its requester may still finish, give up or give the work back, and the
# requester asked a question may withdraw the handoff instead of answering: these also run
# from input_required (the open question is then dropped).
ALSO_FROM: dict[str, tuple[str, ...]] = {
    "cancel": ("input_required",),
    "complete": ("input_required",),
    "fail": ("input_required",),
    "release": ("input_required",),
}
# What the requester's message does to an input_required handoff (audit action and
# task.updated transition): it is the answer, and the work goes on.
INPUT_PROVIDED = "input_provided"
STAMP_COLUMN = {
    "accepted": "accepted_at",
    "completed": "completed_at",
    "cancelled": "cancelled_at",
    "declined": "declined_at",
    "failed": "failed_at",
    "expired": "expired_at",
}
# Transitions whose reason is required (1-2,000 characters), and those a lease fences:
# while leased they must carry its current lease_token, and leased or not a lease_token
# they carry must be the current one.
REASON_REQUIRED = ("decline", "fail")
FENCED = ("complete", "fail", "release", "renew", "request_input")
# The audit actions (and task.updated transitions) of what the clock does, not a caller.
LEASE_EXPIRED, EXPIRED = "lease_expired", "expire"
