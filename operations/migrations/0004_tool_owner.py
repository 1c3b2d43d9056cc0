"""Tool ownership (api.md, version 1.1).

Each tool's first registering runner becomes its owner, and every other runner keeps
invoking the tools it has already invoked (an ``invoke_tool`` object permission on its
service user), so nothing in flight breaks.
"""

import django.db.models.deletion
from django.db import migrations, models


def owners_and_invokers(apps, schema_editor):
    Tool = apps.get_model("operations", "Tool")
    ToolVersion = apps.get_model("operations", "ToolVersion")
    Operation = apps.get_model("operations", "Operation")
    Runner = apps.get_model("operations", "Runner")
    for tool in Tool.objects.filter(owner__isnull=True):
        first = (
            ToolVersion.objects.filter(tool=tool, registered_by__isnull=False)
            .order_by("number")
            .values_list("registered_by_id", flat=True)
            .first()
        )
        if first is not None:
            Tool.objects.filter(pk=tool.pk).update(owner_id=first)
    pairs = set(
        Operation.objects.exclude(runner_id=models.F("tool__owner_id"))
        .values_list("runner_id", "tool_id")
        .distinct()
    )
    if not pairs:
        return
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    UserObjectPermission = apps.get_model("guardian", "UserObjectPermission")
    content_type, _ = ContentType.objects.get_or_create(app_label="operations", model="tool")
    permission, _ = Permission.objects.get_or_create(
        content_type=content_type,
        codename="invoke_tool",
        defaults={"name": "May be invoked by a restricted runner"},
    )
    service_users = dict(Runner.objects.values_list("pk", "service_user_id"))
    for runner_id, tool_name in sorted(pairs):
        UserObjectPermission.objects.get_or_create(
            user_id=service_users[runner_id],
            permission=permission,
            content_type=content_type,
            object_pk=tool_name,
        )


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0003_search_indexes"),
        ("guardian", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.AddField(
            model_name="tool",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="owned_tools",
                to="operations.runner",
            ),
        ),
        migrations.RunPython(owners_and_invokers, migrations.RunPython.noop),
    ]
