"""Job states and the pure rules about them (no I/O)."""
from __future__ import annotations

QUEUED, SUBMITTING, RUNNING, UNCERTAIN = "queued", "submitting", "running", "uncertain"
SUCCEEDED, FAILED, CANCELLED, EXPIRED = "succeeded", "failed", "cancelled", "expired"

IN_FLIGHT = (QUEUED, SUBMITTING, RUNNING, UNCERTAIN)
TERMINAL = (SUCCEEDED, FAILED, CANCELLED, EXPIRED)
ALL = IN_FLIGHT + TERMINAL

# Which states each terminal transition may start from (the compare-and-set
# guard of its one UPDATE). Anything else loses the race and changes nothing.
CLOSE_FROM = {
    SUCCEEDED: (RUNNING, UNCERTAIN),
    FAILED: IN_FLIGHT,
    EXPIRED: IN_FLIGHT,
    CANCELLED: IN_FLIGHT,
}

# Error codes a job may carry (CONTRACT.md).
PROVIDER_FAILED = "provider_failed"
SUBMIT_REJECTED = "submit_rejected"
SETTLE_EXHAUSTED = "settle_exhausted"
GIVE_UP = "give_up"
OUTPUT_TOO_LARGE = "output_too_large"
OUTPUT_REFUSED = "output_refused"  # the URL broke the download policy (host, address)
RESOLVED_FAILED = "resolved_failed"


def charge_for(reserved: int, reported_cost: int | None) -> int:
    """What a succeeded job is charged: the provider's cost capped at the
    reservation; a provider that reports no cost is charged the reservation."""
    if reported_cost is None:
        return reserved
    return max(0, min(int(reported_cost), reserved))
