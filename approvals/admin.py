from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from .models import ApprovalRequest, Decision, Grant, StandingGrant, StandingGrantSignature


class ReadOnlyAdmin(admin.ModelAdmin):
    """Ledger rows are shown, never added, edited or deleted in the admin.

    Every change of such a row goes through a service that writes its event in the same
    transaction; a form that saved the row itself would change it behind the ledger's
    back (and ``audit verify`` could not tell). Without the delete permission the admin
    also drops its bulk ``delete_selected`` action. An action that calls a service is
    still offered: the service decides whether the person may.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "operation", "status", "approvals_required", "created_at", "expires_at"]
    list_filter = ["status"]


@admin.register(Decision)
class DecisionAdmin(ReadOnlyAdmin):
    list_display = ["request", "user", "decision", "at"]


@admin.register(Grant)
class GrantAdmin(ReadOnlyAdmin):
    list_display = ["id", "request", "expires_at", "revoked_at", "standing_grant"]


@admin.register(StandingGrant)
class StandingGrantAdmin(ReadOnlyAdmin):
    list_display = ["id", "tool", "principal", "status", "uses", "max_uses", "expires_at"]
    list_filter = ["status"]


@admin.register(StandingGrantSignature)
class StandingGrantSignatureAdmin(ReadOnlyAdmin):
    list_display = ["grant", "user", "at", "second_factor"]
