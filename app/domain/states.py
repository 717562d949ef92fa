"""The pure rules about job states (no I/O). The words themselves are in
app/vocabulary.py."""
from __future__ import annotations

from app.vocabulary import IN_FLIGHT, JobStatus

# Which states each terminal transition may start from (the compare-and-set
# guard of its one UPDATE). Anything else loses the race and changes nothing.
CLOSE_FROM: dict[JobStatus, tuple[JobStatus, ...]] = {
    JobStatus.SUCCEEDED: (JobStatus.RUNNING, JobStatus.UNCERTAIN),
    JobStatus.FAILED: IN_FLIGHT,
    JobStatus.EXPIRED: IN_FLIGHT,
    JobStatus.CANCELLED: IN_FLIGHT,
}


def charge_for(reserved: int, reported_cost: int | None) -> int:
    """What a succeeded job is charged: the provider's cost capped at the
    reservation; a provider that reports no cost is charged the reservation."""
    if reported_cost is None:
        return reserved
    return max(0, min(int(reported_cost), reserved))
