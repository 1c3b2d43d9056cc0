"""Reads of the approvals app shared by the API, the console and operations."""

from typing import Any

from .models import ApprovalRequest


def request_latest(operation: Any) -> ApprovalRequest | None:
    """The newest approval request of an operation, with decisions and grant loaded."""
    requests = getattr(operation, "_prefetched_objects_cache", {}).get("approval_requests")
    if requests is not None:
        return max(requests, key=lambda r: (r.created_at, r.id), default=None)
    return (
        ApprovalRequest.objects.filter(operation=operation)
        .select_related("grant__standing_grant")
        .prefetch_related("decisions__user", "grant__standing_grant__signatures__user")
        .order_by("-created_at", "-id")
        .first()
    )
