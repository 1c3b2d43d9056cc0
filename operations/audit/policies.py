"""People's policies follow from their events (the stream ``policy:<id>``)."""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..canonical import sha256_hex
from ..machine import EventKind
from ..models import (
    Event,
    Policy,
    PolicyVersion,
)
from .chains import CHUNK
from .rows import Unexplained, _shown


@dataclass
class _PolicyReplay:
    """What a policy's events leave it: its state, the versions in force and watched,
    each version's ``policy_written`` event (its text hash and author), and each
    activation (the version, the person, the text hash it named)."""

    state: str | None = None
    active: int | None = None
    shadow: int | None = None
    written: dict[Any, tuple[Any, int | None]] = field(default_factory=dict)
    activations: list[tuple[Any, int | None, Any]] = field(default_factory=list)

    def settle(self) -> None:
        """The state any change but a retirement leaves (``services.policies._state_of``)."""
        if self.active is not None:
            self.state = Policy.State.ACTIVE
        elif self.shadow is not None:
            self.state = Policy.State.SHADOW
        else:
            self.state = Policy.State.DRAFT


def _policy_replay(policy_id: str) -> _PolicyReplay:
    """Replay the stream ``policy:<id>`` the way ``services.policies`` writes it; events
    of other kinds on it (what a shadow policy would have done) change nothing."""
    replay = _PolicyReplay()
    events = Event.objects.filter(stream=f"policy:{policy_id}").order_by("seq")
    for kind, data, user_id in events.values_list("kind", "data", "actor_user_id").iterator(
        chunk_size=CHUNK
    ):
        data = data if isinstance(data, dict) else {}
        version = data.get("version")
        if kind == EventKind.POLICY_WRITTEN:
            replay.written[version] = (data.get("text_hash"), user_id)
            replay.settle()
        elif kind == EventKind.POLICY_SHADOWED:
            replay.shadow = version
            replay.settle()
        elif kind == EventKind.POLICY_ACTIVATED:
            replay.activations.append((version, user_id, data.get("text_hash")))
            replay.active = version
            # Activating a version stops watching it and any older one.
            if replay.shadow is not None and isinstance(version, int) and replay.shadow <= version:
                replay.shadow = None
            replay.settle()
        elif kind == EventKind.POLICY_RETIRED:
            replay.active = replay.shadow = None
            replay.state = Policy.State.RETIRED
    return replay


def _policy_version_problem(version: Mapping[str, Any], replay: _PolicyReplay) -> str | None:
    written = replay.written.get(version["number"])
    if written is None:
        return "no policy_written event wrote it"
    text_hash, writer = written
    if text_hash != version["text_hash"]:
        return (
            f"its text_hash is {_shown(version['text_hash'])}, but its policy_written event "
            f"says {_shown(text_hash)}"
        )
    if sha256_hex(version["text"]) != version["text_hash"]:
        return "its text is not the one its text_hash was computed over"
    if writer != version["written_by_id"]:
        return (
            f"its author is user {version['written_by_id']}, but its policy_written event "
            f"was written by user {_shown(writer)}"
        )
    for number, activator, activated_hash in replay.activations:
        if number != version["number"]:
            continue
        if activator is None:
            return "a policy_activated event put it in force, but no person did"
        if activator == version["written_by_id"]:
            return (
                f"a policy_activated event by user {activator}, its author, put it in force: "
                "activating needs a second person"
            )
        if activated_hash != version["text_hash"]:
            return "a policy_activated event put another text of it in force"
    return None


def _policies() -> Iterator[Unexplained]:
    """Every policy's state, version in force and version watched are those its
    stream's events leave (``services.policies``); each of its versions has the
    ``policy_written`` event that wrote it, by its author, with its text's hash, and the
    text still hashes to it; every version put in force was put there by someone other
    than its author (four eyes)."""
    rows = Policy.objects.order_by("pk").values(
        "pk", "state", "active_version__number", "shadow_version__number"
    )
    for row in rows.iterator(chunk_size=CHUNK):
        replay = _policy_replay(row["pk"])
        versions = list(
            PolicyVersion.objects.filter(policy_id=row["pk"])
            .order_by("number")
            .values("number", "text", "text_hash", "written_by_id")
        )
        for version in versions:
            problem = _policy_version_problem(version, replay)
            if problem:
                yield Unexplained(
                    "operations.PolicyVersion", f"{row['pk']} v{version['number']}", problem
                )
        problem = None
        if replay.state is None:
            problem = "its stream has no policy_written event"
        elif row["state"] != replay.state:
            problem = f"its state is {row['state']}, but its events leave it {replay.state}"
        elif row["active_version__number"] != replay.active:
            problem = (
                f"its active version is {_shown(row['active_version__number'])}, but its "
                f"events leave {_shown(replay.active)} in force"
            )
        elif row["shadow_version__number"] != replay.shadow:
            problem = (
                f"its shadow version is {_shown(row['shadow_version__number'])}, but its "
                f"events leave {_shown(replay.shadow)} watched"
            )
        if problem:
            yield Unexplained("operations.Policy", row["pk"], problem)
