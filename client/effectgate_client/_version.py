"""The client's version. Its major number is the API version it speaks (OpenAPI
``info.version``, the ``/api/v1`` of every path): 1.x talks to API 1 (docs/client.md,
Versions). tests/client/test_version.py holds the two equal."""

__version__ = "1.0.0"
