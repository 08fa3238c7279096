"""No test asserts how long something took: latency and throughput are figures of ``benchmarks/`` (with
targets), and a test waits for the event itself (``tests.processes.wait_for``: a deadline only as a last
resort, whose failure says what it waited for).

An AST scan of every module under ``tests/``: an ``assert`` fails the scan when a comparison in it involves
a duration the test measured, that is

- a subtraction one of whose sides involves a clock reading: a call to ``time.monotonic``,
  ``time.perf_counter`` or ``time.time`` (or their ``_ns`` forms, however imported), or a name assigned
  from such a call (``started = time.monotonic()``);
- a name assigned from an expression holding such a subtraction (``elapsed = time.monotonic() - started``,
  ``per_request = (time.perf_counter() - t0) / 6``), or from an expression holding such a name;
- ``statistics.median``/``mean``/``fmean`` or ``max``/``min``/``sum`` of (or an item of) a list built
  from such values: assigned a list, tuple, set or comprehension of them, or given one by ``append``,
  ``extend``, ``insert`` or ``+=``; and each item of such a list, taken by a ``for`` or a comprehension.

Names are followed within each top-level function (its nested functions included) and at module level;
attributes across the module: one assigned a reading or a duration anywhere in it (``outage.ended =
time.monotonic()``), or a field of one of its classes given a reading by a constructor call in it
(``Outage("Redis stopped", time.monotonic())``), holds one wherever it is read in the module.
A deadline loop (``while time.monotonic() < deadline:``, ``if time.monotonic() > deadline: raise ...``)
is no assert, and a clock reading compared without a subtraction (``assert time.time() >= stamp``) is
an order of events: neither is flagged.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: The clocks whose readings make a duration.
CLOCKS = frozenset({"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"})
#: The reductions of a list of durations that make one.
REDUCTIONS = frozenset({"median", "median_low", "median_high", "mean", "fmean", "max", "min", "sum"})
#: The list methods that add values to a list.
ADDERS = frozenset({"append", "extend", "insert"})


@dataclass
class _Scope:
    """What one top-level function (or the module's top level) assigns: clock readings, durations and
    lists of durations, by name (a plain name, or a dotted one such as ``self.started``)."""

    clock_modules: set[str]
    clock_functions: set[str]
    #: Attribute names that hold clock readings or durations anywhere in the module (``outage.began``).
    stamp_attributes: frozenset[str] = frozenset()
    duration_attributes: frozenset[str] = frozenset()
    stamps: set[str] = field(default_factory=set)
    durations: set[str] = field(default_factory=set)
    lists: set[str] = field(default_factory=set)

    def is_clock_call(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in CLOCKS:
            return isinstance(func.value, ast.Name) and func.value.id in self.clock_modules
        return isinstance(func, ast.Name) and func.id in self.clock_functions

    def reads_clock(self, node: ast.AST) -> bool:
        """``node`` holds a clock reading: a clock call, or a name or attribute assigned from one."""
        return any(
            self.is_clock_call(child)
            or _key(child) in self.stamps
            or (isinstance(child, ast.Attribute) and child.attr in self.stamp_attributes)
            for child in ast.walk(node)
        )

    def is_duration(self, node: ast.AST) -> bool:
        """``node`` holds a measured duration (see the module's docstring)."""
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Sub)
            and (self.reads_clock(node.left) or self.reads_clock(node.right))
        ):
            return True
        if isinstance(node, ast.Attribute) and node.attr in self.duration_attributes:
            return True
        key = _key(node)
        if key is not None:
            if key in self.durations:
                return True
            if key in self.lists:
                return False  # the list itself (its length, say) is no duration
        if isinstance(node, ast.Subscript) and _key(node.value) in self.lists:
            return True
        if (
            isinstance(node, ast.Call)
            and _called(node) in REDUCTIONS
            and any(_key(arg) in self.lists or self.is_duration(arg) for arg in node.args)
        ):
            return True
        return any(self.is_duration(child) for child in ast.iter_child_nodes(node))

    def learn(self, nodes: Iterable[ast.AST]) -> None:
        """Follow the assignments of ``nodes`` until nothing new is learnt (a name may be used before the
        line that makes it a duration is reached in a walk)."""
        statements = [node for root in nodes for node in ast.walk(root)]
        while True:
            before = (len(self.stamps), len(self.durations), len(self.lists))
            for node in statements:
                self._learn_one(node)
            if (len(self.stamps), len(self.durations), len(self.lists)) == before:
                return

    def _learn_one(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                self._assigned(target, node.value)
        elif isinstance(node, ast.NamedExpr):
            self._assigned(node.target, node.value)
        elif isinstance(node, ast.AugAssign) and self.is_duration(node.value):
            key = _key(node.target)
            if key is not None:
                (self.lists if isinstance(node.value, _COLLECTIONS) else self.durations).add(key)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension) and (
            _key(node.iter) in self.lists or self.is_duration(node.iter)
        ):
            key = _key(node.target)
            if key is not None:
                self.durations.add(key)  # each item of a list of durations
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ADDERS
            and any(self.is_duration(arg) for arg in node.args)
        ):
            key = _key(node.func.value)
            if key is not None:
                self.lists.add(key)

    def _assigned(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
            for one, other in zip(target.elts, value.elts, strict=False):
                self._assigned(one, other)
            return
        key = _key(target)
        if key is None:
            return
        if self.is_clock_call(value):
            self.stamps.add(key)
        elif self.is_duration(value):
            (self.lists if isinstance(value, _COLLECTIONS) else self.durations).add(key)


_COLLECTIONS = (ast.List, ast.Tuple, ast.Set, ast.ListComp, ast.SetComp, ast.GeneratorExp)


def _key(node: ast.AST) -> str | None:
    """A plain or dotted name (``started``, ``self.started``), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _key(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _clock_imports(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names the ``time`` module and its clocks go by in this module."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "time"}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            functions |= {alias.asname or alias.name for alias in node.names if alias.name in CLOCKS}
    return modules, functions


def _scopes(tree: ast.Module) -> Iterator[list[ast.AST]]:
    """The module's top level (its statements outside functions and classes' methods), then each top-level
    function and method with everything nested in it."""
    top: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield [node]
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield [member]
                else:
                    top.append(member)
        else:
            top.append(node)
    yield top


def _fields_given_a_reading(tree: ast.Module, clocks: _Scope) -> set[str]:
    """The fields of the module's classes that a constructor call of the module gives a clock call
    (``Outage("Redis stopped", time.monotonic())``: ``began``, its second annotated field)."""
    fields = {
        node.name: [
            item.target.id
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        ]
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    given = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in fields:
            names = fields[node.func.id]
            given |= {
                names[i] for i, arg in enumerate(node.args) if i < len(names) and clocks.is_clock_call(arg)
            }
            given |= {kw.arg for kw in node.keywords if kw.arg and clocks.is_clock_call(kw.value)}
    return given


def _learnt(tree: ast.Module) -> list[tuple[list[ast.AST], _Scope]]:
    """Each scope of the module with what it assigns; the attributes that hold readings or durations in
    one scope count in every other (repeated until none is new)."""
    modules, functions = _clock_imports(tree)
    stamp_attributes = frozenset(_fields_given_a_reading(tree, _Scope(modules, functions)))
    duration_attributes: frozenset[str] = frozenset()
    while True:
        learnt = []
        for nodes in _scopes(tree):
            scope = _Scope(modules, functions, stamp_attributes, duration_attributes)
            scope.learn(nodes)
            learnt.append((nodes, scope))
        stamps = stamp_attributes | {
            key.rsplit(".", 1)[1] for _, s in learnt for key in s.stamps if "." in key
        }
        durations = duration_attributes | {
            key.rsplit(".", 1)[1] for _, s in learnt for key in s.durations if "." in key
        }
        if (stamps, durations) == (stamp_attributes, duration_attributes):
            return learnt
        stamp_attributes, duration_attributes = stamps, durations


def timed_assertions(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """Each ``assert`` of ``source`` that compares a duration measured in it: (line, the assert's text)."""
    found: list[tuple[int, str]] = []
    for nodes, scope in _learnt(ast.parse(source, filename=filename)):
        for root in nodes:
            for node in ast.walk(root):
                if isinstance(node, ast.Assert) and any(
                    isinstance(part, ast.Compare)
                    and any(scope.is_duration(side) for side in (part.left, *part.comparators))
                    for part in ast.walk(node.test)
                ):
                    found.append((node.lineno, ast.unparse(node.test)))
    return sorted(set(found))


def scan(paths: Iterable[Path], root: Path = ROOT) -> list[str]:
    """``path:line: assert ...`` (``path`` from ``root``) for every timed assertion in ``paths``."""
    lines = []
    for path in sorted(paths):
        for line, text in timed_assertions(path.read_text(encoding="utf-8"), str(path)):
            lines.append(f"{path.relative_to(root)}:{line}: assert {text}")
    return lines


# --- the scanner on planted examples --------------------------------------------------------------------

PLANTED = """
import statistics
import time
import time as clock
from time import perf_counter as pc


def test_direct():
    started = time.monotonic()
    work()
    assert time.monotonic() - started < 2.0                      # 11


def test_through_a_name():
    t0 = time.perf_counter()
    work()
    per_request = (time.perf_counter() - t0) / 6
    assert per_request < 2.0, per_request                        # 18


def test_aliases_and_a_later_reading():
    begin = pc()
    work()
    end = clock.time()
    took = end - begin
    ms = took * 1000
    assert 0 < ms <= 500                                         # 27


def test_a_list_of_timings():
    timings = []
    for _ in range(5):
        t = time.perf_counter()
        work()
        timings.append(time.perf_counter() - t)
    assert statistics.median(timings) < 0.1                      # 36
    assert max(timings) < 0.5                                    # 37
    assert timings[0] > 0                                        # 38


def test_a_comprehension_of_timings():
    spans = [measure() - time.time() for _ in range(3)]
    assert min(spans) >= 0 and len(spans) == 3                   # 43


def test_inside_a_helper():
    def check(started):
        assert time.monotonic() - started < 5                   # 48

    check(time.monotonic())


class TestAClass:
    def test_attribute(self):
        self.started = time.time()
        work()
        self.took = time.time() - self.started
        assert self.took < 1                                     # 58


def test_each_timing_of_a_list():
    laps = [lap() - time.monotonic() for _ in range(3)]
    for each in laps:
        assert each < 1                                          # 64
    assert all(one < 1 for one in laps)                          # 65


class Outage:
    name: str
    began: float


def outage_starts():
    return Outage("Redis stopped", time.monotonic())


def seen(event):
    event.at = time.monotonic()
    event.took = event.at - event.sent


def test_readings_and_durations_kept_in_attributes(outage, event):
    assert event.at - outage.began <= 30                         # 83
    assert event.took < 1                                        # 84
"""

#: The same kinds of code that measure no duration, or wait rather than assert.
CLEAN = """
import time
from datetime import timedelta


def test_deadline_loops():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if ready():
            break
        time.sleep(0.05)
    if time.monotonic() > deadline:
        raise AssertionError("never ready")
    assert ready()


def test_the_order_of_events():
    started = time.time()
    stamp = record_time()
    assert int(started) <= stamp <= time.time()


def test_counts_and_other_subtractions():
    timings = []
    timings.append(time.perf_counter() - time.perf_counter())
    assert len(timings) == 1
    assert total() - 3 == 4
    assert times[1] - times[0] >= timedelta(seconds=2)
    started = time.monotonic()
    elapsed = time.monotonic() - started
    print(f"took {elapsed:.1f} s")  # a figure shown, not asserted


def test_a_clock_the_test_controls():
    now = [100.0]
    watch = Watch(clock=lambda: now[0])
    now[0] = 142.5
    assert watch.seconds() == 42.5


def test_another_function_uses_the_same_name():
    elapsed = 3
    assert elapsed < 5


def test_attributes_that_hold_no_reading(checkout):
    assert checkout.at - checkout.created_at <= timedelta(hours=1)
    assert Outage("name", 3).began == 3
"""


def test_the_scanner_flags_each_planted_timed_assertion() -> None:
    """Each line of PLANTED that ends with its own number is flagged, and no other."""
    marked = [
        (number, int(text.rsplit("# ", 1)[1]))
        for number, text in enumerate(PLANTED.splitlines(), start=1)
        if re.search(r"# \d+$", text)
    ]
    assert all(number == mark for number, mark in marked), marked  # the marks say their own lines
    found = timed_assertions(PLANTED)
    assert [line for line, _ in found] == [number for number, _ in marked]
    assert len(found) == 13
    assert (18, "per_request < 2.0") in found


def test_the_scanner_leaves_deadlines_orders_and_counts_alone() -> None:
    assert timed_assertions(CLEAN) == []


def test_the_scan_names_file_and_line(tmp_path: Path) -> None:
    planted = tmp_path / "tests" / "test_planted.py"
    planted.parent.mkdir()
    planted.write_text("import time\n\nstarted = time.time()\nassert time.time() - started < 1\n")
    (tmp_path / "tests" / "test_clean.py").write_text(CLEAN)
    assert scan(sorted((tmp_path / "tests").glob("*.py")), root=tmp_path) == [
        "tests/test_planted.py:4: assert time.time() - started < 1",
    ]


def test_no_test_module_asserts_how_long_something_took() -> None:
    modules = [path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts]
    assert modules, "no test module found"
    found = scan(modules)
    assert found == [], (
        "A test asserts how long something took (a figure belongs in benchmarks/; a test waits for the "
        "event, with tests.processes.wait_for):\n" + "\n".join(found)
    )
