"""Every test declares the Keras it needs, so that a Keras 2 env runs only what can pass there (tests/conftest.py).

A test that reaches Keras 3 only API (``keras.ops``, ``keras.config``, ``keras.distribution``, ``keras.src``,
``keras_core``) declares Keras 3 only: it takes the ``keras3`` fixture (an argument, a fixture of its module or of a
conftest.py above it that takes it, ``usefixtures("keras3")`` on the test or in the module's ``pytestmark``), or it
needs JAX (``pytest.importorskip("jax")`` in its module or its body: Keras on JAX is Keras 3). Otherwise it runs in
tox's tf215 env, where ``keras`` is Keras 2, and fails there: test_user_model's verdict test did (exit 2, its model
file's ``keras.ops``), seen only in slow.yml's full tf215 run, since .ci/run's tf215 step selected tests by name.

The scan is static (no test imported, no model built): about 1 s for the whole suite. Of each test it reads its
body and decorators, the module-level functions, classes and constants it names (and what they name), and the
fixtures it takes, defined in its module or a conftest.py above it (and theirs). Python source a test holds in a
multi-line string (a model file it writes) is read as code, ``str.format`` fields as names. A use under ``if
hasattr(keras, ...)`` (or ``... if hasattr(...) else ...``), or in a ``try`` that catches ImportError or
AttributeError, is guarded: it runs on both generations. Docstrings and comments are not code. Helpers imported
from other modules are out of its sight.

The other way round, what a Keras 2 env runs is the tests marked ``keras2``: the plugin marks those that take the
``keras2`` fixture, any_keras' Keras 2 runs and a ``generation`` parameter's Keras 2 case; a test that asks for
``keras2`` by ``request.getfixturevalue`` otherwise is invisible to it, so the scan fails on one that marks no case
``keras2`` (``request_problems``), and on a .ci/run whose tf215 step selects by name again.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.pytest_plugin import pytest_itemcollected

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
KERAS3_ONLY = ("ops", "config", "distribution", "src")  # keras.<name> (keras.src: Keras 3's internals, not 2.15's)
KERAS3_PACKAGES = ("keras_core",)
KERAS_NAMES = frozenset({"keras", "keras3", "keras2", "any_keras", "tf_keras"})  # names a Keras module goes by
GUARDS = frozenset({"ImportError", "ModuleNotFoundError", "AttributeError", "Exception"})
# Every use's source holds one of these (an attribute .ops, an import of keras.ops, from keras import ...,
# keras_core): a module without one, whose conftest.py files have no use, needs no parse.
MAY_USE = re.compile(r"\.\s*(ops|config|distribution|src)\b|from\s+keras\s+import|keras_core")
DECLARATION = ("declares no Keras 3 only: take the keras3 fixture (or usefixtures('keras3')), or use what both "
               "generations have (tests/conftest.py)")


@dataclass(frozen=True)
class Use:
    """One use of Keras 3 only API: its line in the module and what it names (``keras.ops``)."""

    line: int
    what: str


def is_keras3_module(name: str) -> bool:
    """``keras.ops``, ``keras.src.models``, ``keras_core``...: a module path only Keras 3 has."""
    roots = [f"keras.{n}" for n in KERAS3_ONLY] + list(KERAS3_PACKAGES)
    return any(name == root or name.startswith(f"{root}.") for root in roots)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def keras_names(tree: ast.AST) -> set[str]:
    """The names a Keras module goes by in ``tree``: ``KERAS_NAMES``, and what imports or assignments give one."""
    names = set(KERAS_NAMES)
    assigned = []  # (target, the name it is given)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.asname and a.name.split(".")[0] in
                      ("keras", "tf_keras", *KERAS3_PACKAGES)}
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call) and _called(value) == "importorskip" and _first_str(value):
                assigned.append((node.targets[0].id, _first_str(value).split(".")[0]))
            elif isinstance(value, ast.Name):
                assigned.append((node.targets[0].id, value.id))
    for _ in range(2):  # an alias of an alias
        names |= {target for target, source in assigned if source in names}
    return names


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _first_str(call: ast.Call) -> str:
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""


def _is_guard(test: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Call) and _called(n) == "hasattr" and n.args and isinstance(n.args[0], ast.Name)
               and n.args[0].id in names for n in ast.walk(test))


def _catches_guard(node: ast.Try) -> bool:
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if handler.type is None or any(isinstance(k, ast.Name) and k.id in GUARDS for k in kinds):
            return True
    return False


class _Uses(ast.NodeVisitor):
    """The unguarded Keras 3 only uses under a node (``found``), lines offset by ``offset``."""

    def __init__(self, names: set[str], docstrings: set[int], offset: int = 0):
        self.names, self.docstrings, self.offset = names, docstrings, offset
        self.found: list[Use] = []

    def _add(self, node: ast.AST, what: str) -> None:
        self.found.append(Use(node.lineno + self.offset, what))

    def visit_If(self, node: ast.If | ast.IfExp) -> None:
        self.visit(node.test)
        guarded = _is_guard(node.test, self.names)
        for part in ([] if guarded else _as_list(node.body)) + _as_list(node.orelse):
            self.visit(part)

    visit_IfExp = visit_If

    def visit_Try(self, node: ast.Try) -> None:
        for part in ([] if _catches_guard(node) else node.body) + [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(part)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.names and node.attr in KERAS3_ONLY:
            self._add(node, f"{node.value.id}.{node.attr}")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if is_keras3_module(alias.name):
                self._add(node, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if is_keras3_module(module):
            self._add(node, f"from {module} import ...")
        elif module == "keras":
            for alias in node.names:
                if alias.name in KERAS3_ONLY:
                    self._add(node, f"from keras import {alias.name}")

    def visit_Constant(self, node: ast.Constant) -> None:
        # without "keras" in it, no Keras name is either (each has it): nothing to parse
        if isinstance(node.value, str) and "\n" in node.value and "keras" in node.value \
                and id(node) not in self.docstrings:
            self.found += embedded_uses(node.value, node.lineno + self.offset - 1)


def _as_list(part) -> list:
    return part if isinstance(part, list) else [part]


def uses_in(tree: ast.AST, offset: int = 0, names: set[str] | None = None,
            docstrings: set[int] | None = None) -> list[Use]:
    """The unguarded Keras 3 only uses in ``tree`` (lines plus ``offset``)."""
    visitor = _Uses(keras_names(tree) if names is None else names,
                    _docstrings(tree) if docstrings is None else docstrings, offset)
    visitor.visit(tree)
    return visitor.found


def embedded_uses(text: str, offset: int) -> list[Use]:
    """The uses in Python source held in a string whose first line is line ``offset + 1``: parsed whole, its
    ``str.format`` fields read as names; where it does not parse (a fragment, prose), line by line."""
    source = re.sub(r"(?<!\{)\{(\w*)\}(?!\})", r"_\1", text).replace("{{", "{").replace("}}", "}")
    try:
        return uses_in(ast.parse(textwrap.dedent(source)), offset)
    except SyntaxError:
        pass
    found = []
    for number, line in enumerate(source.splitlines()):
        try:
            found += uses_in(ast.parse(line.strip()), offset + number)
        except SyntaxError:
            continue
    return found


def _is_fixture(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        "fixture" in ast.unparse(d).split("(")[0] for d in node.decorator_list)


def _usefixtures(node: ast.AST) -> set[str]:
    """The fixtures ``pytest.mark.usefixtures(...)`` names under ``node`` (a decorator, ``pytestmark``'s value)."""
    return {a.value for n in ast.walk(node) if isinstance(n, ast.Call) and _called(n) == "usefixtures"
            for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}


def _needs_jax(statements: list[ast.stmt]) -> bool:
    """``pytest.importorskip("jax")`` among ``statements`` (a module's or a test's own, not a nested def's)."""
    return any(isinstance(n, ast.Call) and _called(n) == "importorskip" and _first_str(n).split(".")[0] == "jax"
               for s in statements if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for n in ast.walk(s))


@dataclass
class Module:
    """One parsed test module or conftest.py: its module-level definitions, fixtures and import-time uses."""

    path: Path
    tree: ast.Module
    names: set[str] = field(default_factory=set)
    docstrings: set[int] = field(default_factory=set)
    defs: dict[str, ast.AST] = field(default_factory=dict)
    uses: dict[int, list[Use]] = field(default_factory=dict)  # a definition's own uses, by id(node)
    names_in: dict[int, set[str]] = field(default_factory=dict)  # the names a definition reads, by id(node)

    @classmethod
    def parse(cls, path: Path, text: str | None = None) -> Module:
        tree = ast.parse(path.read_text() if text is None else text)
        module = cls(path, tree, keras_names(tree), _docstrings(tree))
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                module.defs[stmt.name] = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            module.defs[name.id] = stmt
        return module

    def own_uses(self, node: ast.AST) -> list[Use]:
        if id(node) not in self.uses:
            self.uses[id(node)] = uses_in(node, names=self.names, docstrings=self.docstrings)
        return self.uses[id(node)]

    def reads(self, node: ast.AST) -> set[str]:
        """The module-level definitions ``node`` names (itself left out)."""
        if id(node) not in self.names_in:
            self.names_in[id(node)] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in self.defs
                                       and self.defs[n.id] is not node}
        return self.names_in[id(node)]

    @functools.cached_property
    def import_time(self) -> list[ast.stmt]:
        """The statements that run as the module is imported, other than definitions a test reaches by name."""
        return [s for s in self.tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                ast.ClassDef, ast.Assign, ast.AnnAssign))]

    @functools.cached_property
    def declares_keras3(self) -> bool:
        marks = [s.value for s in self.tree.body if isinstance(s, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)]
        return any("keras3" in _usefixtures(m) for m in marks) or _needs_jax(self.tree.body)


