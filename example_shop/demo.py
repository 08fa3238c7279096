"""``make demo``: the gateway emulator and the example shop as two processes on loopback ports.

Ports: ``DEMO_EMULATOR_PORT`` (5050) and ``DEMO_SHOP_PORT`` (5000); ``DEMO_API_VERSION=v1`` runs the v1 flow.
Ctrl-C stops both. Before the servers start it creates their tables (the emulator's ``init-db`` and the
shop's ``shop init-db``) and installs the shop with the emulator's two demo accounts (``shop install``):
``demo-merchant`` for Stoep's products, ``demo-vuurhout`` for the second brand's (docs/example-shop.md).

Data lives in ``var/demo/shop-<shop port>-emulator-<emulator port>/``, one folder per port pair: a second
run on the same ports reuses it (the shop stays installed, with its callback URL on that port), and two
demos on other ports never share an installation.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from example_shop.catalog import MAIN_BRAND, SECOND_BRAND
from example_shop.config import SHOP_ZONE

ROOT = Path(__file__).resolve().parent.parent
#: Where the demos keep their data (``DEMO_DATA_DIR`` moves it, e.g. for a test).
DEMO_DATA = Path(os.environ.get("DEMO_DATA_DIR") or ROOT / "var" / "demo")
OWNER_PASSWORD = "demo-owner"  # noqa: S105 - the demo's documented owner password (development mode only)
#: The emulator's accounts: the shop's own (Stoep) and the second brand's (Vuurhout), ``id:apikey``.
MAIN_ACCOUNT = "demo-merchant:demo-api-key"
SECOND_ACCOUNT = "demo-vuurhout:demo-vuurhout-key"


def data_folder(shop_port: int, emulator_port: int) -> Path:
    """The demo's data for this port pair: the shop's installation names its callback URL on the shop's
    port and the emulator's account is installed once, so each pair keeps its own databases."""
    return DEMO_DATA / f"shop-{shop_port}-emulator-{emulator_port}"


#: The shop's environment of a demo, in its data folder: ``flask --env-file ... --app example_shop gateway
#: ...`` runs the extension's commands against the running demo (its database, its emulator, its keys).
ENV_FILE = "shop.env"


def write_env_file(data: Path, env: dict[str, str]) -> Path:
    """The shop's environment as ``flask --env-file`` reads it (python-dotenv, one ``NAME='value'`` a
    line), readable by its owner only (it names the second account's demo API key)."""
    path = data / ENV_FILE
    lines = [f"{name}='{value}'" for name, value in sorted(env.items())]
    path.write_text(
        "# The demo's shop, for flask --env-file (written by make demo).\n" + "\n".join(lines) + "\n"
    )
    path.chmod(0o600)
    return path


def commands_line(data: Path) -> str:
    """How to run a ``flask gateway`` command against this demo (printed in the banner)."""
    return f".venv/bin/flask --env-file {data / ENV_FILE} --app example_shop gateway doctor"


def banner(shop_url: str, emulator_url: str, api_version: str, data: Path, control_token: str) -> str:
    other = (
        "DEMO_API_VERSION=v1 make demo runs the v1 flow"
        if api_version == "v2"
        else "make demo without DEMO_API_VERSION runs the v2 flow"
    )
    return (
        "\n"
        "  Flask-Gateway demo\n"
        f"  Shop:               {shop_url}/            <- start here and buy something\n"
        f"  Shop admin:         {shop_url}/admin/      (password: {OWNER_PASSWORD})\n"
        f"  Gateway emulator:   {emulator_url}/_emulator/   (dashboard: checkouts, callbacks, e-mails)\n"
        f"                      sign in with the control token {control_token}\n"
        f"  API version:        {api_version} ({other})\n"
        f"  Merchant accounts:  {MAIN_ACCOUNT.split(':')[0]} (Stoep), {SECOND_ACCOUNT.split(':')[0]} "
        "(Vuurhout: the potjie pot and the brass lamp)\n"
        "  NOTE: the emulator runs with EMULATOR_WAF=allow-local so that localhost redirect URLs work;\n"
        "        the real gateway's firewall refuses redirect URLs on localhost or an IP address.\n"
        f"  Commands:           {commands_line(data)}\n"
        "                      (any flask gateway command: status ORDER, refund ORDER, reconcile, ...)\n"
        f"  Data: {data} (kept between runs on these ports). Press Ctrl-C to stop both.\n"
    )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_until_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


def _flask(app: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "flask", "--app", app, "run", "--port", str(port), "--with-threads"]
    return subprocess.Popen(command, env={**os.environ, **env}, cwd=ROOT)  # noqa: S603 - our interpreter


