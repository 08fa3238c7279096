"""The example shop as gunicorn serves it in the reliability tests, plus a durable signal counter.

``gunicorn tests.reliability.shop_wsgi:app``: the unchanged shop (``example_shop.create_app()``, configured by
the environment), and one receiver per extension signal that inserts a row into ``reliability_signals``
(on a connection of its own, committed at once). The tests count those rows: how often each signal was sent
for an order, across every worker process, never from log lines.

"""

from __future__ import annotations

import os
from typing import Any, Final

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, create_engine, func, insert

from example_shop import create_app
from flask_gateway import signals
from flask_gateway.core.sql import create_all_safely

metadata = MetaData()
#: One row per signal sent: which signal, for which order, from which process.
signal_rows: Final = Table(
    "reliability_signals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("signal", String(40), nullable=False),
    Column("reference", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", DateTime(timezone=True), server_default=func.now()),
)

_engine = create_engine(os.environ["SHOP_DATABASE_URL"], pool_size=2, max_overflow=10)
create_all_safely(_engine, metadata)  # every worker process, at once

app = create_app()


def _counter(name: str) -> Any:
    def receive(sender: object, checkout: Any, **extra: object) -> None:
        with _engine.begin() as connection:
            connection.execute(
                insert(signal_rows).values(signal=name, reference=checkout.order_reference, pid=os.getpid())
            )

    receive.__name__ = f"count_{name}"
    return receive


# Kept in a module global: blinker holds receivers weakly.
_receivers: Final = {
    name: _counter(name)
    for name in ("payment_confirmed", "checkout_cancelled", "checkout_expired", "refund_succeeded")
}
for _name, _receiver in _receivers.items():
    getattr(signals, _name).connect(_receiver)
