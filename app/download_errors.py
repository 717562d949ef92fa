"""What a download can fail with, apart from the download code (which needs
httpx), so the pure decisions in outbox/decide.py can name the classes."""
from __future__ import annotations


class DownloadError(Exception):
    """The output could not be fetched. The message is safe to store and log."""


class OutputTooLarge(DownloadError):
    """The output is larger than the byte cap."""


class Refused(DownloadError):
    """Policy refused the URL (scheme, host, address, redirects); nothing was fetched from it."""


class OutputGone(DownloadError):
    """The output's host answered 404 or 410: it does not have the output
    (any more, or yet). Whether that means expired is the settle step's call."""


class HostBusy(DownloadError):
    """The output's host already has as many downloads running as allowed;
    nothing was fetched. Asking again later is the answer."""
