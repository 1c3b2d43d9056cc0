"""The MCP gateway asks its client to open the approval page while a call waits for a
person: URL-mode elicitation (MCP 2025-11-25, ``elicitation/create`` with ``mode:
"url"``), and ``notifications/elicitation/complete`` once the person decided.

Only a client that declared ``capabilities.elicitation.url`` is asked: one that declared
form mode alone (or the empty ``elicitation: {}``, which the specification reads as form
mode) gets the plain answer with the link, as a client that declared nothing does. The
client's answer (``accept``, ``decline``, ``cancel``) is its user's consent to open the
page or not, never a decision: the call keeps waiting for the person either way,
because an approver may decide from the inbox whatever this client's user chose.

The link is the one the answer gives (``<console url>/approvals/<id>/``): the console
asks whoever opens it to sign in, so it grants nothing by itself, and it holds no token
or key. The message says which tool waits and for what, never the arguments.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from ..answers import Operation
    from ..client import AsyncEffectgateClient
    from ..waiters import AsyncWaiter

logger = logging.getLogger("effectgate_client.mcp_gateway")

# How long the completion notification may take to leave; the call's answer follows it.
COMPLETE_TIMEOUT_S = 5.0
AWAITING_APPROVAL = "awaiting_approval"


def approval_url(console: str, operation: Mapping[str, Any]) -> str | None:
    """The console page of the operation's approval request, if it has one."""
    approval = operation.get("approval") or {}
    return f"{console}/approvals/{approval['id']}/" if approval.get("id") else None


def opens_urls(session: Any) -> bool:
    """Whether the client declared URL-mode elicitation and this call's channel can
    carry a request to it (the 2026-07-28 revision has no requests from server to
    client; a JSON-only HTTP exchange cannot carry one either)."""
    capabilities = getattr(session, "client_capabilities", None)
    elicitation = getattr(capabilities, "elicitation", None)
    if elicitation is None or getattr(elicitation, "url", None) is None:
        return False
    return bool(getattr(session, "can_send_request", False))


def _duration(seconds: float) -> str:
    if seconds < 120:
        whole = max(1, round(seconds))
        return f"{whole} second{'s' if whole != 1 else ''}"
    return f"{round(seconds / 60)} minutes"


class ApprovalPrompt:
    """One call's elicitation; ``pending`` and ``decided`` are called while the call
    waits (through ``PromptingWaiter``), on the event loop the call runs on.

    At most one ``elicitation/create`` per call, sent without waiting for the client's
    answer: the wait for the decision goes on while the client's user reads the prompt.
    The completion notification is sent once, when the decision came, before the call
    goes on (so it leaves before the call's answer, on the same stream).
    """

    def __init__(
        self,
        *,
        session: Any,
        request_id: Any,
        task_group: Any,
        console: str,
        tool: str,
        wait_s: float,
    ) -> None:
        self.session = session
        self.request_id = request_id
        self.task_group = task_group
        self.console = console
        self.tool = tool
        self.wait_s = wait_s
        self.elicitation_id: str | None = None
        self.completed = False

    def message(self) -> str:
        return (
            f"The call to {self.tool} waits for a person to approve or reject it in "
            "Effectgate. The approval page shows exactly what the call will do; this "
            f"call waits up to {_duration(self.wait_s)} for the decision, then answers."
        )

    def pending(self, operation: Operation) -> None:
        """The call starts waiting for a person: ask the client to open the page."""
        if self.elicitation_id is not None:
            return  # one elicitation per call, even if a new request follows
        url = approval_url(self.console, operation)
        if url is None:
            return
        self.elicitation_id = uuid.uuid4().hex
        try:
            self.task_group.start_soon(self._elicit, url, self.elicitation_id)
        except Exception as exc:  # the prompt is a courtesy: the call waits without it
            logger.warning("could not ask the client to open %s: %s", url, exc)

    async def decided(self, operation: Operation) -> None:
        """The request was decided (or the operation left it otherwise): say so."""
        if self.elicitation_id is None or self.completed:
            return
        self.completed = True
        try:
            await self._complete(self.elicitation_id)
        except Exception as exc:
            logger.warning("could not tell the client the approval was decided: %s", exc)

    async def _elicit(self, url: str, elicitation_id: str) -> None:
        logger.info("asking the client to open %s (call to %s)", url, self.tool)
        try:
            result = await self.session.elicit_url(
                self.message(), url, elicitation_id, related_request_id=self.request_id
            )
        except Exception as exc:
            logger.warning("the client did not take the approval link %s: %s", url, exc)
            return
        # accept: the user agreed to open the page; decline / cancel: they did not. The
        # person deciding may be someone else entirely: the call keeps waiting.
        logger.info("the client answered %s to opening %s", result.action, url)

    async def _complete(self, elicitation_id: str) -> None:
        with anyio.move_on_after(COMPLETE_TIMEOUT_S):
            await self.session.send_elicit_complete(
                elicitation_id, related_request_id=self.request_id
            )


class PromptingWaiter:
    """``AsyncRunner.execute``'s waiter for one call: the runner's own waiter, with the
    prompt told when a wait for a person starts and when it ends with a decision."""

    def __init__(self, base: AsyncWaiter, prompt: ApprovalPrompt) -> None:
        self.base = base
        self.prompt = prompt

    async def wait(
        self,
        client: AsyncEffectgateClient,
        operation: Operation,
        *,
        status: str,
        deadline: float,
    ) -> Operation:
        if status != AWAITING_APPROVAL:
            return await self.base.wait(client, operation, status=status, deadline=deadline)
        self.prompt.pending(operation)
        operation = await self.base.wait(client, operation, status=status, deadline=deadline)
        if operation["status"] != AWAITING_APPROVAL:
            await self.prompt.decided(operation)
        return operation
