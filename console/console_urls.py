from django.urls import path

from . import slack
from .views import (
    account,
    approvals,
    audit,
    dashboard,
    groups,
    inbound,
    inbox,
    operations,
    policies,
    reconciliation,
    runners,
    runs,
    saved_views,
    search,
    simulation,
    standing,
    tools,
)

app_name = "console"

urlpatterns = [
    path("", inbox.inbox, name="inbox"),
    path("approvals/<str:approval_id>/", approvals.approval_detail, name="approval"),
    path("approvals/decide", approvals.approvals_decide_many, name="approvals-decide-many"),
    path("approvals/<str:approval_id>/decide", approvals.approval_decide, name="approval-decide"),
    path("approvals/<str:approval_id>/revoke", approvals.approval_revoke, name="approval-revoke"),
    path(
        "approvals/<str:approval_id>/approve-and-issue",
        approvals.approval_approve_and_issue,
        name="approval-approve-and-issue",
    ),
    path("reconciliation/", reconciliation.reconciliation, name="reconciliation"),
    path("operations/<str:operation_id>/", operations.operation_detail, name="operation"),
    path(
        "operations/<str:operation_id>/resolve",
        operations.operation_resolve,
        name="operation-resolve",
    ),
    path("operations/<str:operation_id>/note", operations.operation_note, name="operation-note"),
    path(
        "operations/<str:operation_id>/evidence",
        operations.operation_evidence,
        name="operation-evidence",
    ),
    path(
        "operations/<str:operation_id>/compensated",
        operations.operation_compensated,
        name="operation-compensated",
    ),
    path(
        "webhooks/<str:message_id>/redeliver",
        operations.webhook_redeliver,
        name="webhook-redeliver",
    ),
    path(
        "operations/<str:operation_id>/resolutions/<str:resolution_id>",
        operations.resolution_confirm,
        name="resolution-confirm",
    ),
]

# The rest of the console (issue 7).
urlpatterns += [
    path("search/", search.search, name="search"),
    path("views/save", saved_views.saved_view_save, name="saved-view-save"),
    path("views/<count:view_id>/delete", saved_views.saved_view_delete, name="saved-view-delete"),
    path("operations/", operations.operations_list, name="operations"),
    path("runs/", runs.runs_list, name="runs"),
    path("runs/<str:run_id>/", runs.run_detail, name="run"),
    path("runs/<str:run_id>/cancel", runs.run_cancel, name="run-cancel"),
    path("tools/", tools.tools_list, name="tools"),
    path("tools/<str:name>/", tools.tool_detail, name="tool"),
    path(
        "tools/<str:name>/versions/<count:number>/activate",
        tools.tool_activate,
        name="tool-activate",
    ),
    path("audit/", audit.audit, name="audit"),
    path("audit/export.<str:fmt>", audit.audit_export, name="audit-export"),
    path("dashboard/", dashboard.dashboard, name="dashboard"),
]

urlpatterns += [
    path("inbound/", inbound.inbound_events, name="inbound"),
    path("tools/<str:name>/breaker", tools.tool_breaker, name="tool-breaker"),
    path("tools/<str:name>/owner", tools.tool_owner, name="tool-owner"),
    path("tools/<str:name>/route", tools.tool_route, name="tool-route"),
    path("groups/", groups.groups_list, name="groups"),
    path("groups/<count:group_id>/", groups.group_detail, name="group"),
    path("groups/<count:group_id>/route", groups.group_route, name="group-route"),
]

# Security (issue 8): runner tokens for admins, each person's second factor.
urlpatterns += [
    path("runners/", runners.runners_list, name="runners"),
    path("runners/<str:runner_id>/", runners.runner_detail, name="runner"),
    path("runners/<str:runner_id>/tokens", runners.token_issue, name="runner-token-issue"),
    path(
        "runners/<str:runner_id>/tokens/<str:token_id>/revoke",
        runners.token_revoke,
        name="runner-token-revoke",
    ),
    path("account/", account.account, name="account"),
    path("account/totp", account.totp_start, name="account-totp-start"),
    path("account/totp/confirm", account.totp_confirm, name="account-totp-confirm"),
    path("account/verify", account.verify, name="account-verify"),
    path("account/notifications", account.notifications, name="account-notifications"),
    path("account/slack/link", slack.link, name="slack-link"),
    path("account/slack/unlink", slack.unlink, name="slack-unlink"),
]

# Standing grants (issue 25).
urlpatterns += [
    path("standing-grants/", standing.standing_grants, name="standing-grants"),
    path("standing-grants/issue", standing.standing_grant_issue, name="standing-grant-issue"),
    path("standing-grants/<str:grant_id>/", standing.standing_grant_detail, name="standing-grant"),
    path(
        "standing-grants/<str:grant_id>/sign",
        standing.standing_grant_sign,
        name="standing-grant-sign",
    ),
    path(
        "standing-grants/<str:grant_id>/revoke",
        standing.standing_grant_revoke,
        name="standing-grant-revoke",
    ),
]

# People's policies in Cedar (issue 25): only for people who manage policies.
urlpatterns += [
    path("policies/", policies.policies_list, name="policies"),
    path("policies/editor", policies.policy_editor, name="policy-editor"),
    path("policies/validate", policies.policy_validate, name="policy-validate"),
    path("policies/save", policies.policy_save, name="policy-save"),
    path("policies/<str:policy_id>/", policies.policy_detail, name="policy"),
    path("policies/<str:policy_id>/shadow", policies.policy_shadow, name="policy-shadow"),
    path("policies/<str:policy_id>/activate", policies.policy_activate, name="policy-activate"),
    path("policies/<str:policy_id>/retire", policies.policy_retire, name="policy-retire"),
    path(
        "policies/<str:policy_id>/simulate",
        simulation.policy_simulation,
        name="policy-simulate",
    ),
    # A contract version waiting for activation: for people who manage policies or may
    # activate the tool (access.may_simulate_contract).
    path(
        "tools/<str:name>/versions/<count:number>/simulate",
        simulation.contract_simulation,
        name="tool-simulate",
    ),
]
