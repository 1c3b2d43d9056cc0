"""Django admin for superusers: permissions per tool, runners, and read-only ledgers.

Writes that change the ledger go through services (activation, token revocation); the
admin never edits operations, attempts or events.
"""

from django.contrib import admin, messages
from guardian.admin import GuardedModelAdmin

from approvals.admin import ReadOnlyAdmin
from approvals.errors import Refusal

from . import services
from .models import Attempt, Event, Operation, Run, Runner, RunnerToken, Tool, ToolVersion


@admin.register(Tool)
class ToolAdmin(GuardedModelAdmin):
    """Object permissions per tool: decide, reconcile, activate, invoke (by runners)."""

    list_display = ["name", "active_version", "created_at"]
    readonly_fields = ["name", "active_version", "created_at"]
    search_fields = ["name"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ToolVersion)
class ToolVersionAdmin(ReadOnlyAdmin):
    list_display = ["tool", "number", "activated_at", "activated_by", "weakens", "created_at"]
    list_filter = ["tool"]
    actions = ["activate"]

    @admin.action(description="Activate the selected version (one per tool)")
    def activate(self, request, queryset):
        for version in queryset.select_related("tool", "registered_by"):
            try:
                services.tool_version_activate(version=version, user=request.user)
            except Refusal as refusal:
                self.message_user(request, f"{version}: {refusal.detail}", messages.ERROR)
            else:
                self.message_user(request, f"{version} is now active.", messages.SUCCESS)

    def has_change_permission(self, request, obj=None):
        # The action needs change permission to be offered; edits stay impossible
        # because every field is read-only.
        return request.user.is_superuser

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]


@admin.register(Runner)
class RunnerAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "restrict_tools", "is_active", "created_at"]
    fields = ["name", "owner", "restrict_tools", "is_active"]
    readonly_fields = ["name"]

    def has_add_permission(self, request):
        # Runners are created with `manage.py runner create`, which prints the token once.
        return False

    def save_model(self, request, obj, form, change):
        # Through the service, so each change of owner, restriction or activity is an
        # event on the runner's stream.
        services.runner_update(
            runner=obj,
            user=request.user,
            changes={field: form.cleaned_data[field] for field in form.changed_data},
        )


@admin.register(RunnerToken)
class RunnerTokenAdmin(ReadOnlyAdmin):
    list_display = ["prefix", "runner", "scopes", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["runner"]
    exclude = ["token_hash"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.token_revoke(token=token, actor=services.Actor.of_user(request.user))
        self.message_user(request, "Revoked.", messages.SUCCESS)

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def get_readonly_fields(self, request, obj=None):
        return [
            "prefix",
            "runner",
            "scopes",
            "label",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ]


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "runner", "principal", "status", "tool_calls", "spend", "created_at"]
    list_filter = ["status", "runner"]
    search_fields = ["id", "external_id", "principal"]


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ["id", "tool", "status", "effect_class", "attempts", "created_at"]
    list_filter = ["status", "effect_class", "tool"]
    search_fields = ["id", "operation_key", "idempotency_key", "call_id", "downstream_id"]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["id", "operation", "number", "status", "claimed_at", "lease_until"]
    list_filter = ["status"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["id", "stream", "seq", "kind", "from_status", "to_status", "actor", "at"]
    list_filter = ["kind"]
    search_fields = ["stream", "actor"]
