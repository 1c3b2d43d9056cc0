"""Bearer-token authentication for runners, and the permission that requires one."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, permissions
from rest_framework.exceptions import AuthenticationFailed

from ..errors import ScopeForbidden
from ..models import Runner, RunnerToken
from ..services import TOKEN_PREFIX, token_authenticate

# What every refusal of the header says to send instead.
SEND_BEARER = "send the runner token as the header Authorization: Bearer <token>"
ISSUING = "python manage.py runner token NAME issues one"


def _header_refusal(header: str) -> str:
    """Why an Authorization header that is not ``Bearer <token>`` is refused, in words.
    Never quotes the header: it may hold a token."""
    scheme = header.strip().partition(" ")[0]
    if scheme.startswith(TOKEN_PREFIX):  # every runner token starts so
        return f"The Authorization header holds a token without the Bearer scheme: {SEND_BEARER}."
    if scheme.lower() == "bearer":
        return (
            f"The Authorization header names the Bearer scheme but holds no token: {SEND_BEARER}."
        )
    return f"The Authorization header uses another scheme than Bearer: {SEND_BEARER}."


class RunnerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise AuthenticationFailed(_header_refusal(header))
        found = token_authenticate(raw.strip())
        if found is None:
            raise AuthenticationFailed(
                "The bearer token is unknown, expired or revoked: send a valid runner token "
                f"({ISSUING}; people who manage runners also issue them in the console)."
            )
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
