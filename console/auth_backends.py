"""Sign-in throttling in front of the password check (django-axes), and the password
check itself, which PASSWORD_LOGIN may keep for superusers."""

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied


class SignInThrottleBackend(AxesStandaloneBackend):
    """django-axes's lockout check, for sign-ins that come with a request.

    Every network-facing sign-in (the console's login form, the admin's) passes the
    request, so every one is throttled. A call without a request is server-side code
    (a management command, a test's ``Client.login``) that no remote guesser can drive;
    django-axes would refuse it with an error, this backend leaves it to the next one. So
    it does a call without a username: single sign-on's callback (console/sso.py), whose
    code only the provider can issue, and whose refusals django-axes still counts.
    """

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ):
        if request is None or username is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class PasswordBackend(ModelBackend):
    """Django's password check; with ``PASSWORD_LOGIN=superusers`` a right password of
    anyone else is refused (the console's form and the admin's alike), so that leaving the
    company at the identity provider ends their access here too.

    ``PermissionDenied`` stops Django at this backend and counts as a failed sign-in.
    """

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ):
        user = super().authenticate(request, username=username, password=password, **kwargs)
        superusers_only = settings.PASSWORD_LOGIN == "superusers"  # noqa: S105 (a mode)
        if user is not None and superusers_only and not user.is_superuser:
            raise PermissionDenied("Password sign-in is for superusers only.")
        return user
