"""The log's signing key and origin, as the settings name them (docs/deployment.md).

The Ed25519 private key is read from ``AUDIT_SIGNING_KEY_FILE`` (a PEM file, PKCS #8, as
``openssl genpkey -algorithm ed25519`` writes) or ``AUDIT_SIGNING_KEY`` (the same text in
the environment) each time it is needed, never stored in the database and never
printed. A refusal names the setting, never the key's text. The public key comes from
``AUDIT_PUBLIC_KEY_FILE`` where it is set (the web servers that publish it need not hold
the private key), else from the private key.
"""

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .notes import NoteError, check_key_name

GENERATE = "openssl genpkey -algorithm ed25519 -out audit.pem"


def private_key_from_pem(data: bytes, *, source: str) -> Ed25519PrivateKey:
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(
            f"{source} holds no unencrypted Ed25519 private key in PEM ({GENERATE} makes one)."
        )
    return key


def public_key_from_pem(data: bytes, *, source: str) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM: a public key, or the private key it belongs to."""
    try:
        key = load_pem_public_key(data)
    except (ValueError, TypeError):
        return private_key_from_pem(data, source=source).public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise ImproperlyConfigured(f"{source} holds a public key that is not Ed25519.")
    return key


def signing_key() -> Ed25519PrivateKey | None:
    """The configured private key, or None when neither setting is set."""
    path, text = settings.AUDIT_SIGNING_KEY_FILE, settings.AUDIT_SIGNING_KEY
    if path and text:
        raise ImproperlyConfigured("Set AUDIT_SIGNING_KEY_FILE or AUDIT_SIGNING_KEY, not both.")
    if path:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ImproperlyConfigured(
                f"AUDIT_SIGNING_KEY_FILE: {path} cannot be read ({exc.strerror})."
            ) from exc
        return private_key_from_pem(data, source=f"AUDIT_SIGNING_KEY_FILE ({path})")
    if text:
        return private_key_from_pem(text.encode(), source="AUDIT_SIGNING_KEY")
    return None


def public_key() -> Ed25519PublicKey | None:
    """The key that verifies the checkpoints: ``AUDIT_PUBLIC_KEY_FILE`` (so that processes
    that only publish or check it need not read the private key), or else the signing
    key's; None when neither is configured."""
    path = settings.AUDIT_PUBLIC_KEY_FILE
    private = signing_key()
    if not path:
        return private.public_key() if private is not None else None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"AUDIT_PUBLIC_KEY_FILE: {path} cannot be read ({exc.strerror})."
        ) from exc
    key = public_key_from_pem(data, source=f"AUDIT_PUBLIC_KEY_FILE ({path})")
    if private is not None and _raw(private.public_key()) != _raw(key):
        raise ImproperlyConfigured(
            "AUDIT_PUBLIC_KEY_FILE is not the public key of the signing key "
            "(AUDIT_SIGNING_KEY_FILE or AUDIT_SIGNING_KEY)."
        )
    return key


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def public_key_pem(key: Ed25519PublicKey) -> str:
    """The key as PEM (SubjectPublicKeyInfo), as the well-known URL serves it."""
    return key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()


def log_origin() -> str:
    """The log's origin, the first line of every checkpoint and its key's name."""
    origin = settings.AUDIT_LOG_ORIGIN
    if len(origin) > 255:
        raise ImproperlyConfigured("AUDIT_LOG_ORIGIN: at most 255 characters.")
    try:
        return check_key_name(origin)
    except NoteError as exc:
        raise ImproperlyConfigured(f"AUDIT_LOG_ORIGIN: {exc}") from exc
