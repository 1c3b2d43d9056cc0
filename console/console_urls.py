from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("approvals/<str:approval_id>/", views.approval_detail, name="approval"),
    path("approvals/<str:approval_id>/decide", views.approval_decide, name="approval-decide"),
    path("approvals/<str:approval_id>/revoke", views.approval_revoke, name="approval-revoke"),
    path("reconciliation/", views.reconciliation, name="reconciliation"),
    path("operations/<str:operation_id>/", views.operation_detail, name="operation"),
    path(
        "operations/<str:operation_id>/resolve", views.operation_resolve, name="operation-resolve"
    ),
    path("operations/<str:operation_id>/note", views.operation_note, name="operation-note"),
    path(
        "operations/<str:operation_id>/compensated",
        views.operation_compensated,
        name="operation-compensated",
    ),
    path(
        "operations/<str:operation_id>/resolutions/<str:resolution_id>",
        views.resolution_confirm,
        name="resolution-confirm",
    ),
]
