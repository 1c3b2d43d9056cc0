"""The runner API: views, serializers, the strict JSON parser, problem details, bearer
token authentication, throttling, the OpenAPI document and the URL path converters.

It parses, calls one service or selector, and renders; it writes no model itself.
"""
