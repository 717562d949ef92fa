"""KIE's Market API: `POST /api/v1/jobs/createTask`, then
`GET /api/v1/jobs/recordInfo` (https://docs.kie.ai/market/common/get-task-detail).

KIE answers HTTP 200 with its own `code` in the body; that code decides.
The envelope's text is `msg` in createTask's examples and `message` on the
current Get Task Details page (`msg` in an older rendering): both are read.
Its optional webhook signature (https://docs.kie.ai/common-api/webhook-verification)
covers only `taskId.timestamp`, not the body, so we do not rely on it: the
callback URL we hand KIE carries our own capability token, and `verify`
checks that token (every callback URL carries one: Settings.callback_url).
There is no cancel endpoint.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

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
    claimed_id,
    webhook_field,
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
from app.signing.tokens import check_capability_token
from app.vocabulary import ProviderName

NAME = ProviderName.KIE

# Get Task Details' `state`, all five of them.
_STATES = {
    "waiting": TaskState.RUNNING,
    "queuing": TaskState.RUNNING,
    "generating": TaskState.RUNNING,
    "success": TaskState.SUCCEEDED,
    "fail": TaskState.FAILED,
}
# createTask's documented body codes, by what each says about the task:
# 401 unauthorized, 402 insufficient credits, 404 not found, 422 validation
# error, 505 feature disabled: refused for good, nothing created. 501
# "generation failed": KIE's word that this request ended without a result,
# so the job fails (uncharged) rather than waiting on a task that will not
# deliver.
_REJECTED_CODES = {401, 402, 404, 422, 501, 505}
# 429 rate limited, 455 "service unavailable (maintenance)": refused for
# now, nothing taken; ask again later.
_TRANSIENT_CODES = {429, 455}
# 500 "server error" and any code KIE does not document stay Uncertain: an
# unexpected error says nothing about whether the task was created, and a
# paid task must not be created twice.


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
    (pure): see _REJECTED_CODES and _TRANSIENT_CODES; else Uncertain."""
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


def record_outcome(body: Mapping[str, Any], secrets: Secrets) -> Observation:
    """A whole recordInfo answer as an Observation, or the error its `code`
    means (pure): 404 is "no such task" (Rejected); 501 is Get Task
    Details' "generation failed, see failMsg": the task failed; any other
    code but 200 is a read that did not work (Transient)."""
    code = body_code(body)
    if code == 404:
        raise Rejected(f"{NAME}: no such task (code 404)")
    if code == 501:
        data = body.get("data")
        record = data if isinstance(data, Mapping) else {}
        return ended(TaskState.FAILED, secrets, record.get("failMsg"), body.get("message"), body.get("msg"),
                     record.get("failCode"), fallback="the generation failed (code 501)")
    if code != 200:
        detail = _message(body, secrets)
        raise Transient(f"{NAME}: recordInfo answered code {code}" + (f": {detail}" if detail else ""))
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise Transient(f"{NAME}: recordInfo answer has no data")
    return observation_from_record(data, secrets)


def made_for(record: Mapping[str, Any], request: SubmitRequest) -> bool:
    """Whether a recordInfo `data` object is the task `request` made (pure):
    `param` echoes the create request, so its callBackUrl (our job's URL,
    compared without its query string, the token) or, echoing none, its
    model must be the job's."""
    try:
        param = json.loads(record.get("param") or "")
    except (TypeError, ValueError):
        param = None
    echoed = param.get("callBackUrl") if isinstance(param, Mapping) else None
    if isinstance(echoed, str) and request.callback_url:
        return without_query(echoed) == without_query(request.callback_url)
    return record.get("model") == request.model


def without_query(url: str) -> str:
    return url.partition("?")[0]


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
        # The callback URL carries our capability token already (Settings.callback_url).
        secrets = self._secrets.plus_callback(request.callback_url)
        if request.callback_url:
            body["callBackUrl"] = request.callback_url
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
        return record_outcome(json_object(response, NAME, Transient), self._secrets)

    async def cancel(self, task: Task) -> None:
        return None  # KIE has no cancel endpoint; the task runs out on its own

    async def find(self, request: SubmitRequest) -> Submitted | None:
        return None

    async def verify(self, webhook: WebhookRequest) -> bool:
        # Our capability token only. KIE's X-Webhook-Signature, when a user
        # enables it, signs `taskId.timestamp` and not the body, so it proves
        # less than the token does; nor is the body trusted for state: status()
        # asks recordInfo.
        try:
            return bool(check_capability_token(
                webhook.query.get("token"), NAME, webhook.job_id, self._secret_keys
            ))
        except Exception:
            return False

    def webhook_task_id(self, webhook: WebhookRequest) -> str | None:
        # The callback is a recordInfo answer: `data.taskId`; KIE's callback
        # pages for other families put `taskId` at the top level.
        return claimed_id(webhook_field(webhook.raw_body, "data", "taskId")
                          or webhook_field(webhook.raw_body, "taskId"))

    async def confirm_task(self, task_id: str, request: SubmitRequest) -> Submitted | None:
        """recordInfo with our key (code 404: KIE does not know the task),
        and the task's echoed create request must be this job's."""
        response = await read_call(
            self._http.reads, NAME, "GET", f"{self.base_url}/api/v1/jobs/recordInfo",
            params={"taskId": task_id}, headers=self._headers(), secrets=self._secrets, not_found=None,
        )
        body = json_object(response, NAME, Transient)
        try:
            record_outcome(body, self._secrets)  # a state we can read, or what its code means
        except Rejected:
            return None
        data = body.get("data")
        if not isinstance(data, Mapping) or data.get("taskId") not in (None, task_id):
            return None
        return Submitted(task_id=task_id) if made_for(data, request) else None

    async def aclose(self) -> None:
        await self._http.aclose()
