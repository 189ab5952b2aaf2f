"""The Session aggregate: one agent conversation as an event stream.

Public methods check the rules and compute what to record; nested event
classes record it. An event's ``apply`` re-runs on every replay, so it uses
only its own fields and the aggregate's state, never the clock or I/O.
Every event class has an explicit, versioned topic so that stored events do
not depend on module paths.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, TypeAlias
from uuid import UUID, uuid4

from eventsourcing.domain import Aggregate
from eventsourcing.domain import Snapshot as LibrarySnapshot
from eventsourcing.utils import register_topic

from turnlog.domain import errors, events
from turnlog.domain.events import (
    NOT_APPLIED_ERROR,
    message_digest,
    probed_not_applied,
)
from turnlog.domain.turns import (
    APPROVAL_POLICIES,
    IDEMPOTENCY_WINDOW,
    MAX_DEADLINE_SECONDS,
    MAX_MESSAGE_BYTES,
    MAX_QUEUED_TURNS,
    MAX_TOOL_ATTEMPTS,
    RUNTIME_ACTOR,
    CallState,
    Effect,
    FinishedEntry,
    FinishedTurn,
    ProbeAnswer,
    Step,
    ToolCall,
    ToolProcess,
    Turn,
    TurnState,
    entries_from_lists,
    require_text,
)
from turnlog.domain.values import check_storable, storable_text

RESOLVE_OUTCOMES = ("succeeded", "failed")
MIN_CONTEXT_CHARS = 1000  # the smallest context_max_chars a session may set


class Session(Aggregate):
    """An agent session: its settings, its open turn and a summary of the finished ones.

    The state is bounded: a finished turn leaves only an entry in ``finished``
    (its id, how it ended, the version range of its events and its call ids);
    its content stays in the stream. A *retaining* copy (``retaining()``),
    rebuilt for reads and audits, keeps every turn as well.
    """

    TOPIC = "turnlog.session.Session.v1"
    # Version 2 of the state (and of snapshots) is the bounded one; version-1
    # snapshots held every turn, version-2 ones every idempotency key, and both
    # are upcast as they load.
    class_version = 3

    Event: TypeAlias = events.Event

    class Snapshot(LibrarySnapshot):
        """A session's state at a version, so loading skips the events before it."""

        TOPIC = "turnlog.session.Snapshot.v2"

        def mutate(self, _: None) -> Any:
            session = super().mutate(_)
            # Stored as JSON lists: each entry is a FinishedEntry again.
            state = session.__dict__
            state["finished"] = entries_from_lists(state["finished"])
            return session

    class Created(Aggregate.Created):
        """Unused library base; sessions start with Started."""

        TOPIC = "turnlog.session.Created.v1"

    class Started(Created):
        # The topic keeps the class's former name: streams already stored load unchanged.
        TOPIC = "turnlog.session.SessionStarted.v1"
        title: str
        system_prompt: str
        provider: str
        model: str
        tools: list[str]
        metadata: dict[str, Any]
        created_by: str
        # True: ``tools`` is exactly what the session offers (none when empty).
        # Sessions stored before the choice was recorded load as False, where an
        # empty list meant every tool of the process.
        tools_chosen: bool = False
        # The context-window policy of the session's requests (0: no limit).
        # Sessions stored before the policy existed load with none.
        context_max_turns: int = 0
        context_max_chars: int = 0
        # Which tool calls wait for an operator's approval (none | side_effecting | all),
        # and the deadline its turns get when their submitter names none (0: none).
        approval_policy: str = "none"
        deadline_seconds: float = 0.0

    class Forked(Started):
        """A session begun from another at one of its versions (``Session.fork``).

        Names the source, the version and the source's chain head there (the
        hex hash of its event at that version; "" for a stream stored before
        the chain). Besides the source's settings it carries what the fork's
        requests need: the context summary in force, an entry for every turn
        finished by then, and the turns the next request carries (those after
        the summary) in full, with their calls. The fork never reads the
        source again.
        """

        TOPIC = "turnlog.session.SessionForked.v1"
        # Defaults only because the fields of Started before them have some.
        source_id: str = ""
        source_version: int = 0
        source_head: str = ""
        inherited_compaction: dict[str, Any] | None = None
        # [turn id, state, call ids] of every turn finished at the version, in order.
        inherited_finished: list[list[Any]] = field(default_factory=list)
        inherited_turns: list[Turn] = field(default_factory=list)
        inherited_calls: list[ToolCall] = field(default_factory=list)

        def apply(self, aggregate: Any) -> None:
            s: Session = aggregate
            version = self.originator_version
            s.forked_from = {
                "session_id": self.source_id,
                "version": self.source_version,
                "head": self.source_head,
            }
            if self.inherited_compaction is not None:
                s.compaction = {
                    **self.inherited_compaction,
                    "through_version": version,
                    "version": version,
                }
            for turn_id, state, call_ids in self.inherited_finished:
                s.finished.append(FinishedEntry(turn_id, state, version, version, list(call_ids)))
                s.counts[state] = s.counts.get(state, 0) + 1
            if s.retains_finished:
                self.inherit(s)

        def inherit(self, session: Session) -> None:
            """Give a retaining session the inherited turns in full (copies)."""
            for turn in self.inherited_turns:
                session.turns.append(copy.deepcopy(turn))
            for call in self.inherited_calls:
                session.calls[call.call_id] = copy.deepcopy(call)

    # Also the value of a session restored from a snapshot taken before the field.
    tools_chosen = False
    # Likewise the context policy, and the latest compaction (None: none yet):
    # {"summary", "turns", "last_turn_id", "through_version", "version"}.
    context_max_turns = 0
    context_max_chars = 0
    compaction: dict[str, Any] | None = None
    # A fork's source: {"session_id", "version", "head"} (None: not a fork).
    forked_from: dict[str, Any] | None = None
    approval_policy = "none"
    deadline_seconds = 0.0

    def __init__(
        self,
        title: str,
        system_prompt: str,
        provider: str,
        model: str,
        tools: list[str],
        metadata: dict[str, Any],
        created_by: str,
        tools_chosen: bool = False,
        context_max_turns: int = 0,
        context_max_chars: int = 0,
        approval_policy: str = "none",
        deadline_seconds: float = 0.0,
    ) -> None:
        self.approval_policy = approval_policy
        self.deadline_seconds = deadline_seconds
        self.title = title
        self.system_prompt = system_prompt
        self.provider = provider
        self.model = model
        self.tools = list(tools)
        self.tools_chosen = tools_chosen
        self.context_max_turns = context_max_turns
        self.context_max_chars = context_max_chars
        self.metadata = dict(metadata)
        self.created_by = created_by
        self.closed = False
        self.close_reason = ""
        self._init_turn_state()

    def _init_turn_state(self) -> None:
        self.turns: list[Turn] = []  # open turns (every turn, in a retaining copy)
        self.calls: dict[str, ToolCall] = {}  # calls of the turns in ``turns``
        self.idempotency_keys: dict[str, str] = {}  # key -> turn id
        self.idempotency_digests: dict[str, str] = {}  # key -> digest of its message
        # One entry per finished turn (turn id, state, version range, call ids).
        self.finished: list[FinishedEntry] = []
        self.counts: dict[str, int] = {}  # finished turns by how they ended

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """A version-1 snapshot held every turn: keep the open ones, summarise the rest.

        Version ranges are not in a version-1 snapshot; they are left 0 and the
        application fills them from the stream when the session loads.
        """
        turns: list[Turn] = state["turns"]
        open_ids = {t.turn_id for t in turns if t.state.is_open}
        done = [t for t in turns if t.turn_id not in open_ids]
        state["finished"] = [
            FinishedEntry(t.turn_id, str(t.state), 0, 0, list(t.call_ids)) for t in done
        ]
        state["counts"] = {}
        for t in done:
            state["counts"][str(t.state)] = state["counts"].get(str(t.state), 0) + 1
        by_id = {t.turn_id: t for t in turns}
        state["idempotency_digests"] = {
            key: message_digest(by_id[tid].message)
            for key, tid in state["idempotency_keys"].items()
            if tid in by_id
        }
        state["turns"] = [t for t in turns if t.turn_id in open_ids]
        state["calls"] = {k: c for k, c in state["calls"].items() if c.turn_id in open_ids}

    @staticmethod
    def upcast_v2_v3(state: dict[str, Any]) -> None:
        """A version-2 snapshot kept every idempotency key: keep only the window's.

        Its keys were all recorded under the default window, so that is the one
        applied (as a replay of its events would).
        """
        held = SimpleNamespace(
            turns=state["turns"],
            idempotency_keys=state["idempotency_keys"],
            idempotency_digests=state["idempotency_digests"],
        )
        events.forget_old_keys(held, IDEMPOTENCY_WINDOW)

    @classmethod
    def start(
        cls,
        *,
        title: str = "",
        system_prompt: str = "",
        provider: str = "fixture",
        model: str = "",
        tools: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        created_by: str = "",
        session_id: UUID | None = None,
        tools_chosen: bool = False,
        context_max_turns: int | None = None,
        context_max_chars: int | None = None,
        approval_policy: str = "none",
        deadline_seconds: float | None = None,
    ) -> Session:
        """Start a new session.

        ``tools_chosen``: ``tools`` is the exact choice (empty: no tools);
        otherwise an empty ``tools`` offers every tool of the process.
        ``context_max_turns`` / ``context_max_chars``: the context-window
        policy of its requests (None: no limit; see ``domain.compaction``).
        """
        fields = (title, system_prompt, provider, model, list(tools), metadata, created_by)
        check_storable(fields, "the session's settings")
        check_context_policy(context_max_turns, context_max_chars)
        check_approval_policy(approval_policy)
        if deadline_seconds is not None:
            check_deadline(deadline_seconds)
        return cls._create(
            cls.Started,
            id=session_id or uuid4(),
            title=title,
            system_prompt=system_prompt,
            provider=provider,
            model=model,
            tools=list(tools),
            metadata=dict(metadata or {}),
            created_by=created_by,
            tools_chosen=tools_chosen,
            context_max_turns=context_max_turns or 0,
            context_max_chars=context_max_chars or 0,
            approval_policy=approval_policy,
            deadline_seconds=float(deadline_seconds or 0.0),
        )

    @classmethod
    def fork(
        cls,
        source: Session,
        earlier: Session,
        *,
        version: int,
        head: str,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        created_by: str = "",
        session_id: UUID | None = None,
    ) -> Session:
        """A new session that goes on from ``source`` as it was at ``version``.

        ``source`` is the session rebuilt at that version, ``earlier`` the
        finished turns its next request carries (as ``Sessions.window``
        gives them), ``head`` the source's chain head there. Refused while a
        turn was open at that version: its outcome was not known yet.
        """
        for turn in source.turns:
            if turn.state is TurnState.INTERRUPTED:
                raise errors.ForkAtInterruptedTurn(
                    f"at version {version} turn {turn.turn_id} of session {source.id} is"
                    " interrupted: a call's outcome is unknown there",
                    turn_id=turn.turn_id,
                    state=str(turn.state),
                )
            if turn.state.is_open:
                raise errors.ForkInsideTurn(
                    f"version {version} of session {source.id} is inside turn {turn.turn_id}"
                    f" ({turn.state} there); fork at a version between turns",
                    turn_id=turn.turn_id,
                    state=str(turn.state),
                )
        new_title = source.title if title is None else title
        new_metadata = dict(source.metadata if metadata is None else metadata)
        check_storable((new_title, new_metadata, created_by), "the fork's settings")
        turns = [copy.deepcopy(t) for t in earlier.turns if not t.state.is_open]
        for turn in turns:
            turn.first_version = 1
        calls = [copy.deepcopy(earlier.calls[c]) for t in turns for c in t.call_ids]
        compaction = None
        if source.compaction is not None:
            compaction = {k: source.compaction[k] for k in ("summary", "turns", "last_turn_id")}
        return cls._create(
            cls.Forked,
            id=session_id or uuid4(),
            title=new_title,
            system_prompt=source.system_prompt,
            provider=source.provider,
            model=source.model,
            tools=list(source.tools),
            metadata=new_metadata,
            created_by=created_by,
            tools_chosen=source.tools_chosen,
            context_max_turns=source.context_max_turns,
            context_max_chars=source.context_max_chars,
            approval_policy=source.approval_policy,
            deadline_seconds=source.deadline_seconds,
            source_id=str(source.id),
            source_version=version,
            source_head=head,
            inherited_compaction=compaction,
            inherited_finished=[[e.turn_id, e.state, list(e.call_ids)] for e in source.finished],
            inherited_turns=turns,
            inherited_calls=calls,
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Session:
        """A copy whose finished turns are shared, not copied.

        Loading a session from the process's cache copies it, so a command's
        mutations never reach the cached object. No event changes a turn (or
        its calls) once it is completed, failed or abandoned, so those parts
        are shared; only open turns, their calls and the mutable containers
        are copied. This keeps the copy's cost proportional to the open work,
        not to the session's history.
        """
        clone = Session.__new__(Session)
        memo[id(self)] = clone
        state = dict(self.__dict__)
        open_turns = {t.turn_id for t in self.turns if t.state.is_open}
        state["turns"] = [
            copy.deepcopy(t, memo) if t.turn_id in open_turns else t for t in self.turns
        ]
        state["calls"] = {
            k: copy.deepcopy(c, memo) if c.turn_id in open_turns else c
            for k, c in self.calls.items()
        }
        for name in ("tools", "idempotency_keys", "idempotency_digests", "metadata", "counts"):
            state[name] = copy.deepcopy(state[name], memo)
        state["finished"] = list(self.finished)  # entries are never changed once appended
        state["_pending_events"] = list(self._pending_events)
        clone.__dict__.update(state)
        return clone

    # ------------------------------------------------------------------ queries

    @property
    def last_turn(self) -> Turn | FinishedTurn | None:
        """The latest turn: open (or retained) in full, else the summary of the last finished."""
        if self.turns:
            return self.turns[-1]
        return FinishedTurn.from_entry(self.finished[-1]) if self.finished else None

    def allows_tool(self, name: str) -> bool:
        """Whether the session offers the tool ``name`` to its model."""
        if self.tools_chosen:
            return name in self.tools
        return not self.tools or name in self.tools

    @property
    def retains_finished(self) -> bool:
        """True for a copy rebuilt to show every turn (never saved, never snapshotted)."""
        return bool(self.__dict__.get("_retain_finished"))

    @property
    def turn_count(self) -> int:
        return len(self.finished) + sum(1 for t in self.turns if t.state.is_open)

    def finished_turns(self) -> list[FinishedTurn]:
        return [FinishedTurn.from_entry(e) for e in self.finished]

    @property
    def compacted_turns(self) -> int:
        """How many turns, from the first, the latest context summary covers (0: none)."""
        return int(self.compaction["turns"]) if self.compaction else 0

    def finished_turn(self, turn_id: str) -> FinishedTurn | None:
        for entry in reversed(self.finished):
            if entry.turn_id == turn_id:
                return FinishedTurn.from_entry(entry)
        return None

    def turn_state(self, turn_id: str) -> TurnState:
        """The state of any turn of the session, open or finished."""
        for turn in self.turns:
            if turn.turn_id == turn_id:
                return turn.state
        finished = self.finished_turn(turn_id)
        if finished is None:
            raise errors.TurnNotFound(f"turn {turn_id} not found in session {self.id}")
        return finished.state

    @property
    def open_turn(self) -> Turn | None:
        """The current turn: the first that is open (follow-ups queue behind it), if any."""
        for turn in self.turns:
            if turn.state.is_open:
                return turn
        return None

    def queued_turns(self) -> list[Turn]:
        """Follow-up turns waiting behind the current one, in the order they run."""
        current = self.open_turn
        return [
            t
            for t in self.turns
            if t.state is TurnState.QUEUED and current is not None and t is not current
        ]

    @property
    def status(self) -> str:
        """idle, busy, awaiting_approval, blocked (an interrupted turn) or closed."""
        if self.closed:
            return "closed"
        turn = self.open_turn
        if turn is None:
            return "idle"
        if turn.state is TurnState.INTERRUPTED:
            return "blocked"
        return "awaiting_approval" if turn.state is TurnState.AWAITING_APPROVAL else "busy"

    def turn(self, turn_id: str) -> Turn:
        """An open turn (any turn in a retaining copy); a finished one is refused as such."""
        # Newest first: events name the latest turn, and a retaining copy (a replay of
        # thousands of turns) would otherwise scan them all for every event.
        for turn in reversed(self.turns):
            if turn.turn_id == turn_id:
                return turn
        finished = self.finished_turn(turn_id)
        if finished is not None:
            raise errors.InvalidTransition(f"turn {turn_id} is {finished.state}")
        raise errors.TurnNotFound(f"turn {turn_id} not found in session {self.id}")

    def call(self, call_id: str) -> ToolCall:
        try:
            return self.calls[call_id]
        except KeyError:
            if call_id in self._finished_call_ids():
                raise errors.InvalidTransition(
                    f"tool call {call_id} belongs to a finished turn"
                ) from None
            raise errors.ToolCallNotFound(
                f"tool call {call_id} not found in session {self.id}"
            ) from None

    def _finished_call_ids(self) -> set[str]:
        return {c for entry in self.finished for c in entry.call_ids}

    def calls_of(self, turn: Turn) -> list[ToolCall]:
        return [self.calls[c] for c in turn.call_ids]

    def unknown_calls(self, turn: Turn) -> list[ToolCall]:
        return [c for c in self.calls_of(turn) if c.state is CallState.UNKNOWN]

    def in_flight_calls(self, turn: Turn) -> list[ToolCall]:
        return [c for c in self.calls_of(turn) if c.in_flight]

    def pending_calls(self, turn: Turn) -> list[ToolCall]:
        return [c for c in self.calls_of(turn) if c.state is CallState.PENDING]

    def proposed_calls(self, turn: Turn) -> list[ToolCall]:
        return [c for c in self.calls_of(turn) if c.state is CallState.PROPOSED]

    # ----------------------------------------------------------------- commands

    def submit_turn(
        self,
        message: str,
        idempotency_key: str = "",
        *,
        enqueue: bool = False,
        deadline_at: datetime | None = None,
        traceparent: str = "",
        idempotency_window: int = IDEMPOTENCY_WINDOW,
    ) -> tuple[Turn | FinishedTurn, bool]:
        """Queue a user message as a new turn; returns (turn, created).

        A key the session still remembers returns the turn it created: the
        keys of its last ``idempotency_window`` keyed submissions (recorded
        with this one) and of every open turn; an older key is a new turn.
        ``enqueue``: while a turn is queued or running, queue this one behind
        it instead of refusing it (an interrupted turn still refuses it).
        ``deadline_at``: when the runtime cancels the turn (None: never).
        ``traceparent``: the submitter's W3C trace context, which the turn's
        span joins wherever it runs ('' : none; not stored then).
        """
        if idempotency_key and idempotency_key in self.idempotency_keys:
            turn_id = self.idempotency_keys[idempotency_key]
            if self.idempotency_digests.get(idempotency_key) != message_digest(message):
                raise errors.IdempotencyKeyReused(
                    "this idempotency key was used for a different message"
                )
            for turn in self.turns:
                if turn.turn_id == turn_id:
                    return turn, False
            return self.finished_turn(turn_id) or self.turn(turn_id), False
        check_message(message)
        check_storable((message, idempotency_key), "the message")
        if idempotency_window < 1:
            raise errors.InvalidInput("the idempotency window must be at least 1")
        self._require_open()
        if enqueue:
            self._require_no_unresolved_turn()
            if len([t for t in self.turns if t.state.is_open]) > MAX_QUEUED_TURNS:
                raise errors.QueueFull(
                    f"session {self.id} already holds {MAX_QUEUED_TURNS} queued follow-ups"
                )
        else:
            self._require_no_open_turn()
        self.trigger_event(
            self.TurnSubmitted,
            turn_id=str(uuid4()),
            message=message,
            idempotency_key=idempotency_key,
            deadline_at=deadline_at,
            idempotency_window=idempotency_window,
            **({"traceparent": traceparent} if traceparent else {}),
        )
        return self.turns[-1], True

    def claim_turn(self, turn_id: str, worker_id: str) -> int:
        """Take ownership of a queued turn, or of a running one whose owner is gone."""
        turn = self.turn(turn_id)
        if turn.state not in (TurnState.QUEUED, TurnState.RUNNING):
            raise errors.InvalidTransition(f"turn {turn_id} is {turn.state}, it cannot be claimed")
        if turn is not self.open_turn:
            raise errors.InvalidTransition(f"turn {turn_id} is queued behind an earlier turn")
        self.trigger_event(
            self.TurnClaimed, turn_id=turn_id, worker_id=worker_id, claim=turn.claim + 1
        )
        return turn.claim  # the new claim, now recorded

    def record_model_reply(
        self,
        turn_id: str,
        claim: int,
        text: str,
        tool_calls: Sequence[dict[str, Any]],
        usage: dict[str, Any] | None = None,
    ) -> Step:
        """Record one reply of the model, with the tool calls it asks for."""
        turn = self._claimed(turn_id, claim)
        if any(not c.settled for c in self.calls_of(turn)):
            raise errors.InvalidTransition("the previous step still has unsettled tool calls")
        check_storable((text, list(tool_calls), usage), "the model's reply")
        seen: set[str] = set()
        finished = self._finished_call_ids() if tool_calls else set()
        for call in tool_calls:
            call_id = str(call.get("call_id", ""))
            if not call_id or call_id in self.calls or call_id in seen or call_id in finished:
                raise errors.DuplicateToolCall(f"tool call id {call_id!r} is empty or already used")
            if not isinstance(call.get("arguments"), dict):
                raise errors.InvalidInput(f"tool call {call_id} arguments must be an object")
            seen.add(call_id)
        calls = [
            {
                "call_id": str(c["call_id"]),
                "name": str(c.get("name", "")),
                "arguments": copy.deepcopy(c["arguments"]),
            }
            for c in tool_calls
        ]
        self.trigger_event(
            self.ModelReplied,
            turn_id=turn_id,
            step=len(turn.steps) + 1,
            text=text,
            tool_calls=calls,
            usage=dict(usage or {}),
        )
        return turn.steps[-1]

    def start_tool_call(
        self,
        turn_id: str,
        claim: int,
        call_id: str,
        worker_id: str,
        effect: Effect,
        pre_state: dict[str, Any] | None = None,
        owner: dict[str, Any] | None = None,
    ) -> int:
        """Record the intent to run a tool call, before it runs; returns the attempt.

        ``pre_state`` is what the tool's probe will need to settle the call if
        its owner dies mid-call (e.g. a file's size and inode); ``owner`` the
        identity of the process that runs it, so a probe never runs while it lives.
        """
        turn = self._claimed(turn_id, claim)
        call = self._call_of(turn, call_id)
        if turn.cancel_reason:
            # The cancel was acknowledged and recorded: no effect may start after it.
            raise errors.CancelPending(
                f"turn {turn_id} is being cancelled; tool call {call_id} does not start"
            )
        try:
            effect = Effect(effect)
        except ValueError:
            raise errors.InvalidInput(f"unknown effect class {effect!r}") from None
        if call.state is CallState.STARTED:
            effect = Effect(call.effect)  # a re-run keeps the class it first ran under
            # Only a safe tool may run again, or one a probe proved had no
            # effect, and only a bounded number of times.
            if not Effect(call.effect).safe_to_repeat and not probed_not_applied(call):
                raise errors.InvalidTransition(
                    f"tool call {call_id} is side-effecting and already started; it cannot re-run"
                )
            if call.attempt >= MAX_TOOL_ATTEMPTS:
                raise errors.InvalidTransition(f"tool call {call_id} has used all its attempts")
        elif call.state is not CallState.PENDING:
            raise errors.InvalidTransition(f"tool call {call_id} is {call.state}")
        check_storable((pre_state, owner), "the call's recorded pre-state")
        self.trigger_event(
            self.ToolCallStarted,
            turn_id=turn_id,
            call_id=call_id,
            attempt=call.attempt + 1,
            worker_id=worker_id,
            claim=claim,
            effect=str(effect),
            pre_state=dict(pre_state) if pre_state else None,
            owner=dict(owner) if owner else None,
        )
        return call.attempt  # the new attempt, now recorded

    def record_tool_process(
        self, turn_id: str, claim: int, call_id: str, attempt: int, process: ToolProcess
    ) -> None:
        """Record the OS process a running tool call spawned, before it does its work."""
        self._running_attempt(turn_id, claim, call_id, attempt)
        if not _is_count(process.pid) or process.pid <= 0:
            raise errors.InvalidInput(f"a tool process needs a positive pid, not {process.pid!r}")
        if not _is_count(process.started_at) or process.started_at < 0:
            raise errors.InvalidInput("a tool process needs its start time")
        self.trigger_event(
            self.ToolCallProcessStarted,
            turn_id=turn_id,
            call_id=call_id,
            attempt=attempt,
            pid=process.pid,
            process_started_at=process.started_at,
            host=process.host,
            boot_id=process.boot_id,
            # Only for an MCP server: a command's event keeps its earlier shape.
            **({"server": process.server} if process.server else {}),
        )

    def record_tool_succeeded(
        self, turn_id: str, claim: int, call_id: str, attempt: int, result: Any
    ) -> None:
        """Record the result a tool returned."""
        self._running_attempt(turn_id, claim, call_id, attempt)
        check_storable(result, "the tool's result")
        self.trigger_event(
            self.ToolCallSucceeded, turn_id=turn_id, call_id=call_id, attempt=attempt, result=result
        )

    def record_tool_failed(
        self, turn_id: str, claim: int, call_id: str, attempt: int, error: str
    ) -> None:
        """Record the error a tool raised."""
        self._running_attempt(turn_id, claim, call_id, attempt)
        check_storable(error, "the tool's error")
        self.trigger_event(
            self.ToolCallFailed, turn_id=turn_id, call_id=call_id, attempt=attempt, error=error
        )

    def complete_turn(self, turn_id: str, claim: int, reply: str) -> None:
        """Record the final reply of a turn."""
        turn = self._claimed(turn_id, claim)
        if any(not c.settled for c in self.calls_of(turn)):
            raise errors.InvalidTransition("a turn with unsettled tool calls cannot complete")
        self.trigger_event(self.TurnCompleted, turn_id=turn_id, reply=reply)

    def fail_turn(self, turn_id: str, claim: int, error: str) -> None:
        """Record that a turn ended in a known failure (provider error, step limit, bad tool)."""
        turn = self._claimed(turn_id, claim)
        if any(
            c.in_flight and not Effect(c.effect).safe_to_repeat and not probed_not_applied(c)
            for c in self.calls_of(turn)
        ):
            raise errors.InvalidTransition(
                "a turn with a side-effecting call in flight cannot be marked failed"
            )
        # The reason may quote a provider's or a tool's text: keep it storable.
        self.trigger_event(self.TurnFailed, turn_id=turn_id, error=storable_text(error))

    def interrupt_turn(self, turn_id: str, previous_worker: str, by: str = "") -> list[str]:
        """Record that the owner died inside unsafe tool calls: their outcome is unknown.

        ``by`` names the process whose recovery decided it (a worker id).
        """
        turn = self.turn(turn_id)
        if turn.state is not TurnState.RUNNING:
            raise errors.InvalidTransition(f"turn {turn_id} is {turn.state}, not running")
        unsafe = [
            c.call_id for c in self.in_flight_calls(turn) if not Effect(c.effect).safe_to_repeat
        ]
        if not unsafe:
            raise errors.InvalidTransition(f"turn {turn_id} has no unsafe call in flight")
        self.trigger_event(
            self.TurnInterrupted,
            turn_id=turn_id,
            call_ids=unsafe,
            previous_worker=previous_worker,
            interrupted_by=by,
        )
        return unsafe

    def resolve_tool_call(
        self, call_id: str, outcome: str, result: Any, note: str, actor: str
    ) -> Turn:
        """Record the real outcome of an unknown call, as an operator found it."""
        call = self.call(call_id)
        if outcome not in RESOLVE_OUTCOMES:
            raise errors.InvalidOperatorAction("outcome must be 'succeeded' or 'failed'")
        actor = require_text(actor, "actor", errors.InvalidOperatorAction)
        note = require_text(note, "note", errors.InvalidOperatorAction)
        check_storable((result, note, actor), "the resolution")
        if call.state is not CallState.UNKNOWN:
            raise errors.InvalidTransition(
                f"tool call {call_id} is {call.state}; only an unknown call can be resolved"
            )
        self.trigger_event(
            self.ToolCallResolved,
            turn_id=call.turn_id,
            call_id=call_id,
            outcome=outcome,
            result=result,
            note=note,
            actor=actor,
        )
        return self.turn(call.turn_id)

    def abandon_turn(self, turn_id: str, reason: str, actor: str) -> list[str]:
        """Give up an interrupted turn; its unknown calls stay unknown forever."""
        turn = self.turn(turn_id)
        actor = require_text(actor, "actor", errors.InvalidOperatorAction)
        reason = require_text(reason, "reason", errors.InvalidOperatorAction)
        check_storable((reason, actor), "the reason")
        if turn.state is not TurnState.INTERRUPTED:
            raise errors.InvalidTransition(
                f"turn {turn_id} is {turn.state}; only an interrupted turn can be abandoned"
            )
        unknown = [c.call_id for c in self.unknown_calls(turn)]
        self.trigger_event(
            self.TurnAbandoned, turn_id=turn_id, reason=reason, actor=actor, call_ids=unknown
        )
        return unknown

    # ---------------------------------------------------- cancel, deadlines, approval

    def cancel_turn(self, turn_id: str, reason: str, actor: str, force: bool = False) -> str:
        """An operator stops a turn; returns "cancelled" (done now) or "requested".

        A queued turn, or one waiting for approval, is cancelled at once: no
        one runs it. A running one gets a request its owner acts on at the
        next step boundary (``finish_cancel``); ``force`` also kills a
        side-effecting call in flight, whose outcome then becomes unknown.
        """
        actor = require_text(actor, "actor", errors.InvalidOperatorAction)
        reason = require_text(reason, "reason", errors.InvalidOperatorAction)
        check_storable((reason, actor), "the reason")
        state = self.turn_state(turn_id)
        if not state.is_open:
            raise errors.TurnFinished(f"turn {turn_id} is {state}; it cannot be cancelled")
        turn = self.turn(turn_id)
        if state is TurnState.INTERRUPTED:
            raise errors.InvalidTransition(
                f"turn {turn_id} is interrupted; abandon it or resolve its unknown calls"
            )
        if state in (TurnState.QUEUED, TurnState.AWAITING_APPROVAL):
            self._record_cancel(turn, reason, actor)
            return "cancelled"
        if turn.cancel_reason and (turn.cancel_force or not force):
            return "requested"  # asked already (a repeat, or no stronger than before)
        self.trigger_event(
            self.CancelRequested, turn_id=turn_id, reason=reason, actor=actor, force=bool(force)
        )
        return "requested"

    def finish_cancel(self, turn_id: str, now: datetime, claim: int | None = None) -> None:
        """Record that a turn stopped: an operator asked, or its deadline passed at ``now``.

        With ``claim``, the owner records it at a step boundary (fenced);
        without, the turn must be one no one runs (queued, awaiting approval).
        A side-effecting call still in flight forbids it: that call finishes
        first, or its outcome is unknown (the turn is interrupted instead).
        """
        if claim is not None:
            turn = self._claimed(turn_id, claim)
        else:
            turn = self.turn(turn_id)
            if turn.state not in (TurnState.QUEUED, TurnState.AWAITING_APPROVAL):
                raise errors.InvalidTransition(
                    f"turn {turn_id} is {turn.state}; its owner stops it"
                )
        reason = turn.cancel_due(now)
        if not reason:
            raise errors.InvalidTransition(f"turn {turn_id} has no cancel request or due deadline")
        if any(c.in_flight and not Effect(c.effect).safe_to_repeat for c in self.calls_of(turn)):
            raise errors.InvalidTransition(
                f"turn {turn_id} has a side-effecting call in flight; it cannot stop now"
            )
        actor = turn.cancel_actor if turn.cancel_reason else RUNTIME_ACTOR
        self._record_cancel(turn, reason, actor or RUNTIME_ACTOR)

    def _record_cancel(self, turn: Turn, reason: str, actor: str) -> None:
        # Every call that has no outcome yet is cancelled with the turn: never
        # started, proposed, or a safe call stopped in flight.
        stopped = [
            c.call_id
            for c in self.calls_of(turn)
            if c.state in (CallState.PENDING, CallState.PROPOSED, CallState.STARTED)
        ]
        self.trigger_event(
            self.TurnCancelled,
            turn_id=turn.turn_id,
            reason=reason,
            actor=actor,
            call_ids=stopped,
        )

    def propose_tool_call(self, turn_id: str, claim: int, call_id: str) -> None:
        """Record that a call needs an operator's approval before it may start.

        The turn then waits (``awaiting_approval``) with no owner: its worker lets go.
        """
        turn = self._claimed(turn_id, claim)
        call = self._call_of(turn, call_id)
        if call.state is not CallState.PENDING or call.approval == "approved":
            raise errors.InvalidTransition(f"tool call {call_id} is {call.state}; not proposable")
        self.trigger_event(self.ToolCallProposed, turn_id=turn_id, call_id=call_id)

    def approve_tool_call(
        self, call_id: str, actor: str, note: str = "", arguments: dict[str, Any] | None = None
    ) -> Turn:
        """An operator lets a proposed call start, optionally with edited arguments.

        Checking edited arguments against the tool's schema is the caller's
        part (the domain does not know tools); here they must be an object
        the record can hold.
        """
        call = self.proposed_call(call_id)
        actor = require_text(actor, "actor", errors.InvalidOperatorAction)
        if not isinstance(note, str):
            raise errors.InvalidOperatorAction("note must be text")
        if arguments is not None and not isinstance(arguments, dict):
            raise errors.InvalidOperatorAction("arguments must be an object")
        check_storable((note, actor, arguments), "the approval")
        self.trigger_event(
            self.ToolCallApproved,
            turn_id=call.turn_id,
            call_id=call_id,
            actor=actor,
            note=note,
            arguments=copy.deepcopy(arguments),
        )
        return self.turn(call.turn_id)

    def reject_tool_call(self, call_id: str, actor: str, reason: str) -> Turn:
        """An operator refuses a proposed call; the model is told, and the turn goes on."""
        call = self.proposed_call(call_id)
        actor = require_text(actor, "actor", errors.InvalidOperatorAction)
        reason = require_text(reason, "reason", errors.InvalidOperatorAction)
        check_storable((reason, actor), "the reason")
        self.trigger_event(
            self.ToolCallRejected, turn_id=call.turn_id, call_id=call_id, actor=actor, reason=reason
        )
        return self.turn(call.turn_id)

    def proposed_call(self, call_id: str) -> ToolCall:
        """The call waiting for an operator's decision; any other known call is refused
        with one code (``call_not_proposed``), whether its turn is open or finished."""
        try:
            call = self.call(call_id)
        except errors.InvalidTransition as exc:
            raise errors.CallNotProposed(exc.detail) from None
        if call.state is not CallState.PROPOSED:
            raise errors.CallNotProposed(
                f"tool call {call_id} is {call.state}; only a proposed call can be approved"
                " or rejected"
            )
        return call

    def compact_context(
        self, turn_id: str, claim: int, summary: str, turns: int, produced_by: dict[str, Any]
    ) -> None:
        """Record a summary of the session's first ``turns`` turns, before the next request.

        Only finished turns are summarised, whole, so a tool call is never
        separated from its result; and never while a call of the running turn
        is unanswered, so no call the model made is dropped.
        """
        turn = self._claimed(turn_id, claim)
        if any(not c.settled for c in self.calls_of(turn)):
            raise errors.InvalidTransition(
                "the context cannot be compacted while a tool call of the turn is unanswered"
            )
        if not self.compacted_turns < turns <= len(self.finished):
            raise errors.InvalidTransition(
                f"a summary must cover more finished turns than the last one "
                f"({self.compacted_turns}) and at most {len(self.finished)}, not {turns}"
            )
        check_summary(summary)
        check_storable(produced_by, "who produced the summary")
        first, last = self.finished[0], self.finished[turns - 1]
        self.trigger_event(
            self.ContextCompacted,
            turn_id=turn_id,
            summary=summary,
            turns=turns,
            first_turn_id=first.turn_id,
            last_turn_id=last.turn_id,
            through_version=last.last_version,
            replaces=int(self.compaction["version"]) if self.compaction else 0,
            produced_by=dict(produced_by),
        )

    def close(self, reason: str, actor: str) -> None:
        """Close the session: it takes no more turns."""
        self._require_open()
        self._require_no_open_turn()
        actor = require_text(actor, "actor", errors.InvalidOperatorAction)
        check_storable((reason, actor), "the reason")
        self.trigger_event(self.Closed, reason=reason, actor=actor)

    # ------------------------------------------------------------------ probes

    def record_probe(
        self,
        turn_id: str,
        claim: int,
        call_id: str,
        answer: ProbeAnswer,
        evidence: dict[str, Any],
        note: str,
        duration_seconds: float,
        prober: str,
    ) -> None:
        """Record one run of a tool's probe on a call whose owner died mid-call.

        Only under the current claim (the recovering process claims the turn
        first, which fences the dead owner), and only for an attempt in flight.
        """
        turn = self._claimed(turn_id, claim)
        call = self._call_of(turn, call_id)
        if call.state is not CallState.STARTED:
            raise errors.InvalidTransition(f"tool call {call_id} is {call.state}, not in flight")
        try:
            answer = ProbeAnswer(answer)
        except ValueError:
            raise errors.InvalidInput(f"unknown probe answer {answer!r}") from None
        if isinstance(duration_seconds, bool) or not isinstance(duration_seconds, int | float):
            raise errors.InvalidInput("a probe's duration must be a number of seconds")
        check_storable((dict(evidence), note, prober), "the probe's evidence")
        self.trigger_event(
            self.ToolCallProbed,
            turn_id=turn_id,
            call_id=call_id,
            attempt=call.attempt,
            answer=str(answer),
            evidence=dict(evidence),
            note=storable_text(note),
            duration_seconds=round(max(0.0, float(duration_seconds)), 6),
            prober=prober,
        )

    def resolve_by_probe(self, turn_id: str, claim: int, call_id: str, result: Any = None) -> None:
        """Settle an in-flight call as its latest probe answered: applied or not_applied.

        Applied: succeeded with the probe's ``result``. Not applied: failed,
        "not applied (probe)". Recorded as ToolCallResolved by ``probe:<tool>``,
        with the probe's evidence; any other answer is refused.
        """
        turn = self._claimed(turn_id, claim)
        call = self._call_of(turn, call_id)
        probe = call.last_probe if call.state is CallState.STARTED else None
        answer = probe["answer"] if probe else ""
        if answer not in (ProbeAnswer.APPLIED, ProbeAnswer.NOT_APPLIED):
            raise errors.InvalidTransition(
                f"tool call {call_id} has no probe answer that settles it"
                f" (last: {answer or 'none'})"
            )
        applied = answer == ProbeAnswer.APPLIED
        if applied:
            check_storable(result, "the probe's result")
        assert probe is not None
        self.trigger_event(
            self.ToolCallResolved,
            turn_id=turn_id,
            call_id=call_id,
            outcome="succeeded" if applied else "failed",
            result=result if applied else NOT_APPLIED_ERROR,
            note=probe["note"] or (f"{answer} (probe)"),
            actor=f"probe:{call.name}",
            evidence=dict(probe["evidence"]),
        )

    # ------------------------------------------------------------------ checks

    def _require_open(self) -> None:
        if self.closed:
            raise errors.SessionClosed(f"session {self.id} is closed")

    def _require_no_open_turn(self) -> None:
        self._require_no_unresolved_turn()
        turn = self.open_turn
        if turn is not None:
            raise errors.TurnInProgress(
                f"turn {turn.turn_id} is still {turn.state}", turn_id=turn.turn_id
            )

    def _require_no_unresolved_turn(self) -> None:
        turn = self.open_turn
        if turn is not None and turn.state is TurnState.INTERRUPTED:
            calls = [describe_unknown_call(c) for c in self.unknown_calls(turn)]
            names = ", ".join(f"{c['call_id']} ({c['name']})" for c in calls)
            raise errors.UnresolvedTurn(
                f"turn {turn.turn_id} is interrupted with tool calls of unknown outcome: "
                f"{names}; abandon the turn or resolve each call first",
                turn_id=turn.turn_id,
                unknown_calls=calls,
            )

    def _claimed(self, turn_id: str, claim: int) -> Turn:
        """The turn, if ``claim`` is its current claim and it is running (fencing)."""
        turn = self.turn(turn_id)
        if turn.state is not TurnState.RUNNING:
            raise errors.InvalidTransition(f"turn {turn_id} is {turn.state}, not running")
        if turn.claim != claim or not turn.worker_id:
            raise errors.StaleClaim(
                f"claim {claim} on turn {turn_id} is not current (current: {turn.claim})"
            )
        return turn

    def _call_of(self, turn: Turn, call_id: str) -> ToolCall:
        call = self.call(call_id)
        if call.turn_id != turn.turn_id:
            raise errors.ToolCallNotFound(f"tool call {call_id} is not part of turn {turn.turn_id}")
        return call

    def _running_attempt(self, turn_id: str, claim: int, call_id: str, attempt: int) -> ToolCall:
        call = self._call_of(self._claimed(turn_id, claim), call_id)
        # The attempt must be ours: started under this claim, so a new owner can
        # never record a result for an attempt its predecessor started.
        if call.state is not CallState.STARTED or call.attempt != attempt or call.claim != claim:
            raise errors.InvalidTransition(
                f"tool call {call_id} attempt {attempt} is not the one in flight"
            )
        return call

    # ------------------------------------------------------------------ events
    # The events are defined in domain/events.py (stored topics unchanged); the
    # aggregate names them as before, so ``Session.TurnSubmitted`` still works.
    TurnSubmitted: TypeAlias = events.TurnSubmitted
    TurnClaimed: TypeAlias = events.TurnClaimed
    ModelReplied: TypeAlias = events.ModelReplied
    ToolCallStarted: TypeAlias = events.ToolCallStarted
    ToolCallProcessStarted: TypeAlias = events.ToolCallProcessStarted
    ToolCallSucceeded: TypeAlias = events.ToolCallSucceeded
    ToolCallFailed: TypeAlias = events.ToolCallFailed
    TurnCompleted: TypeAlias = events.TurnCompleted
    TurnFailed: TypeAlias = events.TurnFailed
    TurnInterrupted: TypeAlias = events.TurnInterrupted
    ToolCallResolved: TypeAlias = events.ToolCallResolved
    TurnAbandoned: TypeAlias = events.TurnAbandoned
    CancelRequested: TypeAlias = events.CancelRequested
    TurnCancelled: TypeAlias = events.TurnCancelled
    ToolCallProposed: TypeAlias = events.ToolCallProposed
    ToolCallApproved: TypeAlias = events.ToolCallApproved
    ToolCallRejected: TypeAlias = events.ToolCallRejected
    ContextCompacted: TypeAlias = events.ContextCompacted
    Closed: TypeAlias = events.Closed
    ToolCallProbed: TypeAlias = events.ToolCallProbed


# Snapshots are not aggregate events, so the library does not register their
# explicit topic by itself; a process that only reads must resolve it too.
# Version-1 snapshots (every turn in full) decode with the same class; the
# state inside them is upcast by ``Session.upcast_v1_v2`` as it loads.
register_topic(Session.Snapshot.TOPIC, Session.Snapshot)
register_topic("turnlog.session.Snapshot.v1", Session.Snapshot)


def replay_turns(session_id: UUID, events: Iterable[Any]) -> Session:
    """A retaining session holding only the turns whose events are given (a version range).

    Used to rebuild finished turns for a request or a read: the events are
    applied as they were recorded, without the session's settings.
    """
    scratch = Session.__new__(Session)
    scratch.__dict__.update(_id=session_id, _version=0, _pending_events=[])
    scratch._init_turn_state()
    retaining(scratch)
    known: set[str] = set()
    for event in events:
        if isinstance(event, Session.Forked):
            event.inherit(scratch)  # the turns a fork carries from its source
            continue
        if isinstance(event, Session.Started):
            continue
        turn_id = getattr(event, "turn_id", None)
        if isinstance(event, Session.TurnSubmitted):
            known.add(event.turn_id)
        elif turn_id is not None and turn_id not in known:
            # A turn submitted before the range (follow-ups interleave their
            # events with the turn ahead of them): not one the range holds.
            continue
        event.apply(scratch)
    return scratch


def summarised_dropped(session: Session, earlier: Session) -> Session:
    """``earlier`` without the turns a fork inherited that a summary now covers.

    A fork's inherited turns all sit at its first version, so a range read
    that includes it rebuilds every one of them, even those a summary written
    on the fork has since replaced; the turns of a session's own stream drop
    out of the range by their versions instead. Other sessions: ``earlier``.
    """
    if session.forked_from is None or not session.compacted_turns:
        return earlier
    summarised = {e.turn_id for e in session.finished[: session.compacted_turns]}
    if not any(t.turn_id in summarised for t in earlier.turns):
        return earlier
    kept = Session.__new__(Session)
    kept.__dict__.update(earlier.__dict__)
    kept.turns = [t for t in earlier.turns if t.turn_id not in summarised]
    return kept


def retaining(session: Session) -> Session:
    """Mark a session object, being rebuilt from its first event, to keep every turn."""
    session.__dict__["_retain_finished"] = True
    return session


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_message(message: str) -> None:
    """Refuse an empty message or one over the size limit."""
    if not isinstance(message, str) or not message.strip():
        raise errors.InvalidMessage("message must not be empty")
    size = len(message.encode("utf-8", "surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise errors.InvalidMessage(
            f"message is {size} bytes; the limit is {MAX_MESSAGE_BYTES} bytes"
        )


def check_summary(summary: str) -> None:
    """Refuse an empty context summary or one over the message size limit."""
    if not isinstance(summary, str) or not summary.strip():
        raise errors.InvalidSummary("the context summary is empty")
    size = len(summary.encode("utf-8", "surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise errors.InvalidSummary(
            f"the context summary is {size} bytes; the limit is {MAX_MESSAGE_BYTES} bytes"
        )
    check_storable(summary, "the context summary")


def check_context_policy(max_turns: int | None, max_chars: int | None) -> None:
    """Refuse a context-window policy that cannot work (None: that limit is not set)."""
    if max_turns is not None and (not _is_count(max_turns) or max_turns < 1):
        raise errors.InvalidContextPolicy(
            f"context max_turns must be a whole number of at least 1, not {max_turns!r}"
        )
    if max_chars is not None and (not _is_count(max_chars) or max_chars < MIN_CONTEXT_CHARS):
        raise errors.InvalidContextPolicy(
            f"context max_chars must be a whole number of at least {MIN_CONTEXT_CHARS},"
            f" not {max_chars!r}"
        )


def check_approval_policy(policy: str) -> None:
    """Refuse an approval policy other than none, side_effecting, all."""
    if policy not in APPROVAL_POLICIES:
        raise errors.InvalidApprovalPolicy(
            f"approval_policy must be one of {', '.join(APPROVAL_POLICIES)}, not {policy!r}"
        )


def check_deadline(seconds: Any) -> float:
    """A turn's deadline in seconds, refused unless positive, finite and within the limit."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise errors.InvalidDeadline("deadline_seconds must be a number of seconds")
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_DEADLINE_SECONDS:
        raise errors.InvalidDeadline(
            f"deadline_seconds must be more than 0 and at most {MAX_DEADLINE_SECONDS:g},"
            f" not {seconds!r}"
        )
    return float(seconds)


def deadline_after(submitted: datetime, seconds: float | None) -> datetime | None:
    """The absolute deadline of a turn submitted at ``submitted`` (None: no deadline)."""
    return None if not seconds else submitted + timedelta(seconds=check_deadline(seconds))


def describe_unknown_call(call: ToolCall) -> dict[str, Any]:
    """What an operator needs to see about a call whose outcome is unknown.

    With the answer and note of the probe that could not tell, when one was asked.
    """
    described: dict[str, Any] = {
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "attempt": call.attempt,
        "worker_id": call.worker_id,
        "started_at": call.started_at.isoformat() if call.started_at else None,
    }
    probed = call.last_probe
    if probed is not None and probed.get("answer") == ProbeAnswer.UNKNOWN:
        described["probe"] = {"answer": str(probed["answer"]), "note": str(probed.get("note", ""))}
    return described
