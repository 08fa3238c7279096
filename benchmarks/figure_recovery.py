"""Figure R: how long recovery takes in the reliability scenarios, each figure against its target.

The tests of ``tests/reliability`` wait for these events and assert that they happen, in order (the outbox
delivers every event once, the shop serves again without a person, an outage is detected and cleared); they
never assert how long it took, which depends on the machine and its load. The durations are measured here,
by the very scenarios the tests run (their functions, every check of the test included), on a machine left
alone while it runs:

- R1 (``test_faults.fault_scenario``: 120 shoppers, PostgreSQL restarted fast and immediate, shop workers
  SIGKILLed inside callbacks): the longest wait of an outbox event from its writing to its delivery, target
  within the claim lease plus three rounds of the outbox service (``deliver --every 5``: a dead worker's
  event is free once its lease is over, delivered by the next round; one round more for a round that met an
  outage, one for the receivers and the load; docs/operations.md);
- R2 (the same run, per restart): from the database answering again to the shop serving an order's
  ``status.json`` (the prober polls it), target under the ``Retry-After`` its 503s gave
  (``flask_gateway.core.outages.RETRY_AFTER_SECONDS``); R2b the same to its readyz answering 200;
- R3 (``test_boot_without_database.boot_scenario``: both servers booted while PostgreSQL is stopped, then
  it is started): from PostgreSQL's start to a shopper page served, and R3b to the shop's readyz answering
  200 (it installs on first use, with shopper pages sent before each probe), each target under
  ``Retry-After``;
- R4 (``test_deployment.deployment_run``: Redis stopped, then the Celery worker stopped): from the outage's
  start to ``flask_gateway_job_overdue{job="deliver"}`` turning 1, target the deliver bound plus a tick
  plus :data:`SLACK`; R4b the same to the start of the doctor's run that first reported it (the doctor runs
  once the metric said so);
- R5 (the same): from the stopped part started again to the metric, and R5b to the doctor, saying both jobs
  are fine, target :data:`CLEAR_WITHIN`.

Alone: ``.venv/bin/python benchmarks/figure_recovery.py`` (``--recovery fault,boot,deployment`` picks
scenarios; a few minutes in all; PostgreSQL, and redis-server for the deployment, installed); in
``make bench`` as ``--only R``. Each scenario starts its own PostgreSQL cluster (the fault run and the boot
one with fsync on, as the tests'), servers and logs, in a scratch folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from harness import record, results

from flask_gateway.core.outages import RETRY_AFTER_SECONDS
from flask_gateway.payments.outbox import CLAIM_LEASE

#: Slack for a busy machine on top of the deliver bound and a tick (the scrape interval, the doctor's run).
SLACK: Final = 4.0
#: Seconds within which an outage's end should show in the metric and the doctor.
CLEAR_WITHIN: Final = 30.0
SCENARIOS: Final = ("fault", "boot", "deployment")


def _say(text: str) -> None:
    print(f"[R] {text}", flush=True)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _within(
    key: str, name: str, seconds: float | None, limit: float, out: dict[str, Any], *, below: bool = False
) -> None:
    """Record one duration against its limit (``below``: strictly under it)."""
    met = seconds is not None and (seconds < limit if below else seconds <= limit)
    target = f"{'<' if below else '<='} {limit:g} s"
    record(key, name, _seconds(seconds), target, met)
    out[f"{key} {name}"] = {"seconds": seconds, "target": target, "met": met}
    print(f"[{key}] {name:<58} {_seconds(seconds):>10}  (target {target}: {'met' if met else 'NOT MET'})")


def fault_figures(folder: Path, out: dict[str, Any]) -> None:
    from tests.postgres import start_cluster
    from tests.reliability.test_faults import DELIVER_EVERY, fault_scenario

    cluster = start_cluster(durable=True)
    try:
        figures = fault_scenario(cluster, folder, _say)
    finally:
        cluster.stop()
    bound = CLAIM_LEASE.total_seconds() + 3 * DELIVER_EVERY
    longest = max((wait for _kind, _attempts, wait in figures.outbox_waits.values()), default=None)
    _within("R1", "outbox event, writing to delivery (longest)", longest, bound, out)
    for mode, served, readied in figures.returns:
        _within(
            "R2", f"-m {mode}: database back -> shop serving", served, RETRY_AFTER_SECONDS, out, below=True
        )
        _within(
            "R2b", f"-m {mode}: database back -> readyz 200", readied, RETRY_AFTER_SECONDS, out, below=True
        )


def boot_figures(folder: Path, out: dict[str, Any]) -> None:
    from tests.postgres import start_cluster
    from tests.reliability.test_boot_without_database import boot_scenario

    cluster = start_cluster(durable=True)
    try:
        figures = boot_scenario(cluster, folder, _say)
    finally:
        if not cluster.is_running():
            cluster.start_server()
        cluster.stop()
    _within(
        "R3",
        "booted without database: started -> shopper page",
        figures.serving,
        RETRY_AFTER_SECONDS,
        out,
        below=True,
    )
    _within(
        "R3b",
        "booted without database: started -> readyz 200",
        figures.ready,
        RETRY_AFTER_SECONDS,
        out,
        below=True,
    )


def deployment_figures(folder: Path, out: dict[str, Any]) -> None:
    from tests.postgres import start_cluster
    from tests.reliability.test_deployment import DELIVER_BOUND, DELIVER_EVERY, deployed, deployment_run

    cluster = start_cluster()
    try:
        with deployed(cluster, folder) as deployment:
            outages = deployment_run(deployment)
    finally:
        cluster.stop()
    limit = DELIVER_BOUND + DELIVER_EVERY + SLACK
    for outage in outages:
        _within(
            "R4",
            f"{outage.name}: deliver overdue in the metric",
            outage.detected_metric - outage.began,
            limit,
            out,
        )
        _within(
            "R4b",
            f"{outage.name}: doctor's reporting run began",
            outage.doctor_began - outage.began,
            limit,
            out,
        )
    for outage in outages:
        _within(
            "R5",
            f"{outage.name}: started again -> metric fine",
            outage.cleared_metric - outage.ended,
            CLEAR_WITHIN,
            out,
        )
        _within(
            "R5b",
            f"{outage.name}: started again -> doctor fine",
            outage.cleared_doctor - outage.ended,
            CLEAR_WITHIN,
            out,
        )


def figure_recovery(args: argparse.Namespace, folder: Path) -> None:
    """The scenarios of ``args.recovery`` (comma-separated, all by default), their figures recorded."""
    wanted = [
        name.strip() for name in getattr(args, "recovery", ",".join(SCENARIOS)).split(",") if name.strip()
    ]
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}: choose from {', '.join(SCENARIOS)}")
    out: dict[str, Any] = {}
    runs = {"fault": fault_figures, "boot": boot_figures, "deployment": deployment_figures}
    for name in wanted:
        scratch = folder / f"recovery-{name}"
        scratch.mkdir(parents=True, exist_ok=True)
        _say(f"scenario {name} (logs in {scratch})")
        runs[name](scratch, out)
    results["figures"]["R_recovery"] = out


def main(argv: list[str] | None = None) -> int:
    """Figure R alone (see the module's docstring)."""
    from harness import summary

    parser = argparse.ArgumentParser(description="figure R: recovery times of the reliability scenarios")
    parser.add_argument(
        "--recovery",
        default=",".join(SCENARIOS),
        help=f"the scenarios to run, comma-separated ({','.join(SCENARIOS)})",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the scenarios' logs in this folder")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        figure_recovery(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-recovery-") as scratch:
            figure_recovery(args, Path(scratch))
    print(f"\nevery figure against its target:\n{summary()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
