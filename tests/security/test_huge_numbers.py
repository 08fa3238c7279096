"""Huge page numbers and ids answer 4xx, never 500 (issue 12, point 6)."""

from __future__ import annotations

import pytest

from tests.security.conftest import ShopWorld

HUGE = "9" * 30


@pytest.mark.backends
@pytest.mark.parametrize(
    "path",
    [
        f"/gateway/admin/checkouts?page={HUGE}",
        f"/gateway/admin/checkouts?page={HUGE}&per_page={HUGE}",
        f"/gateway/admin/callbacks?page={HUGE}",
        f"/gateway/admin/checkouts/{HUGE}",
        "/gateway/admin/checkouts/2147483648",
        f"/admin/?page={HUGE}",
        f"/admin/?page=-{HUGE}",
    ],
)
def test_huge_numbers_in_admin_pages_never_answer_500(shop_world: ShopWorld, path: str) -> None:
    answer = shop_world.owner.get(path)
    assert answer.status_code in (200, 404), (path, answer.status_code)


@pytest.mark.backends
def test_huge_ids_in_admin_posts_and_the_emulator_never_answer_500(shop_world: ShopWorld) -> None:
    from tests.shop.conftest import csrf_token

    owner = shop_world.owner
    token = csrf_token(owner.get("/gateway/admin/checkouts").get_data(as_text=True))
    for action in ("refresh", "cancel", "refund"):
        answer = owner.post(f"/gateway/admin/checkouts/{HUGE}/{action}", {"csrf_token": token})
        assert answer.status_code == 404, action
    emulator = shop_world.harness.emulator
    assert emulator.control(f"dead-letters/{HUGE}/redeliver").status_code == 404
    assert emulator.control("dead-letters/2147483648/redeliver").status_code == 404


def test_json_nested_too_deep_in_a_callback_is_refused_not_a_500(shop_world: ShopWorld) -> None:
    from flask_gateway.core.signing import sign
    from flask_gateway.state import get_state

    with shop_world.app.app_context():
        state = get_state()
        key = state.box.decrypt(state.require_installation().signing_key_encrypted)
    raw = b"[" * 20_000 + b"]" * 20_000
    answer = shop_world.anonymous.client.post(
        "/gateway/callback",
        data=raw,
        headers={"Content-Type": "application/json", "X-Signature": sign(raw, key)},
        base_url="https://shop.example",
    )
    assert answer.status_code == 400
