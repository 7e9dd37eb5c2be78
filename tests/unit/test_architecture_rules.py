"""The rules docs/architecture.md states, checked by reading the code (its AST), so that
the document cannot drift from the code again.

Each rule is a small checker of one module's source, run over the repository, and run
once over a tiny snippet that breaks it, so that a checker that stopped seeing anything
would fail here too. A place that may break a rule is allowed by name, with its reason.
"""

from __future__ import annotations

import ast
import functools
import subprocess
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The components' packages: the product's code, held to the long-function rule.
PRODUCT = (
    "api",
    "composable_dra",
    "composable_operator",
    "device_scaler",
    "dra_driver",
    "fabric_emulator",
    "pool_publisher",
    "remote_gpu",
)
# The packages that run as a component and talk to the API server.
COMPONENTS = tuple(p for p in PRODUCT if p not in ("api", "fabric_emulator"))
LONG = 80  # lines; a longer function says why above it (see long_functions)

Checker = Callable[[ast.Module, str], list[str]]


@functools.cache
def _repository(with_tests: bool = False) -> list[tuple[str, ast.Module, str]]:
    """(path, tree, source) of each Python file git knows outside tests/ (their fakes
    may do what the product must not; ``with_tests`` takes them too), generated protobuf
    modules left out."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for name in sorted(listed):
        path = ROOT / name
        if (name.startswith("tests/") and not with_tests) or "_pb2" in name:
            continue
        if not path.is_file():
            continue
        source = path.read_text()
        found.append((name, ast.parse(source, name), source))
    return found


def _sources(top: tuple[str, ...] | None = None) -> Iterator[tuple[str, ast.Module, str]]:
    return (s for s in _repository() if top is None or s[0].split("/", 1)[0] in top)


def _violations(
    check: Checker, top: tuple[str, ...] | None = None, allowed: Iterable[str] = ()
) -> list[str]:
    """``path:line: what`` for each place that breaks the rule, but in ``allowed`` files."""
    return [
        f"{name}:{v}"
        for name, tree, src in _sources(top)
        if name not in allowed
        for v in check(tree, src)
    ]


def _snippet(check: Checker, source: str) -> list[str]:
    return check(ast.parse(source), source)


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


def _called_name(call: ast.Call) -> str:
    """``f`` of ``f(...)`` and of ``a.b.f(...)``; "" for anything else."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


# -- one way to watch: the Informer ----------------------------------------------------

# Who may call ``Kube.watch`` (a watch loop of its own skips the Informer's resume, 410
# and relist rules).
WATCHERS = {"composable_dra/k8s/informer.py": "the Informer itself"}


def watch_calls(tree: ast.Module, _source: str) -> list[str]:
    """Each ``<x>.watch(...)`` call: a watch stream opened by hand."""
    return [
        f"{c.lineno}: a watch of its own"
        for c in _calls(tree)
        if isinstance(c.func, ast.Attribute) and c.func.attr == "watch"
    ]


def test_only_the_informer_watches() -> None:
    assert _violations(watch_calls, allowed=WATCHERS) == []


# -- one retry policy: composable_dra/k8s/retry.py -------------------------------------------

# A hand-written backoff: in a loop, a wait (``sleep``, or ``wait`` of an Event or
# Condition) whose length is a name the same loop grows from its own value, by
# multiplying it (``d *= 2``, ``d = min(cap, d * 2)``) or through a call (``d =
# next_pause(d)``). A loop that waits a fixed time, or the retry policy's wait, is
# not a backoff. Who may (retry.py is the policy; tenacity is not read here):
BACKOFFS: dict[str, str] = {"composable_dra/k8s/retry.py": "the retry policy itself"}
_GROWING = (ast.Mult, ast.Pow, ast.LShift)


def _grown_names(loop: ast.AST) -> set[str]:
    """What ``loop`` computes from its own previous value, growing it."""
    grown = set()
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, _GROWING):
            grown.add(ast.unparse(node.target))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = ast.unparse(node.targets[0])
            parts = list(ast.walk(node.value))
            uses_itself = any(ast.unparse(p) == target for p in parts if p is not node.value)
            grows = any(isinstance(p, ast.BinOp) and isinstance(p.op, _GROWING) for p in parts) or (
                isinstance(node.value, ast.Call) and _called_name(node.value) != "min"
            )
            if uses_itself and grows:
                grown.add(target)
    return grown


