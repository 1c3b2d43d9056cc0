"""Sign-in throttling in front of the password check (django-axes)."""

from typing import Any

from axes.backends import AxesStandaloneBackend


class SignInThrottleBackend(AxesStandaloneBackend):
    """django-axes's lockout check, for sign-ins that come with a request.

    Every network-facing sign-in (the console's login form, the admin's) passes the
    request, so every one is throttled. A call without a request is server-side code
    (a management command, a test's ``Client.login``) that no remote guesser can drive;
    django-axes would refuse it with an error, this backend leaves it to the next one.
    """

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
