"""The runner API's request parser: strict JSON (``strictjson``) with a size limit."""

from django.conf import settings
from rest_framework.parsers import BaseParser

from ..errors import PayloadTooLarge
from ..strictjson import loads_strict


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        # DRF reads the stream directly, past Django's DATA_UPLOAD_MAX_MEMORY_SIZE check
        # on request.body, so the limit is enforced here without reading more than it.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise PayloadTooLarge(f"Request bodies are limited to {limit} bytes.")
        if not body.strip():
            return {}
        return loads_strict(body)
