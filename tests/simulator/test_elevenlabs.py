"""ElevenLabs' dubbing API under /elevenlabs, answering only the fields the
API documents (https://elevenlabs.io/docs/api-reference/dubbing/create,
.../get, .../list, .../audio/get; elevenlabs-python's DoDubbingResponse,
DubbingMetadataResponse and DubbingMetadataPageResponseModel)."""
from __future__ import annotations

import hashlib
import time
from datetime import datetime

import httpx
import pytest

from app.simulator import output_sha256

from .helpers import wait_until

KEY = {"xi-api-key": "xi-test-key"}
SOURCE = "https://media.example.com/talks/keynote.mp4"
# DubbingMetadataResponse's fields, exactly.
DUB_FIELDS = {"dubbing_id", "name", "status", "source_language", "target_languages", "editable", "created_at",
              "media_metadata", "error"}
ERROR_FIELDS = {"type", "code", "message", "status", "request_id"}


def form(**fields) -> list[tuple[str, tuple[None, str]]]:
    """Multipart form fields, written as the official client writes them."""
    return [(k, (None, v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)))
            for k, v in fields.items()]


def create(client: httpx.Client, **fields) -> str:
    body = {"source_url": SOURCE, "target_lang": "es", **fields}
    response = client.post("/elevenlabs/v1/dubbing", files=form(**body), headers=KEY)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"dubbing_id", "expected_duration_sec"}
    return answer["dubbing_id"]


def dub(client: httpx.Client, dubbing_id: str) -> dict:
    response = client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}", headers=KEY)
    assert response.status_code == 200, response.text
    return response.json()


def wait_status(client: httpx.Client, dubbing_id: str, status: str) -> dict:
    return wait_until(lambda: (d := dub(client, dubbing_id))["status"] == status and d, 5, status)


def listed(client: httpx.Client, **params) -> dict:
    response = client.get("/elevenlabs/v1/dubbing", params=params, headers=KEY)
    assert response.status_code == 200, response.text
    page = response.json()
    assert set(page) == {"dubs", "next_cursor", "has_more"}
    return page


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert ERROR_FIELDS <= set(detail) <= ERROR_FIELDS | {"param"}
    if code is not None:
        assert detail["code"] == code
    return detail


# ------------------------------------------------------------------ auth


def test_every_route_wants_the_xi_api_key(client):
    created = create(client, duration_s=0.1)
    for method, path in (("POST", "/elevenlabs/v1/dubbing"), ("GET", "/elevenlabs/v1/dubbing"),
                         ("GET", f"/elevenlabs/v1/dubbing/{created}"),
                         ("GET", f"/elevenlabs/v1/dubbing/{created}/audio/es")):
        for headers in ({}, {"Authorization": "Bearer xi-test-key"}, {"xi-api-key": ""}):
            response = client.request(method, path, headers=headers, files=form(source_url=SOURCE, target_lang="es")
                                      if method == "POST" else None)
            detail = assert_error(response, 401, "unauthorized")
            assert detail["type"] == "authentication_error" and detail["status"] == "needs_authorization"
    assert client.get("/_sim/stats").json()["tasks_created"] == 1


# ------------------------------------------------------------------ a dub


def test_a_dub_goes_queued_preparing_dubbing_dubbed_with_documented_fields_only(client):
    started = time.time()
    dubbing_id = create(client, duration_s=1.2, name="job_123")
    assert len(dubbing_id) == 20 and dubbing_id.isalnum()
    first = dub(client, dubbing_id)
    assert set(first) == DUB_FIELDS
    assert first == {"dubbing_id": dubbing_id, "name": "job_123", "status": "queued", "source_language": None,
                     "target_languages": ["es"], "editable": False, "created_at": first["created_at"],
                     "media_metadata": None, "error": None}
    made = datetime.fromisoformat(first["created_at"].replace("Z", "+00:00")).timestamp()
    assert started - 1 <= made <= time.time() + 1
    wait_status(client, dubbing_id, "preparing")
    wait_status(client, dubbing_id, "dubbing")
    done = wait_status(client, dubbing_id, "dubbed")
    assert set(done) == DUB_FIELDS
    # source_lang defaults to auto: the "detected" language appears once dubbed.
    assert done["source_language"] == "en" and done["error"] is None and done["created_at"] == first["created_at"]


def test_the_answer_says_what_was_asked(client):
    answer = client.post("/elevenlabs/v1/dubbing", headers=KEY, files=form(
        source_url=SOURCE, target_lang="fr", source_lang="de", duration_s=0.1, dubbing_studio=True,
        num_speakers=2, watermark=False, start_time=0, end_time=30, mode="automatic", csv_fps=25.0)).json()
    assert answer["expected_duration_sec"] == 0.1
    done = wait_status(client, answer["dubbing_id"], "dubbed")
    assert done["target_languages"] == ["fr"] and done["source_language"] == "de" and done["editable"] is True
    # No name given: the source's file name.
    assert done["name"] == "keynote.mp4"


def test_an_urlencoded_form_and_an_uploaded_file_are_accepted_too(client):
    response = client.post("/elevenlabs/v1/dubbing", data={"source_url": SOURCE, "target_lang": "es"}, headers=KEY)
    assert response.status_code == 200
    upload = client.post("/elevenlabs/v1/dubbing", headers=KEY, data={"target_lang": "es"},
                         files={"file": ("clip.mp3", b"ID3 not really audio", "audio/mpeg")})
    assert upload.status_code == 200
    assert dub(client, upload.json()["dubbing_id"])["name"] == "clip.mp3"


def test_a_failed_dub_says_why_and_has_no_audio(client):
    dubbing_id = create(client, duration_s=0.1, outcome="failed")
    done = wait_status(client, dubbing_id, "failed")
    assert set(done) == DUB_FIELDS and isinstance(done["error"], str) and done["error"]
    assert done["source_language"] is None
    assert_error(client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=KEY), 404)


def test_unknown_dub_is_404_in_the_current_error_shape(client):
    detail = assert_error(client.get("/elevenlabs/v1/dubbing/nosuchdub", headers=KEY), 404)
    assert detail["type"] == "not_found" and len(detail["request_id"]) == 32


# ------------------------------------------------------------------ audio


def test_audio_is_too_early_then_the_deterministic_bytes_of_each_language(client):
    dubbing_id = create(client, duration_s=0.4, output_bytes=70_000)
    assert_error(client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=KEY), 425)
    wait_status(client, dubbing_id, "dubbed")
    response = client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=KEY)
    assert response.status_code == 200 and response.headers["content-type"] == "audio/mpeg"
    assert hashlib.sha256(response.content).hexdigest() == output_sha256(dubbing_id, 0, 70_000)
    # Only the languages it was dubbed into.
    assert_error(client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/fr", headers=KEY), 404)
    assert_error(client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/es"), 401)


def test_audio_takes_the_content_type_control_and_expires_after_its_lifetime(client):
    dubbing_id = create(client, duration_s=0.1, content_type="video/mp4", output_ttl_s=0.5)
    wait_status(client, dubbing_id, "dubbed")
    response = client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=KEY)
    assert response.status_code == 200 and response.headers["content-type"] == "video/mp4"
    wait_until(lambda: client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=KEY).status_code == 404,
               5, "the audio to expire")


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(("fields", "entry"), [
    ({"source_url": SOURCE}, {"type": "missing", "loc": ["body", "target_lang"], "msg": "Field required",
                              "input": None}),
    ({"watermark": "maybe"}, {"type": "bool_parsing", "loc": ["body", "watermark"],
                              "msg": "Input should be a valid boolean, unable to interpret input", "input": "maybe"}),
    ({"num_speakers": "two"}, {"type": "int_parsing", "loc": ["body", "num_speakers"],
                               "msg": "Input should be a valid integer, unable to parse string as an integer",
                               "input": "two"}),
    ({"csv_fps": "fast"}, {"type": "float_parsing", "loc": ["body", "csv_fps"],
                           "msg": "Input should be a valid number, unable to parse string as a number",
                           "input": "fast"}),
    ({"mode": "magic"}, {"type": "literal_error", "loc": ["body", "mode"],
                         "msg": "Input should be 'automatic' or 'manual'", "input": "magic"}),
    # The simulator's own control, as a form field, validated as one.
    ({"duration_s": "soon"}, {"type": "value_error", "loc": ["body", "duration_s"],
                              "msg": "input.duration_s must be a number", "input": "soon"}),
])
def test_a_field_that_does_not_parse_is_fastapis_422_and_creates_nothing(client, fields, entry):
    body = {"source_url": SOURCE, "target_lang": "es", **fields}
    if "target_lang" not in fields and entry["loc"][1] == "target_lang":
        del body["target_lang"]
    response = client.post("/elevenlabs/v1/dubbing", files=form(**body), headers=KEY)
    assert response.status_code == 422
    assert response.json() == {"detail": [entry]}
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_typed_fields_parse_as_fastapi_reads_them(client):
    create(client, watermark="True", highest_resolution="1", num_speakers="0", start_time="+5", csv_fps="29.97")


def test_no_source_is_a_400_naming_source_url(client):
    response = client.post("/elevenlabs/v1/dubbing", files=form(target_lang="es"), headers=KEY)
    detail = assert_error(response, 400, "invalid_parameters")
    assert detail["param"] == "source_url" and detail["type"] == "validation_error"
    bad_url = client.post("/elevenlabs/v1/dubbing", files=form(target_lang="es", source_url="not a url"), headers=KEY)
    assert assert_error(bad_url, 400, "invalid_parameters")["param"] == "source_url"
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


# ------------------------------------------------------------------ the list


def test_list_is_newest_first_and_its_cursor_walks_every_page(client):
    made = [create(client, duration_s=30, name=f"dub-{i}") for i in range(5)]
    first = listed(client, page_size=2)
    assert [d["dubbing_id"] for d in first["dubs"]] == made[:-3:-1] and first["has_more"] is True
    assert all(set(d) == DUB_FIELDS for d in first["dubs"])
    seen, page = [], first
    while True:
        seen += [d["dubbing_id"] for d in page["dubs"]]
        if not page["has_more"]:
            assert page["next_cursor"] is None
            break
        # A dub made meanwhile does not shift the pages: the cursor is a place, not an offset.
        create(client, duration_s=30, name="meanwhile")
        page = listed(client, page_size=2, cursor=page["next_cursor"])
    assert seen == made[::-1]
    oldest = listed(client, page_size=2, order_direction="ASCENDING")
    assert [d["dubbing_id"] for d in oldest["dubs"]] == made[:2]


def test_list_by_name_and_filters(client):
    running = create(client, duration_s=30, name="b-running")
    done = create(client, duration_s=0, name="a-done", target_lang="fr")
    failed = create(client, duration_s=0, name="c-failed", outcome="failed")
    wait_status(client, failed, "failed")
    by_name = listed(client, order_by="name", order_direction="ASCENDING", page_size=1)
    names = []
    while True:
        names += [d["name"] for d in by_name["dubs"]]
        if not by_name["has_more"]:
            break
        by_name = listed(client, order_by="name", order_direction="ASCENDING", page_size=1,
                         cursor=by_name["next_cursor"])
    assert names == ["a-done", "b-running", "c-failed"]

    def ids(**params):
        return {d["dubbing_id"] for d in listed(client, **params)["dubs"]}

    assert ids(dubbing_status="dubbing") == {running}  # any dub in progress
    assert ids(dubbing_status="dubbed") == {done}
    assert ids(dubbing_statuses=["dubbed", "failed"]) == {done, failed}
    assert ids(target_language_codes="fr") == {done}
    assert ids(filter_by_creator="others") == set()
    assert ids(filter_by_creator="personal", creation_sources="dubbing_api", dubbing_models="dubbing_v1") == {
        running, done, failed}
    assert ids(creation_sources="dubbing_ui") == set()


@pytest.mark.parametrize("params", [{"page_size": 0}, {"page_size": 201}, {"page_size": "ten"},
                                    {"order_by": "size"}, {"order_direction": "down"},
                                    {"dubbing_status": "queued"}, {"dubbing_statuses": "done"}])
def test_a_bad_list_query_is_a_422(client, params):
    response = client.get("/elevenlabs/v1/dubbing", params=params, headers=KEY)
    assert response.status_code == 422
    (entry,) = response.json()["detail"]
    assert entry["loc"] == ["query", next(iter(params))]


def test_a_bad_cursor_is_a_400(client):
    response = client.get("/elevenlabs/v1/dubbing", params={"cursor": "not-a-cursor"}, headers=KEY)
    assert assert_error(response, 400, "invalid_parameters")["param"] == "cursor"


# ------------------------------------------------------------------ faults


def test_submit_error_is_a_500_and_creates_nothing(client):
    client.post("/_sim/faults", json={"submit_error": 1}).raise_for_status()
    response = client.post("/elevenlabs/v1/dubbing", files=form(source_url=SOURCE, target_lang="es"), headers=KEY)
    assert assert_error(response, 500)["type"] == "internal_error"
    assert client.get("/_sim/stats").json()["tasks_created"] == 0


def test_throttle_is_the_documented_429_with_retry_after(client):
    dubbing_id = create(client, duration_s=30)
    client.post("/_sim/faults", json={"throttle": 1}).raise_for_status()
    for response in (client.post("/elevenlabs/v1/dubbing", files=form(source_url=SOURCE, target_lang="es"),
                                 headers=KEY),
                     client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}", headers=KEY)):
        detail = assert_error(response, 429, "rate_limit_exceeded")
        assert detail["type"] == "rate_limit_error" and response.headers["retry-after"] == "1"
    assert client.get("/_sim/stats").json()["tasks_created"] == 1


def test_status_error_and_download_error(client):
    dubbing_id = create(client, duration_s=0)
    wait_status(client, dubbing_id, "dubbed")
    client.post("/_sim/faults", json={"status_error": 1, "download_error": 1}).raise_for_status()
    assert_error(client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}", headers=KEY), 500)
    assert_error(client.get(f"/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=KEY), 500)
    # The list is no status read: it answers (find relies on it after a lost submit).
    assert [d["dubbing_id"] for d in listed(client)["dubs"]] == [dubbing_id]


def test_submit_timeout_after_create_makes_the_dub_and_drops_the_answer(client, sim_url):
    client.post("/_sim/faults", json={"submit_timeout_after_create": 1}).raise_for_status()
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{sim_url}/elevenlabs/v1/dubbing", headers=KEY, timeout=5, trust_env=False,
                   files=form(source_url=SOURCE, target_lang="es", name="job_lost", duration_s=30))
    (found,) = listed(client)["dubs"]
    assert found["name"] == "job_lost" and found["status"] in ("queued", "preparing")
    assert client.get("/_sim/stats").json()["tasks_created"] == 1


def test_status_reads_are_counted(client):
    dubbing_id = create(client, duration_s=30)
    dub(client, dubbing_id)
    dub(client, dubbing_id)
    listed(client)
    assert client.get("/_sim/stats").json()["status_calls"] == 2
