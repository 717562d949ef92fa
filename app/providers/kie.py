"""KIE's market API (https://docs.kie.ai/market/common/get-task-detail).

KIE answers HTTP 200 with its own `code` in the body; that code decides.
Its optional webhook signature covers only `taskId.timestamp`, not the
body, so we do not rely on it: the callback URL we hand KIE carries our
own capability token, and `verify` checks that token. There is no cancel
endpoint.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import httpx

from app.providers.base import (
    Observation,
    Provider,
    ProviderFacts,
    Rejected,
    SubmitRequest,
    Submitted,
    Task,
    TaskState,
    Transient,
    Uncertain,
    WebhookRequest,
)
from app.providers.http import (
    Clients,
    Secrets,
    ended,
    host_of,
    json_object,
    read_call,
    submit_call,
)
from app.signing.tokens import check_capability_token, make_capability_token
from app.vocabulary import ProviderName

NAME = ProviderName.KIE

_STATES = {
    "waiting": TaskState.RUNNING,
    "wait": TaskState.RUNNING,
    "queuing": TaskState.RUNNING,
    "queueing": TaskState.RUNNING,
    "generating": TaskState.RUNNING,
    "success": TaskState.SUCCEEDED,
    "fail": TaskState.FAILED,
}
# KIE's documented body codes for a create that did not happen.
_REJECTED_CODES = {400, 401, 402, 403, 404, 422, 505}
# 455: "service unavailable, undergoing maintenance": refused, not taken.
_TRANSIENT_CODES = {429, 455}


def body_code(body: Mapping[str, Any]) -> int | None:
    code = body.get("code")
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return code
    if isinstance(code, str) and code.strip().isdigit():
        return int(code)
    return None


def _message(body: Mapping[str, Any], secrets: Secrets) -> str:
    return secrets.reason(body.get("msg") or body.get("message")) or ""


def submit_outcome(body: Mapping[str, Any], secrets: Secrets) -> str:
    """The task id from a createTask answer, or the error its `code` means
    (pure): 4xx codes Rejected, 429/455 Transient, 5xx or unknown Uncertain."""
    code = body_code(body)
    detail = _message(body, secrets)
    suffix = f": {detail}" if detail else ""
    if code == 200:
        data = body.get("data")
        task_id = data.get("taskId") if isinstance(data, Mapping) else None
        if isinstance(task_id, str) and task_id:
            return task_id
        raise Uncertain(f"{NAME}: submit answer has no task id")
    if code in _TRANSIENT_CODES:
        raise Transient(f"{NAME}: submit refused (code {code}){suffix}")
    if code in _REJECTED_CODES:
        raise Rejected(f"{NAME}: submit rejected (code {code}){suffix}")
    raise Uncertain(f"{NAME}: submit answered code {code}{suffix}")


def result_urls(result_json: Any) -> tuple[str, ...]:
    """`resultUrls` from `resultJson` (a JSON string, or already an object)."""
    if isinstance(result_json, str):
        try:
            result_json = json.loads(result_json)
        except ValueError:
            return ()
    if not isinstance(result_json, Mapping):
        return ()
    urls = result_json.get("resultUrls")
    if not isinstance(urls, list):
        return ()
    return tuple(u for u in urls if isinstance(u, str) and u.startswith(("https://", "http://")))


def observation_from_record(data: Mapping[str, Any], secrets: Secrets) -> Observation:
    """A recordInfo `data` object as an Observation (pure)."""
    state = _STATES.get(data.get("state"))  # type: ignore[arg-type]
    if state is None:
        raise Transient(f"{NAME}: unknown task state {secrets.mask(str(data.get('state')), 40)!r}")
    if state is TaskState.SUCCEEDED:
        return Observation(state=state, output_urls=result_urls(data.get("resultJson")))
    if state is TaskState.FAILED:
        return ended(state, secrets, data.get("failMsg"), data.get("failCode"), fallback="the task failed")
    return Observation(state=state)


def with_token(callback_url: str, token: str) -> str:
    separator = "&" if "?" in callback_url else "?"
    return f"{callback_url}{separator}{urlencode({'token': token})}"


class KieProvider(Provider):
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        secret_keys: Sequence[bytes],
        timeout_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
        stale_after_s: float = 60.0,
    ):
        if not secret_keys:
            raise ValueError("KieProvider needs at least one server secret key")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._secret_keys = tuple(secret_keys)
        self._http = Clients(timeout_s, client)
        self.facts = ProviderFacts(
            name=NAME,
            webhook_scheme="capability-url",
            idempotent_submit=False,
            can_find=False,
            stale_after_s=stale_after_s,
            output_hosts=(
                "tempfile.aiquickdraw.com",
                ".aiquickdraw.com",
                "tempfile.redpandaai.co",
                ".redpandaai.co",
                ".kie.ai",
                host_of(self.base_url),
            ),
            # KIE keeps generated files for about a day; we copy them at once.
            output_ttl_s=24 * 3600.0,
        )

    def __repr__(self) -> str:
        return f"KieProvider({self.base_url!r})"

    @property
    def _secrets(self) -> Secrets:
        return Secrets(self._api_key)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def submit(self, request: SubmitRequest, idempotency_key: str) -> Submitted:
        body: dict[str, Any] = {"model": request.model, "input": dict(request.input)}
        secrets = self._secrets.plus_callback(request.callback_url)
        if request.callback_url:
            token = make_capability_token(NAME, request.job_id, self._secret_keys[0])
            body["callBackUrl"] = with_token(request.callback_url, token)
            secrets = secrets.plus(token)
        response = await submit_call(
            self._http.submits, NAME, "POST", f"{self.base_url}/api/v1/jobs/createTask",
            json=body, headers=self._headers(), secrets=secrets,
        )
        data = json_object(response, NAME, Uncertain)
        return Submitted(task_id=submit_outcome(data, secrets))

    async def status(self, task: Task) -> Observation:
        response = await read_call(
            self._http.reads, NAME, "GET", f"{self.base_url}/api/v1/jobs/recordInfo",
            params={"taskId": task.task_id}, headers=self._headers(), secrets=self._secrets,
            not_found=None,  # KIE says "no such task" with body code 404, not HTTP 404
        )
        body = json_object(response, NAME, Transient)
        code = body_code(body)
        if code == 404:
            raise Rejected(f"{NAME}: no such task (code 404)")
        if code != 200:
            detail = _message(body, self._secrets)
            raise Transient(f"{NAME}: recordInfo answered code {code}" + (f": {detail}" if detail else ""))
        data = body.get("data")
        if not isinstance(data, Mapping):
            raise Transient(f"{NAME}: recordInfo answer has no data")
        return observation_from_record(data, self._secrets)

    async def cancel(self, task: Task) -> None:
        return None  # KIE has no cancel endpoint; the task runs out on its own

    async def find(self, request: SubmitRequest) -> Submitted | None:
        return None

    async def verify(self, webhook: WebhookRequest) -> bool:
        try:
            return bool(check_capability_token(
                webhook.query.get("token"), NAME, webhook.job_id, self._secret_keys
            ))
        except Exception:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()
