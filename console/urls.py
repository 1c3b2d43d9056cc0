from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from console import slack, sso
from console.views import health
from operations.http import audit, problems
from operations.http import views as api

urlpatterns = [
    # First: the runner API is most of the traffic, and Django tries each pattern in
    # order (the console's sixty came first, resolved for every API request).
    path("api/v1/", include(api.urlpatterns)),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("", include("console.console_urls")),
    path("login/", sso.SignIn.as_view(), name="login"),
    path("logout/", sso.SignOut.as_view(), name="logout"),
    # Single sign-on (console/sso.py): both answer 404 while OIDC_ISSUER is unset.
    path("oidc/authenticate/", sso.SignInStart.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", sso.SignInCallback.as_view(), name="oidc_authentication_callback"),
    # Slack's interactivity URL (console/slack.py): 404 while Slack is not configured.
    path("integrations/slack/interactions", slack.interactions, name="slack-interactions"),
    # The transparency log's public key (docs/security.md), for anyone who keeps checkpoints.
    path(".well-known/effectgate-audit-key", audit.audit_key, name="audit-key"),
    path("admin/", admin.site.urls),
    path(
        "api/schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
        name="schema",
    ),
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(
            url_name="schema", authentication_classes=[], permission_classes=[]
        ),
        name="api-docs",
    ),
    # Last: every other path of an API version answers a 404 problem, DEBUG or not.
    re_path(r"^api/v\d+/", problems.api_not_found),
]

handler400 = "operations.http.problems.api_handler400"
handler404 = "operations.http.problems.api_handler404"
handler500 = "operations.http.problems.api_handler500"