def hand_written_backoffs(tree: ast.Module, _source: str) -> list[str]:
    found = []
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.While | ast.For | ast.AsyncFor):
            continue
        grown = _grown_names(loop)
        for call in _calls(loop):
            waited = {ast.unparse(a) for a in [*call.args, *(k.value for k in call.keywords)]}
            if _called_name(call) in ("sleep", "wait") and waited & grown:
                found.append(f"{call.lineno}: a backoff of its own ({', '.join(waited & grown)})")
    return sorted(set(found))


def test_no_backoff_outside_the_retry_policy() -> None:
    assert _violations(hand_written_backoffs, allowed=BACKOFFS) == []


# -- each component names itself in its user agent ---------------------------------------

# Where an ApiClient may be made: Kube.from_config, which sets the user agent.
CLIENT_MAKERS = {"composable_dra/k8s/kube.py": "Kube.from_config names the caller"}
AGENT_PREFIX = "composable-dra/"


def _names_itself(value: ast.expr) -> bool:
    """A string, or an f-string, that begins "composable-dra/" and goes on."""
    parts = value.values if isinstance(value, ast.JoinedStr) else [value]
    head = parts[0] if parts else None
    if not (isinstance(head, ast.Constant) and isinstance(head.value, str)):
        return False
    return head.value.startswith(AGENT_PREFIX) and (
        len(head.value) > len(AGENT_PREFIX) or len(parts) > 1
    )


def _sets_api_instance(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr == "api_instance" and isinstance(n.ctx, ast.Store)
        for n in ast.walk(tree)
    )


def anonymous_clients(tree: ast.Module, _source: str) -> list[str]:
    """``Kube.from_config`` without ``user_agent="composable-dra/<component>"``; ApiClients
    made directly, and API classes (``CoordinationV1Api()``) or a LeaseLock whose
    ``api_instance`` is not replaced, on the default client (the generator's agent)."""
    found = []
    for call in _calls(tree):
        name = _called_name(call)
        if name == "ApiClient":
            found.append(f"{call.lineno}: an ApiClient of its own")
        if name[:1].isupper() and name.endswith("Api") and not call.args and not call.keywords:
            found.append(f"{call.lineno}: {name} on the default client")
        if name == "LeaseLock" and not _sets_api_instance(tree):
            found.append(f"{call.lineno}: a LeaseLock on the default client")
        if name == "from_config" and "Kube" in ast.unparse(call.func):
            agent = next((k.value for k in call.keywords if k.arg == "user_agent"), None)
            if agent is None or not _names_itself(agent):
                found.append(f"{call.lineno}: a Kubernetes client that does not name itself")
    return found


def test_each_component_names_itself_in_its_user_agent() -> None:
    assert _violations(anonymous_clients, COMPONENTS, CLIENT_MAKERS) == []


# -- one percentile for the benches -------------------------------------------------------

PERCENTILE = "hack/bench/stats.py"


def percentiles(tree: ast.Module, _source: str) -> list[str]:
    """Functions named like a percentile or quantile, and calls of a library's
    (numpy's, statistics'): each a percentile of its own."""
    found = [
        f"{n.lineno}: defines {n.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(w in n.name.lower() for w in ("percentile", "quantile"))
    ]
    found += [
        f"{c.lineno}: calls {ast.unparse(c.func)}"
        for c in _calls(tree)
        if isinstance(c.func, ast.Attribute)
        and any(w in c.func.attr.lower() for w in ("percentile", "quantile"))
        and ast.unparse(c.func.value) in ("np", "numpy", "statistics")
    ]
    return found


def test_the_benches_have_one_percentile() -> None:
    assert _violations(percentiles, allowed={PERCENTILE}) == []
    assert _violations(percentiles, ("hack",)) != []  # the one is still there


# -- no long function without its reason ---------------------------------------------------


def _reason_above(lines: list[str], first: int) -> bool:
    """A comment block just above line ``first`` (1-based) that begins "Long because"."""
    i = first - 2
    block = []
    while i >= 0 and lines[i].strip().startswith("#"):
        block.append(lines[i].strip())
        i -= 1
    return any(line.lower().startswith("# long because") for line in block)


