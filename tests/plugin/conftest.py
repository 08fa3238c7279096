"""A small shop for the plugin's own tests: what a shop developer has, found by the plugin as ``app``.

An order table, a Pay view calling ``start_checkout``, a ``payment_confirmed`` receiver that ships the
order (connected for this app only, disconnected at teardown), on SQLite in ``tmp_path``. pytester,
which runs docs/testing.md's example in a pytest of its own, is enabled by tests/conftest.py:
``pytest_plugins`` may only be declared in the root conftest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_gateway import (
    Customer,
    Gateway,
    GatewayCheckout,
    OrderDraft,
    OrderLine,
    payment_confirmed,
    start_checkout,
)
from flask_gateway.state import get_state


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "plugin_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reference: Mapped[str] = mapped_column(String(40), unique=True)
    total_cents: Mapped[int] = mapped_column(Integer)
    shipments: Mapped[int] = mapped_column(Integer, default=0)


_RECEIVER = "plugin_test_fulfil"


def make_shop(database_uri: str, **config: Any) -> Flask:
    """The shop on ``database_uri`` (tables created), configured with ``config`` over the defaults."""
    app = Flask("plugin_test_shop")
    app.config.update(
        TESTING=True,
        SECRET_KEY="plugin-test-secret",
        SQLALCHEMY_DATABASE_URI=database_uri,
        GATEWAY_PUBLIC_URL="https://shop.example",
        GATEWAY_ORDER_ENDPOINT="order_page",
    )
    app.config.update(config)
    db.init_app(app)
    Gateway(app, db=db)

    @app.get("/orders/<reference>")
    def order_page(reference: str) -> dict[str, Any]:
        order = db.one_or_404(db.select(Order).filter_by(reference=reference))
        return {"reference": order.reference, "shipments": order.shipments}

    @app.post("/orders/<reference>/pay")
    def pay(reference: str) -> Any:
        order = db.one_or_404(db.select(Order).filter_by(reference=reference))
        line = OrderLine(name="Enamel kettle", sku="K-1", quantity=1, unit_price_cents=order.total_cents)
        customer = Customer(first_name="Thandi", last_name="Mokoena", email="thandi@example.com")
        return start_checkout(OrderDraft(reference=order.reference, lines=(line,), customer=customer))

    def fulfil(sender: Flask, checkout: GatewayCheckout, **extra: Any) -> None:
        order = db.session.execute(
            db.select(Order).filter_by(reference=checkout.order_reference)
        ).scalar_one()
        order.shipments += 1
        db.session.commit()

    payment_confirmed.connect(fulfil, sender=app, weak=False)
    app.extensions[_RECEIVER] = fulfil
    with app.app_context():
        db.create_all()
    return app


def close_shop(app: Flask) -> None:
    payment_confirmed.disconnect(app.extensions[_RECEIVER])  # from every sender: none is left behind
    with app.app_context():
        get_state(app).dispose()
        db.engine.dispose()


def place_order(app: Flask, reference: str = "R-1", total_cents: int = 49900) -> None:
    with app.app_context():
        db.session.add(Order(reference=reference, total_cents=total_cents))
        db.session.commit()


def shipments(app: Flask, reference: str = "R-1") -> int:
    with app.app_context():
        count: int = db.session.execute(
            db.select(Order.shipments).filter_by(reference=reference)
        ).scalar_one()
        return count


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    """The shop (the plugin's ``gateway_app``), on a SQLite file."""
    shop = make_shop(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    yield shop
    close_shop(shop)
