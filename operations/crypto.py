"""Encryption at rest for secrets Effectgate must be able to read back (webhook keys).

Fernet (AES-128-CBC with HMAC-SHA256) from ``cryptography``. The key comes from
``FIELD_ENCRYPTION_KEY`` (a Fernet key) or, when unset, is derived from ``SECRET_KEY``;
rotating either makes stored secrets unreadable, so set ``FIELD_ENCRYPTION_KEY`` in
production and keep it with the database backups.
"""

import base64
import hashlib

from cryptography.fernet import Fernet
from django.conf import settings


def _fernet() -> Fernet:
    key = settings.FIELD_ENCRYPTION_KEY
    if not key:
        digest = hashlib.sha256(b"effectgate-field-encryption:" + settings.SECRET_KEY.encode())
        key = base64.urlsafe_b64encode(digest.digest()).decode()
    return Fernet(key)


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    return _fernet().decrypt(token.encode()).decode()