def problems_of(test: ast.FunctionDef | ast.AsyncFunctionDef, module: Module,
                conftests: list[Module]) -> list[str]:
    """What ``test`` reaches of Keras 3 only API without declaring Keras 3 only: one line a use, empty where
    it reaches none or declares it."""
    if module.declares_keras3 or _needs_jax(test.body):
        return []
    fixtures = [module, *conftests]  # the nearest definition of a fixture name first, as pytest resolves it
    seen: set[int] = set()
    found: list[tuple[Module, Use]] = [(module, u) for s in module.import_time for u in module.own_uses(s)]
    todo: list[tuple[Module, ast.AST, bool]] = [(module, test, True)]
    while todo:
        where, node, takes_fixtures = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        found += [(where, u) for u in where.own_uses(node)]
        if takes_fixtures and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            wanted = {a.arg for a in node.args.args + node.args.kwonlyargs}
            wanted |= {name for d in node.decorator_list for name in _usefixtures(d)}
            if "keras3" in wanted:
                return []
            for name in wanted:
                owner = next((m for m in fixtures if _is_fixture(m.defs.get(name))), None)
                if owner is not None:
                    todo.append((owner, owner.defs[name], True))
        for name in where.reads(node):
            target = where.defs[name]
            todo.append((where, target, _is_fixture(target)))
    return [f"{_shown(module.path)}:{test.lineno}: {test.name} reaches {use.what} ({_shown(where.path)}:{use.line}) "
            f"and {DECLARATION}" for where, use in sorted(found, key=lambda f: (str(f[0].path), f[1].line))]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _conftests(path: Path, root: Path, cache: dict[Path, Module]) -> list[Module]:
    """The conftest.py files from ``path``'s folder up to ``root``, the nearest first."""
    out = []
    for folder in [path.parent, *path.parent.parents]:
        conftest = folder / "conftest.py"
        if conftest.exists():
            if conftest not in cache:
                cache[conftest] = Module.parse(conftest)
            out.append(cache[conftest])
        if folder == root:
            break
    return out


