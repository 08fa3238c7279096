"""Redirects never leave the allow-list, whatever URL-ish input arrives (hypothesis).

Every place that redirects on input:

- the shop's login ``next`` (GET while logged in, and the POST after the password): only a path on the
  shop's own origin, else the admin's start page;
- the extension's return pages (``/gateway/return/<kind>?ref=...``): only the shop's order page, and a
  forged ``ref`` is a 400 page, never a redirect;
- the v1 success/fail URLs answer JSON with a ``return_url``: built from the configuration, never from
  the query string (hostile parameters are refused, 400/403);
- the emulator's hosted page sends the consumer to the merchant's registered confirm/cancel URL:
  exactly that URL, an absolute http(s) URL whose host a browser reads the same way as the gateway's
  firewall does (no backslash or control-character tricks), whatever the form posts.

"Same origin" is judged the way a browser resolves ``Location`` (WHATWG URL): tabs and newlines are
dropped, leading spaces and C0 controls trimmed, and ``\\`` counts as ``/`` in http(s) URLs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import quote, urlencode, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.urls import iri_to_uri

from tests.conftest import Databases
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway, create_body
from tests.security.conftest import ShopWorld, build_shop_world
from tests.shop.conftest import OWNER_PASSWORD, SHOP_URL, csrf_token

SHOP_HOST = urlsplit(SHOP_URL).hostname

HOSTILE = [
    "//evil.com",
    "///evil.com",
    "/\\evil.com",
    "\\\\evil.com",
    "/\\/evil.com",
    "https:evil.com",
    "https:/evil.com",
    "https://evil.com",
    "http://shop.example@evil.com",
    "https://shop.example.evil.com/",
    "//shop.example@evil.com",
    "javascript:alert(1)",
    "JaVaScRiPt:alert(1)",
    "java\tscript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "/\t/evil.com",
    "/\n/evil.com",
    "\t//evil.com",
    " //evil.com",
    "\x00//evil.com",
    "/%2F%2Fevil.com",
    "%2F%2Fevil.com",
    "/%5Cevil.com",
    "//evil%E3%80%82com",
    "//evil\u3002com",
    "//evil\uff0ecom",
    "/\u2044evil.com",
    "\uff0f\uff0fevil.com",
    "/admin/\r\nLocation: https://evil.com",
    "/admin/%0d%0aSet-Cookie:x=1",
    "//@evil.com",
    "/@evil.com",
    "@evil.com",
    "https://evil.com#https://shop.example/",
    "/../../evil.com",
    "..//evil.com",
    "?next=//evil.com",
    "#//evil.com",
]


def hostile_urls() -> st.SearchStrategy[str]:
    separators = ["/", "\\", "//", "\\\\", ":", "@", ".", "?", "#", "%2F", "%5C", "%0a"]
    words = ["evil.com", "shop.example", "https:", "javascript:", "admin"]
    oddities = ["\t", "\n", "\r", " ", "\x00", "\u3002", "\uff0e", "\uff0f"]
    pieces = st.sampled_from([*separators, *words, *oddities])
    built = st.lists(pieces, min_size=1, max_size=8).map("".join)
    encoded = st.sampled_from(HOSTILE).map(lambda url: quote(url, safe=""))
    return st.one_of(st.sampled_from(HOSTILE), built, encoded, st.text(max_size=30))


def browser_target(location: str, base: str) -> tuple[str, str | None]:
    """(scheme, host) a browser would go to for ``Location: location`` on page ``base``."""
    cleaned = re.sub(r"[\t\n\r]", "", location).strip(
        "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e"
        "\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a"
        "\x1b\x1c\x1d\x1e\x1f "
    )
    scheme_match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", cleaned)
    if scheme_match:
        scheme = scheme_match.group(1).lower()
        if scheme not in ("http", "https"):
            return scheme, None
        rest = cleaned[scheme_match.end() :].replace("\\", "/")
        if scheme != urlsplit(base).scheme or not rest.startswith("//"):
            # "https:evil.com" on an https page is relative; on another scheme it is absolute.
            if scheme == urlsplit(base).scheme and not rest.startswith("/"):
                return scheme, urlsplit(base).hostname
            rest = "//" + rest.lstrip("/")
        return scheme, urlsplit(f"{scheme}:{rest}").hostname
    normalised = cleaned.replace("\\", "/")
    if normalised.startswith("//"):
        return urlsplit(base).scheme, urlsplit("http:" + normalised).hostname
    return urlsplit(base).scheme, urlsplit(base).hostname


def test_the_browser_model_itself() -> None:
    base = SHOP_URL + "/admin/login"
    assert browser_target("/admin/", base) == ("https", SHOP_HOST)
    assert browser_target("/\\evil.com", base)[1] == "evil.com"
    assert browser_target("/\t/evil.com", base)[1] == "evil.com"
    assert browser_target("https:evil.com", base) == ("https", SHOP_HOST)
    assert browser_target("http:evil.com", base)[1] == "evil.com"
    assert browser_target("javascript:alert(1)", base) == ("javascript", None)
    assert browser_target(" //evil.com", base)[1] == "evil.com"


def assert_stays_home(location: str, base: str, what: str) -> None:
    scheme, host = browser_target(location, base)
    assert (scheme, host) == ("https", SHOP_HOST), (what, location)
    assert "\r" not in location and "\n" not in location, (what, location)


@pytest.fixture
def world(tmp_path, monkeypatch: pytest.MonkeyPatch) -> ShopWorld:
    return build_shop_world(Databases("sqlite", tmp_path, None), monkeypatch)


HYPOTHESIS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def test_login_next_never_leaves_the_shop(world: ShopWorld) -> None:
    owner = world.owner
    fresh = world.harness.shopper()
    page = csrf_token(fresh.get("/admin/login").get_data(as_text=True))

    @HYPOTHESIS
    @given(target=hostile_urls())
    def check(target: str) -> None:
        response = owner.client.get(f"{SHOP_URL}/admin/login", query_string={"next": target})
        assert response.status_code == 302
        assert_stays_home(response.headers["Location"], SHOP_URL + "/admin/login", f"GET next={target!r}")
        posted = fresh.post("/admin/login", {"csrf_token": page, "password": OWNER_PASSWORD, "next": target})
        assert posted.status_code == 303, posted.get_data(as_text=True)[:300]
        assert_stays_home(posted.headers["Location"], SHOP_URL + "/admin/login", f"POST next={target!r}")
        # The form field is filled from the query string: it must not smuggle the target either.
        form = fresh.client.get(f"{SHOP_URL}/admin/login", query_string={"next": target})
        if form.status_code == 200:
            match = re.search(r'name="next" type="hidden" value="([^"]*)"', form.get_data(as_text=True))
            assert match is not None
            assert_stays_home(match.group(1), SHOP_URL + "/admin/login", f"hidden next={target!r}")

    check()


def test_return_pages_and_v1_urls_never_redirect_off_the_shop(world: ShopWorld) -> None:
    client = world.anonymous.client

    @HYPOTHESIS
    @given(ref=hostile_urls(), kind=st.sampled_from(["confirm", "cancel"]), extra=hostile_urls())
    def check(ref: str, kind: str, extra: str) -> None:
        query = {"ref": ref, "next": extra, "return_url": extra, "redirect": extra}
        response = client.get(f"{SHOP_URL}/gateway/return/{kind}", query_string=query)
        assert response.status_code == 400, (ref, response.status_code)
        assert "Location" not in response.headers
        for outcome in ("success", "fail"):
            answer = client.get(
                f"{SHOP_URL}/gateway/v1/{outcome}",
                query_string={"ref": ref, "token": extra, "status": "SUCCESS", "return_url": extra},
            )
            assert answer.status_code in (400, 403, 404), (outcome, ref)
            assert "return_url" not in (answer.json or {})

    check()


def test_a_genuine_return_link_goes_to_the_order_page_whatever_else_is_in_the_query(world: ShopWorld) -> None:
    from flask_gateway.urls import return_url
    from tests.extension.inbound.inbound_support import path_of

    with world.app.test_request_context(base_url=SHOP_URL):
        path = path_of(return_url(world.values["checkout_id"], "confirm"))

    @HYPOTHESIS
    @given(extra=hostile_urls())
    def check(extra: str) -> None:
        query = urlencode({"next": extra, "return_url": extra, "url": extra})
        response = world.anonymous.client.get(f"{SHOP_URL}{path}&{query}")
        assert response.status_code == 303
        assert_stays_home(response.headers["Location"], SHOP_URL + "/gateway/return/confirm", extra)
        assert urlsplit(response.headers["Location"]).path.startswith("/orders/")

    check()


@pytest.fixture
def emulator(tmp_path) -> Iterator[Gateway]:
    app = make_emulator(f"sqlite:///{tmp_path / 'emulator.sqlite3'}")
    gateway = Gateway(app.test_client())
    gateway.install()
    yield gateway
    from flask_gateway.emulator.models import db

    with app.app_context():
        db.engine.dispose()


def test_the_hosted_page_sends_the_consumer_only_to_the_registered_url(emulator: Gateway) -> None:
    counter = iter(range(10**6))

    @HYPOTHESIS
    @given(target=hostile_urls(), host=st.sampled_from(["shop.example", "localhost", "127.0.0.1"]))
    def check(target: str, host: str) -> None:
        url = f"https://{host}{target}" if target.startswith(("/", "\\", "@")) else target
        n = next(counter)
        body = create_body(request_id=f"r-{n}", merchantOrderReference=f"o-{n}", confirmRedirectUrl=url)
        created = emulator.signed("/v2/create", body)
        if created.status_code != 200:
            assert created.status_code in (400, 403), (url, created.get_data(as_text=True))
            return
        token = created.json["checkoutToken"]
        page = emulator.client.get(f"/api/v2/app/checkout/{token}")
        token_field = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True))
        assert token_field is not None
        paid = emulator.client.post(
            f"/api/v2/app/checkout/{token}/pay",
            data={
                "csrf_token": token_field.group(1),
                "redirectUrl": "https://evil.com",
                "next": "//evil.com",
            },
            query_string={"next": "//evil.com"},
        )
        assert paid.status_code == 303
        location = paid.headers["Location"]
        assert location == iri_to_uri(url), (url, location)  # exactly the registered URL, as a URI
        scheme, browser_host = browser_target(location, "https://emulator.test/")
        assert scheme in ("http", "https")
        # What the browser will visit is what the firewall judged (never localhost or an IP, strict).
        assert browser_host == urlsplit(location).hostname, location
        assert browser_host not in ("localhost", "127.0.0.1"), location

    check()


@pytest.mark.parametrize("target", HOSTILE)
def test_safe_next_keeps_every_listed_hostile_target_home(world: ShopWorld, target: str) -> None:
    """Each listed form, deterministically (hypothesis above samples them): found here, CR/LF (a 500
    from the Location header), tab/newline tricks and a netloc NFKC rejects (a 500 from urlsplit)."""
    from example_shop.auth import safe_next

    with world.app.test_request_context(base_url=SHOP_URL):
        assert_stays_home(safe_next(target), SHOP_URL + "/admin/login", target)
    for extra in ("//\uff0f", "/admin/\r\nX: y", "/\t/evil.com"):
        with world.app.test_request_context(base_url=SHOP_URL):
            assert safe_next(extra) == "/admin/"


@pytest.mark.parametrize(
    "url",
    [
        "https://localhost\\@shop.example/ok",  # urlsplit: shop.example; a browser: localhost
        "https://shop.example\\evil.com/",
        "https://shop.example/\x07",
        "https://shop.example[/",  # urlsplit raised ValueError in the firewall check: a 500
        "https://shop.example:port/",  # .port raised ValueError in the hosted page's redirect: a 500
        "HTTP://.",  # no IDNA encoding for an empty label: the hosted page's redirect was a 500
        "https://shop..example/",
    ],
)
def test_the_gateway_refuses_redirect_urls_a_browser_reads_differently(emulator: Gateway, url: str) -> None:
    body = create_body(request_id="r-x", confirmRedirectUrl=url)
    response = emulator.signed("/v2/create", body)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.json["errors"][0]["field"] == "payjustnow.confirmRedirectUrl"
