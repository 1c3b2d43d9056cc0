"""Django admin for superusers: the ledger to read, and the few writes that services make.

The admin writes nothing a service does not: every ledger model is read-only here
(``ReadOnlyAdmin``), except the changes that go through a service with their event (a
runner's owner, restriction and activity; a tool's object permissions) and the actions
that call one (activating a version, revoking a token). No page shows a secret or
offers a drop-down of every row of a table.
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import Group
from django.http import HttpRequest
from guardian.admin import (
    AdminGroupObjectPermissionsForm,
    AdminUserObjectPermissionsForm,
    GuardedModelAdmin,
)

from approvals.admin import ReadOnlyAdmin
from approvals.errors import Refusal
from approvals.people import Person

from . import access, services
from .models import (
    Attempt,
    Event,
    Notice,
    NoticeDelivery,
    Operation,
    Run,
    Runner,
    RunnerToken,
    Tool,
    ToolVersion,
)


def _people_permission_choices() -> list[tuple[str, str]]:
    names = dict(Tool._meta.permissions)
    return [
        (codename, names[codename])
        for codename in (perm.split(".", 1)[1] for perm in access.PEOPLE_TOOL_PERMISSIONS)
    ]


class _ToolPermissionsForm:
    """Guardian's permission form, saved through ``services.tool_permissions_set`` (one
    event per change) and offering only the permissions people hold on a tool."""

    # Set by ToolAdmin's form factories below to the person signed in to the admin.
    acting_user: Person
    holder: Any
    obj: Any
    cleaned_data: dict[str, Any]

    def get_obj_perms_field_choices(self) -> list[tuple[str, str]]:
        return _people_permission_choices()

    def save_obj_perms(self) -> None:
        services.tool_permissions_set(
            tool=self.obj,
            holder=self.holder,
            perms=self.cleaned_data["permissions"],
            user=self.acting_user,
        )


class _UserToolPermissionsForm(_ToolPermissionsForm, AdminUserObjectPermissionsForm):
    @property
    def holder(self) -> Person:
        return self.user


class _GroupToolPermissionsForm(_ToolPermissionsForm, AdminGroupObjectPermissionsForm):
    @property
    def holder(self) -> Group:
        return self.group


@admin.register(Tool)
class ToolAdmin(GuardedModelAdmin):
    """A tool, read-only, and its object permissions: decide, reconcile, activate.

    The owner, the breaker and the inbound secret change only in the console or with
    ``manage.py tool``, each through its service and event.
    """

    list_display = ["name", "owner", "active_version", "breaker_state", "created_at"]
    # Every field is read-only even where the page would allow a change: a read-only
    # foreign key renders the one row it names, never a drop-down of the table.
    fields = readonly_fields = (
        "name",
        "owner",
        "active_version",
        "created_at",
        "inbound_secret",
        "breaker_state",
        "breaker_failures",
        "breaker_opened_at",
        "breaker_probe",
    )
    search_fields = ["name"]

    @admin.display(description="Inbound secret")
    def inbound_secret(self, tool: Tool) -> str:
        return "set" if tool.inbound_secret_encrypted else "not set"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        # Guardian's permission pages ask about the model (obj None): that is the one
        # change made here, and services.tool_permissions_set judges it by the same
        # access function. A tool's own columns are never changed in the admin.
        return obj is None and access.may_manage_tool_permissions(request.user)

    def has_delete_permission(self, request, obj=None):
        return False

    def get_obj_perms_manage_user_form(self, request: HttpRequest) -> type[forms.Form]:
        return type(
            "UserToolPermissionsForm", (_UserToolPermissionsForm,), {"acting_user": request.user}
        )

    def get_obj_perms_manage_group_form(self, request: HttpRequest) -> type[forms.Form]:
        return type(
            "GroupToolPermissionsForm", (_GroupToolPermissionsForm,), {"acting_user": request.user}
        )


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


@admin.register(Runner)
class RunnerAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "restrict_tools", "is_active", "created_at"]
    fields = ["name", "owner", "restrict_tools", "is_active"]
    readonly_fields = ["name"]
    # A text box for the owner's id, not a drop-down of every account.
    raw_id_fields = ["owner"]

    def has_add_permission(self, request):
        # Runners are created with `manage.py runner create`, which prints the token once.
        return False

    def has_delete_permission(self, request, obj=None):
        # A runner is deactivated (an event), never deleted: its tokens, endpoints and
        # the history its events name would go with it.
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

    @admin.action(description="Revoke the selected tokens", permissions=["manage_runners"])
    def revoke(self, request, queryset):
        for token in queryset:
            services.token_revoke_by_user(token=token, user=request.user)
        self.message_user(request, "Revoked.", messages.SUCCESS)

    def has_manage_runners_permission(self, request):
        return access.may_manage_runners(request.user)


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


@admin.register(Notice)
class NoticeAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "request", "resolution", "created_at", "fanned_out_at"]
    list_filter = ["kind"]


@admin.register(NoticeDelivery)
class NoticeDeliveryAdmin(ReadOnlyAdmin):
    """Where each notice went and what came of it: ``last_error`` holds what the mail
    server or Slack said (``not_in_channel``: invite the app to the channel)."""

    list_display = ["notice", "channel", "address", "status", "attempts", "last_error"]
    list_filter = ["channel", "status"]