def request_problems(test: ast.FunctionDef | ast.AsyncFunctionDef, path: Path) -> list[str]:
    """``test`` asks for the keras2 fixture by ``request.getfixturevalue`` (by name, or a name held in a variable),
    which the plugin cannot see, and says nothing of it: no ``generation`` parameter (the plugin marks its Keras 2
    case), no ``keras2`` mark in its decorators. Then no Keras 2 env's step selects it."""
    asks = [n for n in ast.walk(test) if isinstance(n, ast.Call) and _called(n) == "getfixturevalue" and n.args
            and (_first_str(n) == "keras2" or not isinstance(n.args[0], ast.Constant))]
    params = {a.arg for a in test.args.args + test.args.kwonlyargs}
    marked = any(isinstance(n, ast.Attribute) and n.attr == "keras2" for d in test.decorator_list for n in ast.walk(d))
    if not asks or "generation" in params or marked:
        return []
    return [f"{_shown(path)}:{asks[0].lineno}: {test.name} asks for the keras2 fixture by getfixturevalue, which the "
            "plugin cannot see: mark its Keras 2 cases keras2 (pytest.param(..., marks=pytest.mark.keras2)) or name "
            "the parameter generation"]


def module_problems(path: Path, root: Path, text: str | None = None,
                    cache: dict[Path, Module] | None = None) -> list[str]:
    """Each test function of the module at ``path`` (its text: ``text``, else the file's) that reaches Keras 3
    only API undeclared, with the use, or asks for Keras 2 where the plugin cannot see it (``request_problems``)."""
    text = path.read_text() if text is None else text
    conftests = _conftests(path, root, {} if cache is None else cache)
    may_use = MAY_USE.search(text) or any(uses_in(c.tree, names=c.names, docstrings=c.docstrings)
                                          for c in conftests)
    if not may_use and "getfixturevalue" not in text:
        return []  # not a token of a use or a request in its text, no use in its conftest.py files
    module = Module.parse(path, text)
    tests = [node for node in module.tree.body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")]
    return [line for test in tests for line in [*(problems_of(test, module, conftests) if may_use else []),
                                                *request_problems(test, path)]]


def suite_problems(root: Path = TESTS) -> list[str]:
    """Every test module's (``test_*.py`` under ``root``) undeclared Keras 3 only uses."""
    cache: dict[Path, Module] = {}
    return [line for path in sorted(root.rglob("test_*.py")) if path != Path(__file__)  # this file's are planted
            for line in module_problems(path, root, cache=cache)]


def test_every_test_that_reaches_keras3_only_api_declares_it():
    problems = suite_problems()
    assert not problems, "\n".join(problems)


# A test module as it might be planted: the model file a test writes (a string) centres the batch with keras.ops.
PLANTED = '''
import pytest

MODEL = """
import keras


class Centre(keras.layers.Layer):
    def call(self, x):
        return x - keras.ops.mean(x, axis=0, keepdims=True)
"""


@pytest.fixture
def model_file(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path / "model.py"


def test_through_a_fixture(model_file):
    assert model_file.exists()


def test_declared(model_file, keras3):
    assert model_file.exists()


def test_in_its_body(any_keras):
    """Not every keras.ops use is code: this docstring's is not."""
    assert any_keras.ops.mean([1.0]) == 1.0
'''


def _planted(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "tests" / ("test_" + "planted.py")  # split: a path of the temporary tree, not of this one
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return module_problems(path, tmp_path / "tests")


def test_a_planted_undeclared_test_fails_the_scan_and_a_declared_one_does_not(tmp_path):
    problems = _planted(tmp_path, PLANTED)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == [
        "test_through_a_fixture reaches keras.ops", "test_in_its_body reaches any_keras.ops"], problems
    assert f"tests/{'test_'}planted.py:10) and {DECLARATION}" in problems[0], problems  # the line in the model file


@pytest.mark.parametrize(("old", "new"), [
    ("return x - keras.ops.mean(", "return x - keras.backend.mean("),  # what Keras 2 has
    ("return x - keras.ops.mean(x, axis=0, keepdims=True)",
     "return x - (keras.ops.mean if hasattr(keras, 'ops') else keras.backend.mean)(x, axis=0, keepdims=True)"),
    ("def test_through_a_fixture(model_file):", "@pytest.mark.usefixtures('keras3')\ndef test_through_a_fixture("
                                                "model_file):"),
    ("def model_file(tmp_path):", "def model_file(tmp_path, keras3):"),  # a fixture that declares it
    ("import pytest\n", "import pytest\n\npytestmark = pytest.mark.usefixtures('keras3')\n"),
    ("import pytest\n", "import pytest\n\npytest.importorskip('jax')\n"),  # Keras on JAX
], ids=["keras2-api", "hasattr-guard", "usefixtures", "fixture-takes-keras3", "module-mark", "jax-module"])
def test_what_clears_the_planted_fixture_test(tmp_path, old, new):
    assert old in PLANTED
    problems = _planted(tmp_path, PLANTED.replace(old, new))
    assert not any("test_through_a_fixture" in p for p in problems), problems


@pytest.mark.parametrize(("old", "new", "what"), [
    ("import keras\n", "import keras\nfrom keras import ops\n", "from keras import ops"),
    ("import keras\n", "import keras\nfrom keras.src.models import Model\n", "from keras.src.models import ..."),
    ("import keras\n", "import keras_core as keras\n", "import keras_core"),
    ("keras.ops.mean(", "keras.config.floatx() and keras.backend.mean(", "keras.config"),
])
def test_each_kind_of_keras3_only_use_is_found(tmp_path, old, new, what):
    problems = _planted(tmp_path, PLANTED.replace(old, new).replace("keras.ops.mean(", "keras.backend.mean("))
    assert any(f"test_through_a_fixture reaches {what} " in p for p in problems), problems


ASKS = '''
import pytest


@pytest.mark.parametrize("args", [["dense"], ["bn", "--keras2"]])
def test_a_cluster(args, request):
    if "--keras2" in args:
        request.getfixturevalue("keras2")
'''


@pytest.mark.parametrize(("old", "new", "found"), [
    ("", "", True),
    ('["bn", "--keras2"]]', 'pytest.param(["bn", "--keras2"], marks=pytest.mark.keras2)]', False),
    ('request.getfixturevalue("keras2")', 'request.getfixturevalue("keras3")', False),
    ('request.getfixturevalue("keras2")', "request.getfixturevalue(args[1][2:])", True),  # a name it computes
    ('"args", [', '"generation", [', False),  # ("args" left as the function's parameter: only its name counts)
], ids=["planted", "marked", "keras3", "computed", "generation"])
def test_a_test_that_asks_for_keras2_unseen_must_say_so(tmp_path, old, new, found):
    text = ASKS.replace(old, new).replace("(args, request)", "(generation, request)" if "generation" in new else
                                          "(args, request)")
    problems = _planted(tmp_path, text)
    assert bool(problems) == found and all("test_a_cluster asks for the keras2 fixture" in p for p in problems), \
        problems


def test_the_scan_finds_the_keras_ops_that_failed_the_tf215_env():
    """tests/parallel/test_user_model.py as it was: its model file's batch-mixing layer called keras.ops, and the
    verdict test, declaring nothing, ran on TF 2.15's Keras 2 and exited 2."""
    path = TESTS / "parallel" / "test_user_model.py"
    text = path.read_text()
    fixed = "return x - tf.reduce_mean(x, axis=0, keepdims=True)"
    assert fixed in text
    problems = module_problems(path, TESTS, text.replace(fixed, "return x - keras.ops.mean(x, axis=0, keepdims=True)"))
    assert any(": test_check_gives_a_verdict_and_fails_a_model_that_is_not_equivalent reaches keras.ops " in p
               for p in problems), problems


@pytest.mark.parametrize(("fixtures", "params", "marked"), [
    (["keras2", "tmp_path"], {}, True),
    (["any_keras", "keras2"], {"any_keras": "keras2"}, True),  # pytest lists it where requested statically
    (["any_keras"], {"any_keras": "keras2"}, True),
    (["any_keras"], {"any_keras": "keras3"}, False),
    (["keras3", "tmp_path"], {}, False),
    (["tmp_path"], {"method": "towers"}, False),
    (["request"], {"generation": "keras2", "option": "ema"}, True),  # it asks for request.getfixturevalue(generation)
    (["logical_devices"], {"generation": "2", "name": "dense"}, True),  # the zoo's generations
    (["logical_devices"], {"generation": "3", "name": "dense"}, False),
    (["tmp_path"], {"expected": "keras2"}, False),  # a parameter's value alone says nothing of what runs
])
def test_the_plugin_marks_keras2_what_runs_a_keras2_model(fixtures, params, marked):
    added = []
    item = SimpleNamespace(fixturenames=fixtures, callspec=SimpleNamespace(params=params), add_marker=added.append)
    pytest_itemcollected(item)
    assert [m.name for m in added] == (["keras2"] if marked else [])


def tf215_step(text: str) -> str:
    """.ci/run's tf215 step, its continuation lines joined."""
    joined = text.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if "tox -e tf215" in ln and not ln.lstrip().startswith("#")]
    return line


def selection_problems(step: str) -> list[str]:
    """What is wrong with a Keras 2 step's selection: it must select by the keras2 marker, never by test names."""
    problems = []
    marks = re.search(r'-m "([^"]*)"', step)
    if marks is None or not re.search(r"\bkeras2\b", marks[1]) or re.search(r"not\s+keras2\b", marks[1]):
        problems.append(f"the step does not select -m keras2: {step.strip()}")
    if re.search(r"\s-k\s", step):
        problems.append(f"the step selects by test names (-k): {step.strip()}")
    return problems


def test_the_tf215_step_selects_what_runs_keras2_by_marker():
    text = (REPO / ".ci" / "run").read_text()
    assert selection_problems(tf215_step(text)) == []
    planted = tf215_step(text).replace('-m "keras2 and not timing"', '-m "not timing" -k keras2')
    assert len(selection_problems(planted)) == 2, planted
