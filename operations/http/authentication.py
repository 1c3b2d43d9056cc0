"""Bearer-token authentication for runners, and the permission that requires one."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, permissions

from ..errors import ScopeForbidden
from ..models import Runner, RunnerToken
from ..services import token_authenticate


class RunnerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            return None
        found = token_authenticate(raw.strip())
        if found is None:
            from rest_framework.exceptions import AuthenticationFailed

            raise AuthenticationFailed("The bearer token is unknown, expired or revoked.")
        return found

    def authenticate_header(self, request):
        return 'Bearer realm="effectgate"'


class IsRunner(permissions.BasePermission):
    """Only runner accounts use the API; the token's scope must allow the view.

    A view names the scope it needs in ``required_scope`` (default ``use_tools``), for
    reads as for writes: a token that only registers contracts (a deploy pipeline) reads
    no operation, run, approval or webhook endpoint. Contracts are the exception: reading
    them is part of both jobs, so views that need ``register_contracts`` may be read with
    either scope.
    """

    def has_permission(self, request, view) -> bool:
        if not isinstance(request.user, Runner):
            return False
        needed = getattr(view, "required_scope", RunnerToken.SCOPE_USE_TOOLS)
        token: RunnerToken = request.auth
        if (
            request.method in permissions.SAFE_METHODS
            and needed == RunnerToken.SCOPE_REGISTER_CONTRACTS
        ):
            return bool(set(token.scopes) & set(RunnerToken.ALL_SCOPES))
        if needed not in token.scopes:
            raise ScopeForbidden(f"This token lacks the {needed!r} scope.")
        if request.method not in permissions.SAFE_METHODS:
            # Read the body before any view code runs, also on endpoints that take none
            # (cancel, rotate-secret): a body that cannot be read (413, 415, malformed
            # JSON) is refused and nothing is written on the strength of it.
            request.data  # noqa: B018
        return True


class RunnerTokenScheme(OpenApiAuthenticationExtension):
    """The bearer token in the OpenAPI document (``securitySchemes.runnerToken``)."""

    target_class = RunnerTokenAuthentication
    name = "runnerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "egr_...",
            "description": "A runner token (`python manage.py runner create NAME`). Its "
            "scopes: `use_tools` for runs, operations, attempts, approvals and webhooks; "
            "`register_contracts` for PUT /tools. Contracts are readable with either.",
        }
