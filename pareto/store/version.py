"""The store's data version: a counter that every writing transaction of pareto's sessions bumps.

``pareto serve`` keeps computed answers and reads this one number before each: an answer is served from
its cache only while the counter has not moved. A counter, not the highest row ids: a flag that flips
(a noisy night's measurements withdrawn, a confirmation preferred) adds no row, and on PostgreSQL ids
follow the sequence, not the commit order, so a row committed late can carry a lower id than one
already seen.

The bump is the last statement of the transaction (``before_commit``): the counter's row is locked
only from there to the commit, after every other lock the transaction takes, so it adds no deadlock.
Only pareto's own sessions (``ParetoSession``, what ``session_scope`` opens) bump it; Optuna's writes
change none of pareto's answers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import ORMExecuteState, Session, SessionTransaction

from pareto.store.models import DataVersion

_WROTE = "pareto_wrote"


class ParetoSession(Session):
    """A session of pareto's store: a transaction that wrote anything bumps the data version."""


@event.listens_for(ParetoSession, "after_flush")
def _flushed(session: Session, flush_context: Any) -> None:
    session.info[_WROTE] = True


@event.listens_for(ParetoSession, "do_orm_execute")
def _executed(state: ORMExecuteState) -> None:
    if state.is_insert or state.is_update or state.is_delete:
        state.session.info[_WROTE] = True


def wrote(session: Session) -> bool:
    """Whether this transaction has written anything so far (and will bump the data version)."""
    return bool(session.info.get(_WROTE)) or bool(session.new or session.dirty or session.deleted)


def wrote_nothing(session: Session) -> None:
    """Say that the transaction's statements so far changed no row (an insert that did nothing on a
    conflict): unless something else writes, committing it leaves the data version where it was."""
    session.info.pop(_WROTE, None)


@event.listens_for(ParetoSession, "before_commit")
def _bump(session: Session) -> None:
    if session.in_nested_transaction():  # a savepoint released: the outer transaction bumps, once, last
        return
    if session.info.get(_WROTE) or session.new or session.dirty or session.deleted:
        session.flush()  # what is still pending is written before the counter moves
        bumped = session.execute(
            update(DataVersion).where(DataVersion.id == 1).values(version=DataVersion.version + 1),
            execution_options={"synchronize_session": False},
        )
        if not getattr(bumped, "rowcount", 1):  # a schema made by create_all: the counter's row is made here
            session.add(DataVersion(id=1, version=1))
            session.flush()


@event.listens_for(ParetoSession, "after_transaction_end")
def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost one (a savepoint rolled back leaves the writes before it)
        session.info.pop(_WROTE, None)


def data_version(engine: Engine) -> int:
    """The store's data version: it moves with every transaction that changed any of pareto's rows."""
    with engine.connect() as connection:
        return int(connection.execute(select(DataVersion.version).where(DataVersion.id == 1)).scalar() or 0)