def _prepare(app: str, command: list[str], env: dict[str, str]) -> bool:
    """``flask --app APP COMMAND`` before a server starts (the tables, the installation): True when it
    worked; its output goes to the console either way."""
    argv = [sys.executable, "-m", "flask", "--app", app, *command]
    return subprocess.run(argv, env={**os.environ, **env}, cwd=ROOT, check=False).returncode == 0  # noqa: S603


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the demo as Ctrl-C does: both children are stopped


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    emulator_port = int(os.environ.get("DEMO_EMULATOR_PORT", "5050"))
    shop_port = int(os.environ.get("DEMO_SHOP_PORT", "5000"))
    api_version = os.environ.get("DEMO_API_VERSION", "v2")
    if api_version not in ("v2", "v1"):
        print(f"DEMO_API_VERSION={api_version!r}: use v2 (the default) or v1.", file=sys.stderr)
        return 1
    for name, port in (("DEMO_EMULATOR_PORT", emulator_port), ("DEMO_SHOP_PORT", shop_port)):
        if not _port_free(port):
            print(
                f"Port {port} is already in use (is a demo already running?). "
                f"Stop it, or choose another port: {name}={port + 1} make demo",
                file=sys.stderr,
            )
            return 1
    data = data_folder(shop_port, emulator_port)
    data.mkdir(parents=True, exist_ok=True)
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    shop_url = f"http://127.0.0.1:{shop_port}"
    # The emulator's dashboard and control API are closed with a token of this run (docs/emulator.md).
    control_token = os.environ.get("EMULATOR_CONTROL_TOKEN") or secrets.token_urlsafe(18)
    emulator_env = {
        "EMULATOR_WAF": "allow-local",
        "EMULATOR_DATABASE_URL": f"sqlite:///{data / 'emulator.sqlite3'}",
        "EMULATOR_PUBLIC_URL": emulator_url,
        "EMULATOR_CONTROL_TOKEN": control_token,
        # Each account carries the brand's name: the payment page is headed with it.
        "EMULATOR_ACCOUNTS": f"{MAIN_ACCOUNT}:{MAIN_BRAND},{SECOND_ACCOUNT}:{SECOND_BRAND}",
        # The payment page shows times as the shop does, in the shop's zone.
        "EMULATOR_TIMEZONE": SHOP_ZONE,
    }
    shop_env = {
        "SHOP_DATABASE_URL": f"sqlite:///{data / 'shop.sqlite3'}",
        "SHOP_ADMIN_PASSWORD": OWNER_PASSWORD,
        # Installed below, before the shop starts; on first use again if that did not work.
        "SHOP_AUTO_INSTALL": "1",
        # The second brand's merchant account: installed beside the shop's, on its own callback path.
        "SHOP_SECOND_ACCOUNT": SECOND_ACCOUNT,
        "GATEWAY_ENVIRONMENT": "emulator",
        "GATEWAY_BASE_URL": emulator_url,
        "GATEWAY_INSTALL_URL": f"{emulator_url}/install",
        "GATEWAY_V1_BASE_URL": emulator_url,
        "GATEWAY_PUBLIC_URL": shop_url,
        "GATEWAY_API_VERSION": api_version,
        # The emulator above accepts local return URLs: the admin screens need not warn.
        "GATEWAY_WAF": "allow-local",
    }
    write_env_file(data, shop_env)
    # The tables first, as an operator's deploy step does: the servers' create_app touches no database.
    for app, env in (("flask_gateway.emulator", emulator_env), ("example_shop", shop_env)):
        command = ["init-db"] if app == "flask_gateway.emulator" else ["shop", "init-db"]
        if not _prepare(app, command, env):
            print(f"Could not create the tables of {app}; its output is above.", file=sys.stderr)
            return 1
    processes: list[subprocess.Popen[bytes]] = []
    try:
        emulator = _flask("flask_gateway.emulator", emulator_port, emulator_env)
        processes.append(emulator)
        if not _wait_until_listening(emulator_port, emulator):
            print("The gateway emulator did not start; its output is above.", file=sys.stderr)
            return 1
        # Not fatal: the shop tries again on its first requests (SHOP_AUTO_INSTALL), and says why.
        _prepare("example_shop", ["shop", "install"], shop_env)
        shop = _flask("example_shop", shop_port, shop_env)
        processes.append(shop)
        if not _wait_until_listening(shop_port, shop):
            print("The example shop did not start; its output is above.", file=sys.stderr)
            return 1
        print(banner(shop_url, emulator_url, api_version, data, control_token), flush=True)
        while all(process.poll() is None for process in processes):
            time.sleep(0.5)
        print("A demo process stopped; stopping the other one.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(processes)


if __name__ == "__main__":
    raise SystemExit(main())
