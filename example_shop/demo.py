"""``make demo``: start the gateway emulator (and, once it exists, the example shop) on loopback ports.

Data lives in ``var/demo/`` so a second run reuses it. Ctrl-C stops every process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "var" / "demo"


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


def main() -> int:
    emulator_port = int(os.environ.get("DEMO_EMULATOR_PORT", "5050"))
    if not _port_free(emulator_port):
        print(
            f"Port {emulator_port} is already in use (is a demo already running?). "
            "Stop it, or choose another port: DEMO_EMULATOR_PORT=5051 make demo",
            file=sys.stderr,
        )
        return 1
    DATA.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "EMULATOR_WAF": "allow-local",
        "EMULATOR_DATABASE_URL": f"sqlite:///{DATA / 'emulator.sqlite3'}",
        "EMULATOR_PUBLIC_URL": f"http://127.0.0.1:{emulator_port}",
    }
    command = [
        sys.executable,
        "-m",
        "flask",
        "--app",
        "flask_gateway.emulator",
        "run",
        "--port",
        str(emulator_port),
    ]
    emulator = subprocess.Popen(command, env=env, cwd=ROOT)  # noqa: S603 - our own interpreter and module
    try:
        if not _wait_until_listening(emulator_port, emulator):
            print("The emulator did not start; its output is above.", file=sys.stderr)
            return 1
        base = f"http://127.0.0.1:{emulator_port}"
        print(
            "\n"
            "  Flask-Gateway demo\n"
            f"  Gateway emulator:   {base}/_emulator/   (dashboard)\n"
            f"  OpenAPI document:   {base}/_emulator/openapi.json\n"
            "  Demo account:       demo-merchant / demo-api-key\n"
            "  NOTE: the emulator runs with EMULATOR_WAF=allow-local so that localhost redirect URLs work;\n"
            "        the real gateway's firewall refuses redirect URLs on localhost or an IP address.\n"
            f"  Data: {DATA} (kept between runs). Press Ctrl-C to stop.\n",
            flush=True,
        )
        emulator.wait()
        return emulator.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        if emulator.poll() is None:
            emulator.send_signal(signal.SIGINT)
            try:
                emulator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                emulator.kill()


if __name__ == "__main__":
    raise SystemExit(main())
