"""Logging: one JSON object per line, level from LOG_LEVEL.

Nothing secret is ever passed to a log call; query strings (read tokens,
capability tokens) never reach the log because uvicorn's access log is off and
ours logs paths only. The HTTP client's own loggers are held at WARNING
whatever LOG_LEVEL says: httpx logs every request's full URL at INFO, and an
output URL's query is often its only key (a presigned S3 or Azure SAS
signature); httpcore traces every request at DEBUG, and aiohttp (which
sends them: app/http_transport.py) can name a URL in its own.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import sys

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():  # extra={...} fields: job_id, owner, provider...
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = record.exc_info[0].__name__
        return json.dumps(entry, default=str)


QUIET_LOGGERS = ("httpx", "httpcore", "aiohttp")  # they log URLs with their queries


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)



def uvicorn_log_config() -> dict:
    """uvicorn's own loggers through our JSON handler; its access log is
    replaced (it prints query strings, where tokens travel)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "json",
                                 "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False},
        },
    }
