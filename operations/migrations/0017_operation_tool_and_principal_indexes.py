"""Two indexes for the approval page's risk signals (operations/selectors/review.py):
``op_tool_id`` (a tool's latest operations, replacing the tool foreign key's own index)
and ``op_principal_id`` (a principal's first operation).

Built without blocking the ledger: on PostgreSQL each index is created CONCURRENTLY
(runners keep registering while it builds), which needs a migration outside a
transaction; only then is the foreign key's old index dropped, so a tool's operations
are never without an index. Elsewhere (SQLite) the same indexes are created plainly,
after the AlterField (which remakes the table there).
"""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = (
    models.Index(fields=["tool", "id"], name="op_tool_id"),
    models.Index(fields=["principal", "id"], name="op_principal_id"),
)


def _postgresql(schema_editor) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def _indexes(*, create: bool, concurrently: bool):
    """Create (or drop) the indexes, CONCURRENTLY on PostgreSQL; each function acts on
    one kind of database only, so that the order around the AlterField suits both."""

    def run(apps, schema_editor) -> None:
        if _postgresql(schema_editor) != concurrently:
            return
        operation = apps.get_model("operations", "Operation")
        for index in INDEXES:
            if create:
                schema_editor.add_index(
                    operation, index, **({"concurrently": True} if concurrently else {})
                )
            else:
                # SQLite remakes the table on an AlterField: the index may be gone.
                keyword = "CONCURRENTLY " if concurrently else ""
                schema_editor.execute(
                    f"DROP INDEX {keyword}IF EXISTS {schema_editor.quote_name(index.name)}"
                )

    return run


def _tool_without_its_own_index() -> migrations.AlterField:
    """The tool foreign key without its own index (op_tool_id serves it)."""
    return migrations.AlterField(
        model_name="operation",
        name="tool",
        field=models.ForeignKey(
            db_index=False,
            on_delete=django.db.models.deletion.PROTECT,
            related_name="operations",
            to="operations.tool",
        ),
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("operations", "0016_policy_window_entries"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                # PostgreSQL: the new indexes first, built while runners keep writing...
                migrations.RunPython(
                    _indexes(create=True, concurrently=True),
                    _indexes(create=False, concurrently=True),
                ),
                # ...then the foreign key's own index goes (a short DROP INDEX).
                _tool_without_its_own_index(),
                # Elsewhere after the AlterField, which on SQLite remakes the table.
                migrations.RunPython(
                    _indexes(create=True, concurrently=False),
                    _indexes(create=False, concurrently=False),
                ),
            ],
            state_operations=[
                _tool_without_its_own_index(),
                *(migrations.AddIndex(model_name="operation", index=index) for index in INDEXES),
            ],
        ),
    ]
