"""Standard Webhooks signatures: secrets, ``v1`` signatures over ``id.timestamp.body``,
and the headers and body of a delivery (pure; the dispatcher sends, services mint and
verify).
"""

import base64
import hashlib
import hmac
import json
import secrets
from datetime import datetime

from .crypto import decrypt
from .models import OutboxMessage, WebhookEndpoint


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64 HMAC-SHA256>`` signature over ``id.timestamp.body``."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verify(secret: str, msg_id: str, timestamp: int, body: bytes, header: str) -> bool:
    """Whether any ``v1,`` signature in ``header`` matches (constant-time comparison).

    A signature is base64, so a candidate with any other character cannot match; it is
    skipped, because ``hmac.compare_digest`` raises on a non-ASCII string."""
    expected = sign(secret, msg_id, timestamp, body)
    return any(
        hmac.compare_digest(candidate, expected)
        for candidate in header.split()
        if candidate.startswith("v1,") and candidate.isascii()
    )


def signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    """The current secret, plus the previous one during a rotation's overlap."""
    found = [decrypt(endpoint.secret_encrypted)]
    if endpoint.previous_secret_encrypted and (
        endpoint.previous_secret_until is not None and endpoint.previous_secret_until > now
    ):
        found.append(decrypt(endpoint.previous_secret_encrypted))
    return found


def headers_for(message: OutboxMessage, body: bytes, now: datetime) -> dict[str, str]:
    timestamp = int(now.timestamp())
    signatures = [
        sign(secret, message.id, timestamp, body)
        for secret in signing_secrets(message.endpoint, now)
    ]
    return {
        "content-type": "application/json",
        "webhook-id": message.id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signatures),
    }


def body_of(message: OutboxMessage) -> bytes:
    return json.dumps(message.payload, separators=(",", ":"), sort_keys=True).encode()
