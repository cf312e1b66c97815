"""The `tilegrad` package's modules import each other without a circle.

Read from the source (python/tilegrad/*.py) with `ast`, imports inside
functions included: an edge A -> B for every `from . import B`,
`from .B import name`, `import tilegrad.B` or `from tilegrad import B` in A
(a name that is no module of the package: an edge to `__init__`). The graph
must be acyclic, so that a module shared by two others (e.g. _torch_common,
shared by torch and ring) stays the way to share helpers.
"""
import ast
import os

import pytest

PACKAGE = "tilegrad"
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "python", PACKAGE)


def _modules():
    return sorted(f[:-3] for f in os.listdir(PACKAGE_DIR) if f.endswith(".py"))


def _imported(node, modules):
    """The package's modules one import statement names."""
    def module(name):
        return name if name in modules else "__init__"

    if isinstance(node, ast.Import):          # import tilegrad[.name]
        paths = [a.name.split(".") for a in node.names]
        return [module(p[1]) if len(p) > 1 else "__init__" for p in paths if p[0] == PACKAGE]
    path = (node.module or "").split(".") if node.module else []
    if node.level == 0:                       # from tilegrad[.name] import ...
        if not path or path[0] != PACKAGE:
            return []                         # another package
        path = path[1:]
    elif node.level > 1:
        return []                             # above the package (none today)
    if path:                                  # from .name import ...
        return [module(path[0])]
    return [module(a.name) for a in node.names]   # from . import name, ...


def import_graph():
    """{module: set of the package's modules it imports} (no self edges)."""
    modules = _modules()
    graph = {}
    for m in modules:
        with open(os.path.join(PACKAGE_DIR, m + ".py"), encoding="utf-8") as f:
            tree = ast.parse(f.read(), m + ".py")
        graph[m] = {t for node in ast.walk(tree)
                    if isinstance(node, (ast.Import, ast.ImportFrom))
                    for t in _imported(node, modules) if t != m}
    return graph


def find_cycle(graph):
    """One import circle as a list of modules (first = last), or None."""
    state = {}          # module -> "open" (on the current path) or "done"
    path = []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == "open":
                return path[path.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_graph_reads_the_package():
    g = import_graph()
    assert {"capi", "torch", "ring", "_torch_common"} <= set(g)
    assert {"capi", "_torch_common", "ring"} <= g["torch"]
    assert {"capi", "_torch_common"} <= g["ring"]


def test_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"torch": {"ring"}, "ring": {"torch"}}, ["ring", "torch", "ring"]),
])
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle
