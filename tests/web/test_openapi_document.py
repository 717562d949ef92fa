"""/openapi.json says what the server does: its enums are the vocabulary's,
its limits the validator's, its routes the router's."""
from __future__ import annotations

from app.config import PROVIDERS
from app.vocabulary import ALL_STATUSES, API_ERROR_STATUS, ApiErrorCode, JobError
from app.web import ADMIN_ROUTES, ROUTES
from app.web.body import MAX_CREDITS, MAX_IDEMPOTENCY_KEY, MAX_LIST_LIMIT, MAX_WAIT_S


async def test_the_document_is_written_from_the_vocabulary(web, db):
    server = await web()
    async with server.client() as c:
        doc = (await c.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    assert schemas["Error"]["properties"]["error"]["properties"]["code"]["enum"] == [c.value for c in ApiErrorCode]
    job = schemas["Job"]["properties"]
    assert job["status"]["enum"] == [s.value for s in ALL_STATUSES]
    assert job["error"]["oneOf"][1]["properties"]["code"]["enum"] == [c.value for c in JobError]
    assert schemas["CreateJob"]["properties"]["provider"]["enum"] == list(PROVIDERS)

    # Every documented error answer lists exactly the codes the vocabulary gives its status.
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                if "error" not in schema.get("properties", {}):
                    continue
                codes = schema["properties"]["error"]["properties"]["code"]["enum"]
                assert codes and all(API_ERROR_STATUS[ApiErrorCode(code)] == int(status) for code in codes), \
                    (method, path, status)
    # 429 and 503 say Retry-After
    create = doc["paths"]["/v1/jobs"]["post"]
    assert create["responses"]["429"]["headers"]["Retry-After"]["required"] is True
    assert create["responses"]["503"]["headers"]["Retry-After"]["required"] is True


async def test_the_document_states_the_limits(web, db):
    server = await web()
    async with server.client() as c:
        doc = (await c.get("/openapi.json")).json()
    create = doc["paths"]["/v1/jobs"]["post"]
    key = next(p for p in create["parameters"] if p["name"] == "Idempotency-Key")["schema"]
    assert key["maxLength"] == MAX_IDEMPOTENCY_KEY and key["minLength"] == 1 and key["pattern"]
    credits = doc["components"]["schemas"]["CreateJob"]["properties"]["max_credits"]
    assert (credits["minimum"], credits["maximum"]) == (1, MAX_CREDITS)
    listing = {p["name"]: p["schema"] for p in doc["paths"]["/v1/jobs"]["get"]["parameters"]}
    assert listing["limit"]["maximum"] == MAX_LIST_LIMIT
    assert listing["status"]["enum"] == [s.value for s in ALL_STATUSES]
    read = {p["name"]: p["schema"] for p in doc["paths"]["/v1/jobs/{job_id}"]["get"]["parameters"]}
    assert read["wait"]["maximum"] == MAX_WAIT_S


async def test_every_route_is_documented_with_its_methods(web, db):
    server = await web()
    async with server.client() as c:
        doc = (await c.get("/openapi.json")).json()
    served = {}
    for route in ROUTES + ADMIN_ROUTES:  # the admin ones exist while ADMIN_TOKEN is set, as here
        if route.path.startswith("/console/"):
            continue  # the console's pages and forms, for a browser: only its entry, /console, is API
        served.setdefault(route.path, set()).update(m.lower() for m in route.methods if m != "HEAD")
    assert {path: set(ops) for path, ops in doc["paths"].items()} == served
