"""The layout rules of ``aqw/``, read from the source with ``ast`` (nothing of aqw is imported).

One import direction, top to bottom; a module imports only its own layer or below:

====  =====================================================================================
L0    ``aqw.cli`` (and everything under it), ``aqw.__main__``, ``aqw.testing``
L1    ``aqw.fastapi``, ``aqw.monitor``, ``aqw.status``, ``aqw.dashboard``, ``aqw.timetable``
L2    ``aqw.app`` (the App and its helpers)
L3    ``aqw.worker``
L4    ``aqw.task``, ``aqw.schedule``, ``aqw.context``, ``aqw.telemetry``, ``aqw.cache``,
      ``aqw.idempotency``, ``aqw.workflows`` (batches: the tasks' jobs on the broker's part),
      ``aqw.scaling``, ``aqw.outbox`` (transactional enqueue and its relay)
L5    ``aqw.brokers``
L6    ``aqw.lease`` (with Redlock), ``aqw.retry``, ``aqw.flow``
L7    ``aqw._redis``, ``aqw.job``, ``aqw.errors``, ``aqw._ids``, ``aqw._cancel``,
      ``aqw._text``, ``aqw._redact``, ``aqw._readback``, ``aqw._version``, ``aqw.record``
====  =====================================================================================

``aqw/__init__.py`` (the public face) may import anything, and nothing inside aqw imports it:
it sits above every layer. Imports under ``if TYPE_CHECKING:`` and inside functions count:
the worker and the tasks see the App through Protocols, not by importing ``aqw.app``.

Also: ``import redis`` only in the Redis plumbing, no function-level imports of aqw modules
(except the lazy load of an optional extra, listed in ``LAZY_EXTRAS``), no import cycles, no
``from X import _name`` across modules, a ``_private`` module imported only from inside its
own package, no ``isinstance`` of a concrete broker class outside ``brokers/`` (capabilities
are asked for, not types), no module over ``MAX_LINES`` lines (a module holding one class:
its allowance in ``LONG_MODULES``, with the reason).

Every rule is a function of the package's root directory returning the problems it found,
so the same checks run on the real ``aqw/`` and, in the ``test_rule_*`` tests at the end, on
small hand-made trees that show each rule can fail and passes on a clean layout.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: One worker runs them all: each rule reads every module of aqw, parsed once per process
#: (about 2.5 s of CPU here), so spread over workers they parsed aqw five times.
pytestmark = pytest.mark.xdist_group("layering")

ROOT = Path(__file__).resolve().parents[1]
AQW = ROOT / "aqw"

#: The public face: above every layer. It may import anything; nothing imports it.
PUBLIC = -1

#: Module name prefixes of each layer, top (0) to bottom. A prefix covers the module and,
#: for a package, everything under it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "__main__", "testing"),
    ("fastapi", "monitor", "status", "dashboard", "timetable"),
    ("app",),
    ("worker",),
    # scaling: the autoscaling signal, read from a broker by the worker (its gauge) and by
    # aqw status: below the worker, above the brokers.
    (
        "task",
        "_codecs",
        "schedule",
        "context",
        "telemetry",
        "cache",
        "idempotency",
        "workflows",
        "scaling",
        "outbox",
    ),
    ("brokers",),
    ("lease", "retry", "flow"),
    (
        "_redis",
        "job",
        "errors",
        "_ids",
        "_cancel",
        "_text",
        "_redact",
        "_readback",
        "_version",
        "record",
    ),
)

#: Where ``import redis`` may appear, as paths relative to the package root (a directory
#: covers everything under it).
REDIS_ALLOWED = (
    "_redis/",
    "brokers/redis/",  # the Redis family: its brokers, parts and script callers
)

#: Function-level imports of aqw modules that are lazy loads of optional extras:
#: (importer module, imported module) -> why.
LAZY_EXTRAS: dict[tuple[str, str], str] = {
    # sqs:// needs the 'sqs' extra (aioboto3); loaded only when a URL asks for it.
    ("aqw.brokers", "aqw.brokers.sqs"): "aioboto3 is the optional 'sqs' extra",
    # nats:// needs the 'nats' extra (nats-py); loaded only when a URL asks for it.
    ("aqw.brokers", "aqw.brokers.nats"): "nats-py is the optional 'nats' extra",
    # sqs:// ...&records=postgresql://... needs the 'postgres' extra (asyncpg).
    ("aqw.brokers.sqs._batch_stores", "aqw.brokers.sqs._batches_pg"): "asyncpg: 'postgres'",
    ("aqw.brokers.sqs._keys", "aqw.brokers.sqs._keys_pg"): "asyncpg: the 'postgres' extra",
    # the pool's connection class subclasses asyncpg's: loaded when the pool is made, so the
    # package (and `aqw db sql --broker-tables`) imports without asyncpg.
    ("aqw.brokers.postgres._connection", "aqw.brokers.postgres._reset"): "asyncpg: 'postgres'",
    # postgresql:// needs the 'postgres' extra (asyncpg); loaded only when a URL asks for it.
    ("aqw.brokers", "aqw.brokers.postgres"): "asyncpg is the optional 'postgres' extra",
    # aqw db sql --broker-tables: the broker's SQL, without asyncpg for the rest of the CLI.
    ("aqw.cli._outbox", "aqw.brokers.postgres"): "asyncpg is the optional 'postgres' extra",
    # aqw dashboard needs the 'dashboard' extra (starlette, jinja2); loaded when it runs.
    ("aqw.cli._dashboard", "aqw.dashboard"): "starlette and jinja2: the 'dashboard' extra",
    # redis-py is loaded when something uses Redis, not by `import aqw`: its import is about
    # 0.2 s of CPU, a third of a worker's start-up, paid by apps on every other broker too
    # (tests/test_start_up.py holds it).
    ("aqw", "aqw._redis.lease"): "redis-py: loaded by aqw.RedisLeaseBackend's first use",
    ("aqw", "aqw.lease.redlock"): "redis-py: loaded by aqw.RedlockBackend's first use",
    ("aqw", "aqw.cache"): "redis-py: loaded by aqw.Cache's first use",
    ("aqw.app._app", "aqw.cache"): "redis-py: an App given a cache has it loaded already",
    ("aqw.brokers", "aqw.brokers.redis"): "redis-py: loaded when a URL asks for Redis",
    ("aqw.lease._lease", "aqw._redis.lease"): "redis-py: loaded when a Lease is given a client",
}

#: A module longer than this is two ideas.
MAX_LINES = 400

#: Modules that hold one class, allowed past ``MAX_LINES`` up to ``ONE_CLASS_LINES``, each
#: with why splitting it would cut an idea in two: path -> reason.
LONG_MODULES: dict[str, str] = {
    "brokers/base.py": "the Broker contract: every method of the transport documented in place",
    "brokers/nats/_broker.py": "NatsBroker alone: each Broker method, handing off to a part",
}

#: The most lines of a module in ``LONG_MODULES``.
ONE_CLASS_LINES = 600

#: The abstract broker: ``isinstance`` of it is fine anywhere (it is the contract).
BROKER_BASE = "Broker"


# --------------------------------------------------------------------------- the parser


@dataclass(frozen=True)
class Import:
    """One imported module, as one statement names it."""

    importer: str  # the importing module, e.g. "aqw.worker._worker"
    target: str  # the absolute module name imported, e.g. "aqw.brokers.base"
    names: tuple[str, ...]  # for ``from target import a, b``: the names taken from target
    path: str  # the importer's file, relative to the repository, e.g. "aqw/app.py"
    line: int
    in_function: bool
    type_checking: bool

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def how(self) -> str:
        kinds = [
            kind
            for kind, on in (
                ("in a function", self.in_function),
                ("TYPE_CHECKING", self.type_checking),
            )
            if on
        ]
        return f" [{', '.join(kinds)}]" if kinds else ""


@dataclass
class Module:
    name: str
    path: Path
    rel: str  # path relative to the package root, e.g. "brokers/redis.py"
    shown: str  # path as shown in messages, e.g. "aqw/brokers/redis.py"
    lines: int
    is_package: bool
    imports: list[Import] = field(default_factory=list)  # of modules of the package
    external: list[tuple[str, int, bool]] = field(default_factory=list)  # (module, line, in_fn)
    tree: ast.Module | None = None


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([root.name, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(
    node: ast.AST, in_function: bool = False, type_checking: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement in ``node``, with whether it sits in a function body and
    under ``if TYPE_CHECKING:``."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, in_function, type_checking
        return
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        in_function = True
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for stmt in node.body:
            yield from _walk(stmt, in_function, True)
        for stmt in node.orelse:
            yield from _walk(stmt, in_function, type_checking)
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, in_function, type_checking)


def _targets(
    node: ast.Import | ast.ImportFrom, package: str, pkg: str, modules: set[str]
) -> tuple[list[tuple[str, tuple[str, ...]]], list[str]]:
    """The package modules one statement imports, as (module, names taken from it), and the
    modules outside the package it imports. ``package`` is the importer's own package."""
    ours: list[tuple[str, tuple[str, ...]]] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        ours = [(n, ()) for n in names if n == pkg or n.startswith(pkg + ".")]
        return ours, [n for n in names if not (n == pkg or n.startswith(pkg + "."))]
    if node.level:
        base = package.split(".")
        if node.level > 1:
            base = base[: -(node.level - 1)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    if source != pkg and not source.startswith(pkg + "."):
        return [], [source]
    taken: list[str] = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in modules:  # ``from . import x`` with x a submodule
            ours.append((sub, ()))
        else:
            taken.append(alias.name)
    if taken:
        ours.append((source, tuple(taken)))
    return ours, []


#: aqw's own modules, parsed once per test process: every rule reads them, none changes them.
_PARSED: dict[Path, dict[str, Module]] = {}


def parse_package(root: Path) -> dict[str, Module]:
    """Every module under ``root`` (a package directory; its name is the package's), with the
    package modules it imports, relative imports resolved to absolute names. The real
    package is parsed once (the rules' hand-made trees each time: they are written first)."""
    root = root.resolve()
    if root != AQW.resolve():
        return _parse_package(root)
    if root not in _PARSED:
        _PARSED[root] = _parse_package(root)
    return _PARSED[root]


def _parse_package(root: Path) -> dict[str, Module]:
    pkg = root.name
    modules: dict[str, Module] = {}
    trees: dict[str, ast.Module] = {}
    for path in sorted(root.rglob("*.py")):
        name = _module_name(root, path)
        text = path.read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes etc. are not this test's business
            trees[name] = ast.parse(text, filename=str(path))
        modules[name] = Module(
            name=name,
            path=path,
            rel=path.relative_to(root).as_posix(),
            shown=path.relative_to(root.parent).as_posix(),
            lines=len(text.splitlines()),
            is_package=path.name == "__init__.py",
        )
    names = set(modules)
    for name, tree in trees.items():
        mod = modules[name]
        mod.tree = tree
        package = name if mod.is_package else name.rpartition(".")[0]
        for node, in_fn, tc in _walk(tree):
            ours, theirs = _targets(node, package, pkg, names)
            for target, taken in ours:
                mod.imports.append(Import(name, target, taken, mod.shown, node.lineno, in_fn, tc))
            mod.external.extend((target, node.lineno, in_fn) for target in theirs)
    return modules


# --------------------------------------------------------------------------- the rules


def layer_of(module: str) -> int | None:
    """The layer of a module of aqw (``PUBLIC`` for the package itself), None if unplaced."""
    rest = module.partition(".")[2]
    if not rest:
        return PUBLIC
    for number, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if rest == prefix or rest.startswith(prefix + "."):
                return number
    return None


def _layer_name(layer: int | None) -> str:
    return {PUBLIC: "public face", None: "no layer"}.get(layer, f"L{layer}")


def unplaced_modules(root: Path) -> list[str]:
    """Modules the layer table does not place."""
    return [
        f"{m.shown}: {m.name} has no layer"
        for m in parse_package(root).values()
        if layer_of(m.name) is None
    ]


def upward_imports(root: Path) -> list[str]:
    """Imports from a lower layer to a higher one (the public face is above all)."""
    problems = []
    for mod in parse_package(root).values():
        if layer_of(mod.name) == PUBLIC:
            continue
        mine = layer_of(mod.name)
        for imp in mod.imports:
            theirs = layer_of(imp.target)
            if mine is None or theirs is None or theirs >= mine:
                continue
            problems.append(
                f"{imp.where}: {mod.name} ({_layer_name(mine)}) -> {imp.target} "
                f"({_layer_name(theirs)}){imp.how}"
            )
    return problems


def redis_imports(root: Path) -> list[str]:
    """``import redis`` / ``from redis... import`` outside the places allowed."""
    problems = []
    for mod in parse_package(root).values():
        if any(mod.rel == a or (a.endswith("/") and mod.rel.startswith(a)) for a in REDIS_ALLOWED):
            continue
        for target, line, in_fn in mod.external:
            if target == "redis" or target.startswith("redis."):
                where = " [in a function]" if in_fn else ""
                problems.append(f"{mod.shown}:{line}: {mod.name} imports {target}{where}")
    return problems


def function_level_imports(
    root: Path, allowed: dict[tuple[str, str], str] | None = None
) -> list[str]:
    """Imports of package modules inside a function body, except the allowed lazy loads."""
    allowed = LAZY_EXTRAS if allowed is None else allowed
    problems = []
    for mod in parse_package(root).values():
        for imp in mod.imports:
            if imp.in_function and (mod.name, imp.target) not in allowed:
                names = f" ({', '.join(imp.names)})" if imp.names else ""
                problems.append(f"{imp.where}: {mod.name} -> {imp.target}{names}")
    return problems


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with a cycle (two or more modules, or
    one that imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return sorted(found)


def _shortest_path(
    graph: dict[str, set[str]], start: str, goal: str, within: set[str]
) -> list[str]:
    """A shortest import path start -> ... -> goal inside one component (breadth first)."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        if node == goal:
            return paths[node]
        for child in sorted(graph[node] & within):
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(f"no path {start} -> {goal} in a strongly connected component")


def _cycles(graph: dict[str, set[str]], component: list[str]) -> list[list[str]]:
    """For every import inside a component, the shortest cycle through it; each cycle once,
    shortest first."""
    within = set(component)
    seen: set[tuple[str, ...]] = set()
    for a in component:
        for b in sorted(graph[a] & within):
            cycle = [a] if a == b else [a, *_shortest_path(graph, b, a, within)[:-1]]
            first = cycle.index(min(cycle))
            seen.add(tuple(cycle[first:] + cycle[:first]))
    return [[*c, c[0]] for c in sorted(seen, key=lambda c: (len(c), c))]


def import_cycles(root: Path) -> list[str]:
    """Cycles in the module graph, counting every import (function-level, TYPE_CHECKING).
    One entry per group of modules that import each other: its cycles (the shortest one
    through each of its imports), then every import inside the group, with file:line."""
    modules = parse_package(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    edges: dict[tuple[str, str], list[Import]] = {}
    for mod in modules.values():
        for imp in mod.imports:
            if imp.target in graph:
                graph[mod.name].add(imp.target)
                edges.setdefault((mod.name, imp.target), []).append(imp)
    problems = []
    for component in _strongly_connected(graph):
        members = set(component)
        cycles = [" -> ".join(c) for c in _cycles(graph, component)]
        inside = [
            f"{imp.where}: {imp.importer} -> {imp.target}{imp.how}"
            for imp in sorted(
                (
                    i
                    for (a, b), imps in edges.items()
                    if a in members and b in members
                    for i in imps
                ),
                key=lambda i: (i.path, i.line),
            )
        ]
        problems.append(
            f"{len(component)} modules import each other: {', '.join(component)}\n"
            f"    {len(cycles)} cycles:\n      " + "\n      ".join(cycles) + "\n"
            f"    {len(inside)} imports inside the group:\n      " + "\n      ".join(inside)
        )
    return problems


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root: Path) -> list[str]:
    """``from X import _name`` with X a module of the package and _name not a submodule
    (dunders such as ``__version__`` are fine; private *modules* may be imported)."""
    problems = []
    for mod in parse_package(root).values():
        for imp in mod.imports:
            private = [n for n in imp.names if _is_private(n)]
            if private:
                taken = ", ".join(private)
                problems.append(f"{imp.where}: {mod.name} takes {taken} from {imp.target}")
    return problems


def _classes(mod: Module) -> list[ast.ClassDef]:
    return [n for n in (mod.tree.body if mod.tree else []) if isinstance(n, ast.ClassDef)]


def long_modules(
    root: Path, limit: int = MAX_LINES, allowed: dict[str, str] | None = None
) -> list[str]:
    """Modules longer than ``limit`` lines, longest first; a module of ``allowed`` (default
    ``LONG_MODULES``) may reach ``ONE_CLASS_LINES`` while it holds one class."""
    allowed = LONG_MODULES if allowed is None else allowed
    problems = []
    for m in sorted(parse_package(root).values(), key=lambda m: -m.lines):
        if m.lines <= limit:
            continue
        if m.rel in allowed:
            classes = len(_classes(m))
            if classes == 1 and m.lines <= ONE_CLASS_LINES:
                continue
            problems.append(
                f"{m.shown}: {m.lines} lines, {classes} classes (allowed up to "
                f"{ONE_CLASS_LINES} for one class: {allowed[m.rel]})"
            )
            continue
        problems.append(f"{m.shown}: {m.lines} lines")
    return problems


def _private_owner(target: str) -> str | None:
    """The package a private module (a dotted name with a ``_part``) belongs to: the one
    holding its innermost private part; None for a module with no private part."""
    parts = target.split(".")
    private = [i for i, p in enumerate(parts) if _is_private(p)]
    return ".".join(parts[: private[-1]]) if private else None


def private_module_imports(root: Path) -> list[str]:
    """Imports of a ``_private`` module (or of a module inside a ``_private`` package) from
    outside the package that holds it: a private module is its package's business."""
    problems = []
    for mod in parse_package(root).values():
        for imp in mod.imports:
            owner = _private_owner(imp.target)
            if owner is None or mod.name == owner or mod.name.startswith(owner + "."):
                continue
            problems.append(
                f"{imp.where}: {mod.name} imports {imp.target}, private to {owner}{imp.how}"
            )
    return problems


def _names_in(node: ast.expr) -> Iterator[str]:
    """The class names an ``isinstance`` second argument mentions (``A``, ``m.A``,
    ``(A, B)``, ``A | B``)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield node.attr
    elif isinstance(node, ast.Tuple):
        for item in node.elts:
            yield from _names_in(item)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        yield from _names_in(node.left)
        yield from _names_in(node.right)


def concrete_brokers(modules: dict[str, Module], pkg: str) -> set[str]:
    """The classes under ``brokers/`` that derive from ``Broker``, by name (transitively)."""
    bases: dict[str, set[str]] = {}
    for mod in modules.values():
        if mod.name.startswith(f"{pkg}.brokers"):
            for cls in _classes(mod):
                bases[cls.name] = {n for b in cls.bases for n in _names_in(b)}
    found: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, of in bases.items():
            if name not in found and of & (found | {BROKER_BASE}):
                found.add(name)
                grew = True
    return found


def broker_type_checks(root: Path) -> list[str]:
    """``isinstance`` / ``issubclass`` of a concrete broker class, or ``type(x) is`` one,
    outside ``brokers/``: ask the broker for a capability instead (``docs/design.md``)."""
    modules = parse_package(root)
    concrete = concrete_brokers(modules, root.resolve().name)
    problems = []
    for mod in modules.values():
        if mod.rel.startswith("brokers/") or mod.tree is None:
            continue
        for node in ast.walk(mod.tree):
            named: list[str] = []
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                named = list(_names_in(node.args[1]))
            elif isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.NotEq) for op in node.ops
            ):
                sides = [node.left, *node.comparators]
                if any(
                    isinstance(s, ast.Call) and isinstance(s.func, ast.Name) and s.func.id == "type"
                    for s in sides
                ):
                    named = [n for s in sides for n in _names_in(s)]
            for name in sorted(set(named) & concrete):
                line = getattr(node, "lineno", 0)
                problems.append(f"{mod.shown}:{line}: {mod.name} checks for {name}")
    return problems


def _report(what: str, problems: Iterable[str]) -> str:
    problems = list(problems)
    return f"{len(problems)} {what}:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------- aqw/


def test_every_module_has_a_layer() -> None:
    problems = unplaced_modules(AQW)
    assert not problems, _report("modules missing from LAYERS (place each one)", problems)


def test_no_import_points_up() -> None:
    problems = upward_imports(AQW)
    assert not problems, _report(
        "imports that point up (a module imports only its own layer or below)", problems
    )


def test_redis_is_imported_only_where_it_belongs() -> None:
    problems = redis_imports(AQW)
    assert not problems, _report(
        f"imports of redis outside {', '.join('aqw/' + a for a in REDIS_ALLOWED)}", problems
    )


def test_no_function_level_imports_of_aqw() -> None:
    problems = function_level_imports(AQW)
    assert not problems, _report(
        "function-level imports of aqw modules (import at the top, or add a lazy load of "
        "an optional extra to LAZY_EXTRAS with its reason)",
        problems,
    )


def test_no_import_cycles() -> None:
    problems = import_cycles(AQW)
    assert not problems, _report("import cycles", problems)


def test_private_names_stay_private() -> None:
    problems = private_imports(AQW)
    assert not problems, _report(
        "private names imported from another module (drop the underscore if a sibling needs it)",
        problems,
    )


def test_no_module_is_two_ideas() -> None:
    problems = long_modules(AQW)
    assert not problems, _report(f"modules over {MAX_LINES} lines", problems)


def test_private_modules_stay_in_their_package() -> None:
    problems = private_module_imports(AQW)
    assert not problems, _report(
        "private modules imported from outside their package (export the name from the "
        "package, or move the module)",
        problems,
    )


def test_no_type_checks_of_concrete_brokers_outside_brokers() -> None:
    problems = broker_type_checks(AQW)
    assert not problems, _report(
        "type checks of concrete brokers outside brokers/ (ask for a capability of Broker "
        "or of one of its parts instead)",
        problems,
    )


# --------------------------------------------------------------------------- the rules, checked


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A hand-made package ``aqw`` under tmp_path with the given files."""
    root = tmp_path / "aqw"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


CLEAN = {
    "__init__.py": "from .app import App\nfrom .worker import Worker\n__version__ = '0'\n",
    "__main__.py": "from .cli import main\n",
    "_version.py": "__version__ = '0'\n",
    "cli/__init__.py": "from ._main import main\n",
    "cli/_main.py": "from .. import app, status\nfrom .._version import __version__\n"
    "def main() -> None: ...\n",
    "status.py": "from .app import App\n",
    "app.py": (
        "from typing import TYPE_CHECKING\nfrom .worker import Worker\n"
        "if TYPE_CHECKING:\n    from .task import Task\nclass App: ...\n"
    ),
    "worker/__init__.py": "from ._worker import Worker\n",
    "worker/_worker.py": (
        "from ..brokers import base\nfrom . import _heartbeat\nclass Worker: ...\n"
    ),
    "worker/_heartbeat.py": "from ..errors import LeaseLost\n",
    "task.py": "from .brokers.base import Broker\n",
    "brokers/__init__.py": (
        "from .base import Broker\ndef from_url() -> None:\n    from .sqs import SQSBroker\n"
    ),
    "brokers/base.py": "from ..lease import Lease\nclass Broker: ...\n",
    "brokers/memory/__init__.py": "from ._broker import MemoryBroker\n",
    "brokers/memory/_broker.py": (
        "from ..base import Broker\nclass MemoryBroker(Broker): ...\n"
        "class Twin(MemoryBroker): ...\ndef f(b: object) -> bool:\n"
        "    return isinstance(b, MemoryBroker)\n"
    ),
    "brokers/redis/__init__.py": (
        "import redis\nfrom redis.asyncio import Redis\nfrom ..._redis import keys\n"
    ),
    "brokers/sqs/__init__.py": "from .broker import SQSBroker\n",
    "brokers/sqs/broker.py": "import aioboto3\nfrom ._base import SQSBase\nclass SQSBroker: ...\n",
    "brokers/sqs/_base.py": "from ...errors import ConfigError\nclass SQSBase: ...\n",
    "lease.py": "from .errors import LeaseLost\nclass Lease: ...\n",
    "_redis/__init__.py": "",
    "_redis/keys.py": "import redis.asyncio\n",
    "errors.py": "class LeaseLost(Exception): ...\nclass ConfigError(Exception): ...\n",
}


def test_rule_resolver(tmp_path: Path) -> None:
    root = _tree(tmp_path, CLEAN)
    modules = parse_package(root)
    imports = modules["aqw.cli._main"].imports
    targets = {(i.target, i.names, i.in_function, i.type_checking) for i in imports}
    assert targets == {
        ("aqw.app", (), False, False),  # from .. import app: a submodule
        ("aqw.status", (), False, False),
        ("aqw._version", ("__version__",), False, False),
    }
    assert {i.target for i in modules["aqw.worker._worker"].imports} == {
        "aqw.brokers.base",  # from ..brokers import base: a submodule
        "aqw.worker._heartbeat",
    }
    assert {(i.target, i.type_checking) for i in modules["aqw.app"].imports} == {
        ("aqw.worker", False),
        ("aqw.task", True),
    }
    (lazy,) = modules["aqw.brokers"].imports[1:]
    assert (lazy.target, lazy.names, lazy.in_function) == ("aqw.brokers.sqs", ("SQSBroker",), True)
    assert [i.target for i in modules["aqw.brokers.sqs._base"].imports] == ["aqw.errors"]
    assert modules["aqw.brokers.redis"].external == [
        ("redis", 1, False),
        ("redis.asyncio", 2, False),
    ]
    assert layer_of("aqw") == PUBLIC
    assert layer_of("aqw.cli.bench._main") == 0
    assert layer_of("aqw.monitor._rules") == 1
    assert layer_of("aqw.brokers.sqs._base") == 5
    assert layer_of("aqw._redis.lua") == 7
    assert layer_of("aqw.dlqx") is None


def test_rules_pass_on_a_clean_layout(tmp_path: Path) -> None:
    root = _tree(tmp_path, CLEAN)
    assert unplaced_modules(root) == []
    assert upward_imports(root) == []
    assert redis_imports(root) == []
    assert function_level_imports(root) == []
    assert import_cycles(root) == []
    assert private_imports(root) == []
    assert long_modules(root) == []
    assert private_module_imports(root) == []
    assert broker_type_checks(root) == []
    assert concrete_brokers(parse_package(root), "aqw") == {"MemoryBroker", "Twin"}


@pytest.mark.parametrize(
    ("files", "rule", "expected"),
    [
        pytest.param(
            {"worker/_heartbeat.py": "from ..app import App\n"},
            upward_imports,
            ["aqw/worker/_heartbeat.py:1: aqw.worker._heartbeat (L3) -> aqw.app (L2)"],
            id="up",
        ),
        pytest.param(
            {
                "lease.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from .brokers import base\n"
            },
            upward_imports,
            ["aqw/lease.py:3: aqw.lease (L6) -> aqw.brokers.base (L5) [TYPE_CHECKING]"],
            id="up-type-checking",
        ),
        pytest.param(
            {"errors.py": "def f() -> None:\n    from . import __version__\n"},
            upward_imports,
            ["aqw/errors.py:2: aqw.errors (L7) -> aqw (public face) [in a function]"],
            id="up-to-the-public-face",
        ),
        pytest.param(
            {"brokers/sqs/_base.py": "from redis.exceptions import RedisError\n"},
            redis_imports,
            ["aqw/brokers/sqs/_base.py:1: aqw.brokers.sqs._base imports redis.exceptions"],
            id="redis",
        ),
        pytest.param(
            {"task.py": "def f() -> None:\n    import aqw.brokers.base\n"},
            function_level_imports,
            ["aqw/task.py:2: aqw.task -> aqw.brokers.base"],
            id="function-level",
        ),
        pytest.param(
            {"brokers/__init__.py": "def f() -> None:\n    from .memory import make\n"},
            function_level_imports,
            ["aqw/brokers/__init__.py:2: aqw.brokers -> aqw.brokers.memory (make)"],
            id="function-level-not-allowlisted",
        ),
        pytest.param(
            {
                "lease.py": "from .errors import LeaseLost\n",
                "errors.py": "def f() -> None:\n    from .lease import Lease\n",
            },
            import_cycles,
            [
                "2 modules import each other: aqw.errors, aqw.lease\n"
                "    1 cycles:\n"
                "      aqw.errors -> aqw.lease -> aqw.errors\n"
                "    2 imports inside the group:\n"
                "      aqw/errors.py:2: aqw.errors -> aqw.lease [in a function]\n"
                "      aqw/lease.py:1: aqw.lease -> aqw.errors"
            ],
            id="cycle",
        ),
        pytest.param(
            {"brokers/sqs/broker.py": "from ._base import SQSBase, _held\nfrom . import _base\n"},
            private_imports,
            [
                "aqw/brokers/sqs/broker.py:1: aqw.brokers.sqs.broker takes _held "
                "from aqw.brokers.sqs._base"
            ],
            id="private",
        ),
        pytest.param(
            {"job.py": "x = 1\n" * 401},
            long_modules,
            ["aqw/job.py: 401 lines"],
            id="long",
        ),
        pytest.param(
            {"task.py": "from .brokers.sqs import _base\nfrom .brokers.sqs._base import SQSBase\n"},
            private_module_imports,
            [
                "aqw/task.py:1: aqw.task imports aqw.brokers.sqs._base, private to aqw.brokers.sqs",
                "aqw/task.py:2: aqw.task imports aqw.brokers.sqs._base, private to aqw.brokers.sqs",
            ],
            id="private-module",
        ),
        pytest.param(
            {
                "status.py": "from .brokers.memory import MemoryBroker\n"
                "def f(b: object) -> bool:\n"
                "    return isinstance(b, int | MemoryBroker) or type(b) is brokers.Twin\n"
            },
            broker_type_checks,
            [
                "aqw/status.py:3: aqw.status checks for MemoryBroker",
                "aqw/status.py:3: aqw.status checks for Twin",
            ],
            id="broker-type-check",
        ),
        pytest.param(
            {"brokers/base.py": "class Broker: ...\nclass Other: ...\n" + "x = 1\n" * 400},
            lambda root: long_modules(root, allowed={"brokers/base.py": "one idea"}),
            [
                "aqw/brokers/base.py: 402 lines, 2 classes (allowed up to 600 for one class: "
                "one idea)"
            ],
            id="long-with-two-classes",
        ),
        pytest.param(
            {"scheduler.py": "from .errors import ConfigError\n"},
            unplaced_modules,
            ["aqw/scheduler.py: aqw.scheduler has no layer"],
            id="unplaced",
        ),
    ],
)
def test_rule_fails(
    tmp_path: Path, files: dict[str, str], rule: Callable[[Path], list[str]], expected: list[str]
) -> None:
    root = _tree(tmp_path, {**CLEAN, **files})
    assert rule(root) == expected
