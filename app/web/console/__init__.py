"""The operator's console, `/console` (CONTRACT.md: The console): pages
rendered on the server for a browser, behind a sign-in with ADMIN_TOKEN.

- session.py: the sign-in, the session cookie and the CSRF tokens;
- forms.py: what a form or query may carry (pure);
- render.py: templates, static files, the headers of every response;
- pages.py: what is shown (GET); actions.py: what is changed (POST).

While ADMIN_TOKEN is unset every route here answers the API's 404.
"""
from __future__ import annotations

from starlette.routing import Route

from app.web.console import actions, pages

ROUTES = [
    Route("/console", pages.fleet, methods=["GET"]),
    Route("/console/needs-a-human", pages.needs_a_human, methods=["GET"]),
    Route("/console/search", pages.search, methods=["GET"]),
    Route("/console/owners", pages.owners, methods=["GET"]),
    Route("/console/owners/{owner_id}", pages.owner, methods=["GET"]),
    Route("/console/owners/{owner_id}/grant", pages.confirm_grant, methods=["GET"]),
    Route("/console/owners/{owner_id}/grant", actions.grant, methods=["POST"]),
    Route("/console/jobs/{job_id}", pages.job, methods=["GET"]),
    Route("/console/jobs/{job_id}/outputs/{index}", pages.job_output, methods=["GET"]),
    Route("/console/jobs/{job_id}/resolve", pages.confirm_resolve, methods=["GET"]),
    Route("/console/jobs/{job_id}/resolve", actions.resolve, methods=["POST"]),
    Route("/console/notifications/{notification_id}/redeliver", actions.redeliver, methods=["POST"]),
    Route("/console/sign-in", pages.sign_in_page, methods=["GET"]),
    Route("/console/sign-in", actions.sign_in, methods=["POST"]),
    Route("/console/sign-out", actions.sign_out, methods=["POST"]),
    Route("/console/static/{name}", pages.static, methods=["GET"]),
]
