"""The owner's login under attack (issue 12): counted before the hash, shared by workers, backed off per
address without locking the owner out of a good address, and a logout that ends every copy of the session.

"Workers" are two app instances on one database, as gunicorn's processes are.
"""

from __future__ import annotations

import logging
import threading

import pytest
from werkzeug.security import generate_password_hash

from example_shop import create_app, login_guard
from example_shop.extensions import limiter
from tests.conftest import Databases
from tests.processes import free_port
from tests.shop.conftest import (
    OWNER_PASSWORD,
    SHOP_URL,
    ShopHarness,
    Shopper,
    csrf_token,
    make_harness,
    shop_config,
)

# Counters and session versions in the database, locked rows, two workers on one database.
pytestmark = pytest.mark.backends

ATTACKER = {"REMOTE_ADDR": "203.0.113.66"}
OWNER_ADDRESS = {"REMOTE_ADDR": "198.51.100.10"}


class Clock:
    def __init__(self) -> None:
        self.moment = 1_800_000_000.0

    def __call__(self) -> float:
        return self.moment


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(login_guard, "now", fake)
    return fake


def browser(shop: ShopHarness, address: dict[str, str]) -> Shopper:
    client = shop.app.test_client()
    client.environ_base.update(address)
    return Shopper(client)


def test_concurrent_guesses_are_counted_before_the_hash_so_only_the_free_ones_are_checked(
    shop: ShopHarness, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from example_shop import auth

    checked: list[str] = []
    real_check = auth.check_password

    def counting_check(password: str) -> bool:
        checked.append(password)
        return real_check(password)

    monkeypatch.setattr(auth, "check_password", counting_check)
    attackers = [browser(shop, ATTACKER) for _ in range(20)]
    forms = [(a, csrf_token(a.get("/admin/login").get_data(as_text=True))) for a in attackers]
    start = threading.Barrier(len(forms))
    answers: list[int] = []

    def guess(attacker: Shopper, token: str) -> None:
        start.wait()
        answers.append(attacker.post("/admin/login", {"csrf_token": token, "password": "guess"}).status_code)

    threads = [threading.Thread(target=guess, args=form) for form in forms]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(checked) == login_guard.FREE_ATTEMPTS
    assert sorted(answers) == [400] * login_guard.FREE_ATTEMPTS + [429] * (20 - login_guard.FREE_ATTEMPTS)


def test_the_backoff_doubles_per_failure_and_is_shared_by_every_worker(
    databases: Databases, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    one = make_harness(databases, monkeypatch)
    other_worker = create_app(shop_config(databases.url("shop")))
    workers = [browser(one, ATTACKER), Shopper(other_worker.test_client())]
    workers[1].client.environ_base.update(ATTACKER)

    for attempt in range(login_guard.FREE_ATTEMPTS):
        assert workers[attempt % 2].log_in("wrong").status_code == 400
    waits = []
    for _ in range(3):
        refused = workers[1].log_in(OWNER_PASSWORD)  # even the right password waits
        assert refused.status_code == 429
        waits.append(int(refused.headers["Retry-After"]))
        clock.moment += waits[-1]
        assert workers[0].log_in("wrong").status_code == 400  # allowed again, and wrong: a longer wait
    assert waits[1] >= 2 * (waits[0] - 1) and waits[2] >= 2 * (waits[1] - 1), waits
    clock.moment += 10_000
    assert workers[1].log_in().status_code == 303


def test_an_attacker_cannot_lock_the_owner_out_of_a_good_address(shop: ShopHarness, clock: Clock) -> None:
    owner = browser(shop, OWNER_ADDRESS)
    assert owner.log_in().status_code == 303  # the owner's address is good from now on
    assert owner.post(
        "/admin/logout", {"csrf_token": csrf_token(owner.get("/admin/").get_data(as_text=True))}
    )

    # A botnet: many addresses, a few guesses each, until the account backs off unknown addresses too.
    for index in range(login_guard.ACCOUNT_FREE_ATTEMPTS + 5):
        bot = browser(shop, {"REMOTE_ADDR": f"203.0.113.{index % 250}"})
        bot.log_in("guess")
    stranger = browser(shop, {"REMOTE_ADDR": "192.0.2.200"})
    assert stranger.log_in(OWNER_PASSWORD).status_code == 429  # unknown addresses wait

    assert owner.log_in().status_code == 303  # the owner's good address does not


def test_logout_ends_every_copy_of_the_session(shop: ShopHarness) -> None:
    owner = browser(shop, OWNER_ADDRESS)
    assert owner.log_in().status_code == 303
    cookie = owner.client.get_cookie("stoep_session", domain="shop.example")
    assert cookie is not None
    thief = shop.shopper()
    thief.client.set_cookie(cookie.key, cookie.value, domain=cookie.domain)
    assert thief.get("/admin/").status_code == 200  # a copied cookie works while the session lives

    token = csrf_token(owner.get("/admin/").get_data(as_text=True))
    assert owner.post("/admin/logout", {"csrf_token": token}).status_code == 303

    assert thief.get("/admin/").status_code == 302  # the copy is over too
    assert thief.get("/gateway/admin/").status_code == 302


def test_a_new_password_ends_the_sessions_made_with_the_old_one(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop = make_harness(databases, monkeypatch)
    owner = browser(shop, OWNER_ADDRESS)
    assert owner.log_in().status_code == 303
    cookie = owner.client.get_cookie("stoep_session", domain="shop.example")
    assert cookie is not None

    changed = create_app(
        shop_config(
            databases.url("shop"),
            SHOP_ADMIN_PASSWORD_HASH=generate_password_hash("a new password", method="pbkdf2:sha256:1000"),
        )
    )
    after = changed.test_client()
    after.set_cookie(cookie.key, cookie.value, domain=cookie.domain)
    assert after.get(SHOP_URL + "/admin/").status_code == 302


def test_the_login_form_has_a_per_client_rate_limit_shared_by_every_worker(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flask-Limiter on the login form, its counters in the database (``flask-gateway-db://``)."""
    limit = "3 per minute"  # below the wrong-password allowance
    one = make_harness(databases, monkeypatch, SHOP_LOGIN_RATE_LIMIT=limit)
    two = create_app(shop_config(databases.url("shop"), SHOP_LOGIN_RATE_LIMIT=limit))
    workers = [browser(one, ATTACKER), Shopper(two.test_client())]
    workers[1].client.environ_base.update(ATTACKER)
    pages = []
    for index in range(5):  # alternating workers: the counter is in the database, not in a process
        answer = workers[index % 2].log_in("wrong")
        pages.append((answer.status_code, "Too many attempts" in answer.get_data(as_text=True)))
    assert pages == [(400, False)] * 3 + [(429, True)] * 2
    assert browser(one, OWNER_ADDRESS).log_in().status_code == 303  # another address is not limited


def test_an_owner_session_is_valid_in_every_worker_with_a_plain_development_password(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker hashes a plain SHOP_ADMIN_PASSWORD with a salt of its own: the session must not depend
    on that hash, or the owner is logged out whenever the next request meets another worker."""
    password = "a development password"
    one = make_harness(databases, monkeypatch, SHOP_ADMIN_PASSWORD_HASH=None, SHOP_ADMIN_PASSWORD=password)
    other_worker = create_app(
        shop_config(databases.url("shop"), SHOP_ADMIN_PASSWORD_HASH=None, SHOP_ADMIN_PASSWORD=password)
    )
    owner = browser(one, OWNER_ADDRESS)
    assert owner.log_in("a development password").status_code == 303
    cookie = owner.client.get_cookie("stoep_session", domain="shop.example")
    assert cookie is not None
    elsewhere = other_worker.test_client()
    elsewhere.set_cookie(cookie.key, cookie.value, domain=cookie.domain)
    assert elsewhere.get(SHOP_URL + "/admin/").status_code == 200


def test_a_login_limit_on_redis_that_is_down_falls_back_to_memory_with_one_line(
    databases: Databases, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``SHOP_RATELIMIT_STORAGE_URI`` on a Redis that does not answer: the login still works and is still
    limited (per process, in memory), and the log has one WARNING, not a traceback per attempt."""
    pytest.importorskip("redis")
    down = f"redis://127.0.0.1:{free_port()}/0"
    shop = make_harness(
        databases, monkeypatch, SHOP_LOGIN_RATE_LIMIT="3 per minute", RATELIMIT_STORAGE_URI=down
    )
    caplog.set_level(logging.INFO)
    # Flask-Limiter keeps "the storage is dead" on its one Limiter object, across the apps of this process.
    monkeypatch.setattr(limiter, "_storage_dead", False)
    attacker = browser(shop, ATTACKER)
    pages = [attacker.log_in("wrong").status_code for _ in range(5)]
    assert pages == [400] * 3 + [429] * 2  # limited all the same
    assert browser(shop, OWNER_ADDRESS).log_in().status_code == 303
    limiter_lines = [
        r for r in caplog.records if r.name.startswith("flask-limiter") and r.levelno >= logging.WARNING
    ]
    assert [r.levelno for r in limiter_lines] == [logging.WARNING], [r.getMessage() for r in limiter_lines]
    assert "falling back to in-memory storage" in limiter_lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
