from django.contrib import admin

from .models import ApprovalRequest, Decision, Grant


class ReadOnlyAdmin(admin.ModelAdmin):
    """Audit records are shown, never added, edited or deleted in the admin."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
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
    list_display = ["id", "request", "expires_at", "revoked_at"]
