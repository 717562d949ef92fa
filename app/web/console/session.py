"""Who may use the console: whoever signed in with ADMIN_TOKEN.

Signing in sets one cookie, a session token signed with SECRET_KEY
(app/signing/tokens.py): HttpOnly (no script reads it), SameSite=Strict (no
other site's page sends it), Secure when the request came over https —
`request.url.scheme`, which uvicorn sets from X-Forwarded-Proto only for the
proxies it trusts (FORWARDED_ALLOW_IPS) — and scoped to /console. It expires
after SESSION_TTL_S; changing ADMIN_TOKEN or SECRET_KEY ends every session.

Every form that changes state carries a token bound to the session's nonce
(a synchronizer token), checked before anything is read from the database.
The sign-in form has its own: a short-lived cookie holds a random nonce and
the form a token bound to it, so no other site can post a sign-in either.

Sessions are not stored: signing out clears the browser's cookie, and a
copy of it taken before then stays valid until it expires.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from app.signing.tokens import (
    SESSION_NONCE_LEN,
    check_form_token,
    check_session_token,
    make_form_token,
    make_session_token,
)

SESSION_COOKIE = "longcall_console"
SIGN_IN_COOKIE = "longcall_console_sign_in"
COOKIE_PATH = "/console"
SESSION_TTL_S = 8 * 3600  # an operator's working day
SIGN_IN_TTL_S = 3600  # how long a sign-in form stays good
# One token per purpose: a sign-in form's token is no use on an action form.
ACTION_PURPOSE = "action"
SIGN_IN_PURPOSE = "sign-in"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Session:
    nonce: bytes

    def form_token(self, key: bytes) -> str:
        return make_form_token(key, ACTION_PURPOSE, self.nonce)


def admin_token_matches(given: str, admin_token: str) -> bool:
    """Constant time in the token's content and length: both sides are
    hashed first, so compare_digest always compares 32 bytes."""
    return hmac.compare_digest(hashlib.sha256(given.encode("utf-8", "surrogatepass")).digest(),
                               hashlib.sha256(admin_token.encode()).digest())


def cookie_options(*, secure: bool, max_age: int) -> dict:
    return {"max_age": max_age, "path": COOKIE_PATH, "secure": secure, "httponly": True, "samesite": "strict"}


def over_https(request: Request) -> bool:
    return request.url.scheme == "https"


def new_nonce() -> bytes:
    return os.urandom(SESSION_NONCE_LEN)


def encode_nonce(nonce: bytes) -> str:
    return base64.urlsafe_b64encode(nonce).rstrip(b"=").decode()


def decode_nonce(text: str | None) -> bytes | None:
    if not text or len(text) > 32:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == SESSION_NONCE_LEN and encode_nonce(raw) == text else None


def session_of(request: Request, now: float | None = None) -> Session | None:
    settings = request.app.state.settings
    nonce = check_session_token(request.cookies.get(SESSION_COOKIE), settings.secret_keys,
                                settings.admin_token, time.time() if now is None else now)
    return Session(nonce) if nonce is not None else None


def start_session(request: Request, response: Response, now: float | None = None) -> None:
    """Sign in: the session cookie set, the sign-in cookie cleared."""
    settings = request.app.state.settings
    expires_at = int(time.time() if now is None else now) + SESSION_TTL_S
    token = make_session_token(settings.secret_key, settings.admin_token, new_nonce(), expires_at)
    secure = over_https(request)
    response.set_cookie(SESSION_COOKIE, token, **cookie_options(secure=secure, max_age=SESSION_TTL_S))
    response.delete_cookie(SIGN_IN_COOKIE, path=COOKIE_PATH, secure=secure, httponly=True, samesite="strict")


def end_session(request: Request, response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, secure=over_https(request), httponly=True,
                           samesite="strict")


def sign_in_form_token(request: Request) -> tuple[str, bytes | None]:
    """The sign-in form's token, and the nonce of a new sign-in cookie to
    set (None: the browser's cookie is still good, so two tabs of the
    sign-in page both work)."""
    nonce = decode_nonce(request.cookies.get(SIGN_IN_COOKIE))
    fresh = nonce is None
    if nonce is None:
        nonce = new_nonce()
    return make_form_token(request.app.state.settings.secret_key, SIGN_IN_PURPOSE, nonce), nonce if fresh else None


def set_sign_in_cookie(request: Request, response: Response, nonce: bytes) -> None:
    response.set_cookie(SIGN_IN_COOKIE, encode_nonce(nonce),
                        **cookie_options(secure=over_https(request), max_age=SIGN_IN_TTL_S))


def sign_in_token_ok(request: Request, given: str | None) -> bool:
    nonce = decode_nonce(request.cookies.get(SIGN_IN_COOKIE))
    return check_form_token(given, request.app.state.settings.secret_keys, SIGN_IN_PURPOSE, nonce)


def action_token_ok(request: Request, session: Session, given: str | None) -> bool:
    return check_form_token(given, request.app.state.settings.secret_keys, ACTION_PURPOSE, session.nonce)
