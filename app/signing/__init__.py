"""Signing: webhook signature schemes, signed tokens, secrets at rest."""
from app.signing.secretbox import SecretBox
from app.signing.tokens import (
    check_capability_token,
    check_read_token,
    make_capability_token,
    make_read_token,
)
from app.signing.webhooks import (
    MAX_SIGNED_BODY,
    TOLERANCE_S,
    jwk_for,
    jwks_public_keys,
    sign_fal,
    sign_standard_webhooks,
    sign_tv1,
    verify_fal,
    verify_standard_webhooks,
    verify_tv1,
)

__all__ = [
    "MAX_SIGNED_BODY",
    "TOLERANCE_S",
    "SecretBox",
    "check_capability_token",
    "check_read_token",
    "jwk_for",
    "jwks_public_keys",
    "make_capability_token",
    "make_read_token",
    "sign_fal",
    "sign_standard_webhooks",
    "sign_tv1",
    "verify_fal",
    "verify_standard_webhooks",
    "verify_tv1",
]