def long_functions(tree: ast.Module, source: str) -> list[str]:
    """Functions over LONG lines (decorators included) without a "# Long because ..."
    comment right above them or above a function they are nested in (a closure is the
    long part of the function that says why)."""
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, explained: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, explained)
                continue
            first = min([d.lineno for d in child.decorator_list] + [child.lineno])
            length = (child.end_lineno or child.lineno) - first + 1
            says_why = explained or _reason_above(lines, first)
            if length > LONG and not says_why:
                found.append(f"{child.lineno}: {child.name} is {length} lines, without its reason")
            visit(child, says_why)

    visit(tree, False)
    return found


def test_no_long_product_function_without_its_reason() -> None:
    assert _violations(long_functions, PRODUCT) == []


def test_no_long_function_anywhere_without_its_reason() -> None:
    """The same rule for the scripts, the test framework and the tests themselves."""
    files = _repository(with_tests=True)
    found = [f"{name}:{v}" for name, tree, src in files for v in long_functions(tree, src)]
    assert found == []
    # Every top-level folder of Python code is read, the scripts and the tests included.
    read = {name.split("/", 1)[0] for name, _, _ in files if "/" in name}
    assert {*PRODUCT, "composable_dra_cli", "hack", "testbed", "tests"} <= read


# -- each checker sees what breaks its rule ------------------------------------------------

_BODY = "".join(f"    x{i} = {i}\n" for i in range(LONG))
_LONG = f"def f():\n{_BODY}"
_NESTED = "def outer():\n" + "".join(f"    {line}\n" for line in _LONG.splitlines())
_WHY = "# Long because it lists every step.\n"

# (checker, a snippet, how many places in it break the rule)
SNIPPETS: list[tuple[Checker, str, int]] = [
    (watch_calls, "while True:\n    for ev in self.kube.watch(url, rv, 30):\n        f(ev)\n", 1),
    (
        hand_written_backoffs,
        "for n in range(3):\n    try:\n        return f()\n    except E:\n"
        "        stop.wait(pause)\n        pause *= 2\n",
        1,
    ),
    (
        hand_written_backoffs,
        "while True:\n    try:\n        f()\n    except OSError:\n"
        "        pause = min(1.0, max(0.01, pause * 2))\n        await asyncio.sleep(pause)\n",
        1,
    ),
    (hand_written_backoffs, "while True:\n    d = next_pause(d)\n    time.sleep(timeout=d)\n", 1),
    (  # a fixed wait, the policy's, and a deadline's are no backoff
        hand_written_backoffs,
        "while not stop.is_set():\n    failures += 1\n    stop.wait(0.5)\n"
        "    stop.wait(retry.delay(failures, cap=5.0))\n    left = min(left, deadline - now)\n"
        "    cond.wait(left)\n",
        0,
    ),
    (anonymous_clients, "kube = Kube.from_config(args.kubeconfig)\n", 1),
    (anonymous_clients, 'kube = Kube.from_config(config, user_agent="python")\n', 1),
    (anonymous_clients, "api = client.ApiClient(cfg)\n", 1),
    (anonymous_clients, "leases = client.CoordinationV1Api()\n", 1),
    (anonymous_clients, "lock = LeaseLock(lease, namespace, me)\n", 1),
    (
        anonymous_clients,
        'a = Kube.from_config(path, user_agent="composable-dra/plugin")\n'
        'b = Kube.from_config(path, user_agent=f"composable-dra/{component}")\n'
        "lock = LeaseLock(lease, namespace, me)\n"
        "lock.api_instance = client.CoordinationV1Api(kube.api)\n",
        0,
    ),
    (
        percentiles,
        "def percentile(xs, q):\n    return sorted(xs)[0]\n\nq = np.percentile(xs, 50)\n",
        2,
    ),
    (long_functions, _LONG, 1),
    (long_functions, _WHY + _LONG, 0),
    (long_functions, f"def f():\n{_BODY[: -len(_BODY) // 4]}", 0),
    (long_functions, _NESTED, 2),  # the closure, and the function around it
    (long_functions, _WHY + _NESTED, 0),  # the reason above covers its closure
]


@pytest.mark.parametrize(("check", "source", "breaks"), SNIPPETS)
def test_each_checker_sees_what_breaks_its_rule(check: Checker, source: str, breaks: int) -> None:
    assert len(_snippet(check, source)) == breaks
