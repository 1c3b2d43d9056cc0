from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("approvals/<str:approval_id>/", views.approval_detail, name="approval"),
    path("approvals/<str:approval_id>/decide", views.approval_decide, name="approval-decide"),
    path("approvals/<str:approval_id>/revoke", views.approval_revoke, name="approval-revoke"),
]
