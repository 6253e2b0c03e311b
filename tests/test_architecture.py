"""The package's shape: each layer imports only what lies below it, and no function runs long.

Layers, bottom up: ``errors``, ``checkpoint``, ``typing``, ``cores`` and ``host_memory``; ``blocks``;
``scheduler``; ``compiler``; ``trainer``, ``visualize`` and ``schedule_plot``; ``fold/__init__``. Every
import counts, whether at load time, inside a function or under ``TYPE_CHECKING``. The one documented
exception is ``Block.eval`` (``fold/blocks/base.py``), which builds a ``Compiler`` for one example.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLD = ROOT / "fold"

LAYERS = {"fold.errors": 0, "fold.checkpoint": 0, "fold.typing": 0, "fold.fields": 0, "fold.cores": 0,
          "fold.host_memory": 0, "fold.blocks": 1, "fold.scheduler": 2, "fold.compiler": 3, "fold.trainer": 4,
          "fold.visualize": 4, "fold.schedule_plot": 4,
          "fold.generation": 4, "fold": 5}
EXCEPTIONS = {("fold.blocks.base", "fold.compiler.compiler")}  # Block.eval
MAX_FUNCTION_LINES = 80
MAX_COMPILER_LINES = 550


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text()) for p in sorted(FOLD.rglob("*.py"))}


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The modules of ``fold`` that ``tree`` imports anywhere (``from fold.x import y`` names
    module ``fold.x.y`` when that is a module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("fold"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fold"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
    return out & modules


def _graph() -> dict[str, set[str]]:
    trees = _modules()
    return {m: _imports(t, set(trees)) - {m} for m, t in trees.items()}


def _layer(module: str) -> int:
    """The layer of the longest prefix naming ``module`` or a package holding it."""
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def _folder(module: str) -> str:
    return module.rsplit(".", 1)[0] if (FOLD.parent / (module.replace(".", "/") + ".py")).exists() else module


def test_no_import_reaches_up_a_layer():
    upward = sorted((m, d) for m, deps in _graph().items() for d in deps
                    if _layer(d) > _layer(m) and (m, d) not in EXCEPTIONS)
    assert not upward, f"imports from a lower layer to a higher one: {upward}"


def test_the_documented_exception_is_still_needed_and_documented():
    # An exception that no longer happens is dead weight in this test: remove it then.
    graph = _graph()
    for m, d in EXCEPTIONS:
        assert d in graph[m]
    assert "the one import from the blocks to the compiler" in (FOLD / "blocks" / "base.py").read_text().lower()


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_crosses_a_folder():
    graph = {m: {d for d in deps if (m, d) not in EXCEPTIONS} for m, deps in _graph().items()}
    crossing = [sorted(c) for c in _cycles(graph) if len({_folder(m) for m in c}) > 1]
    assert not crossing, f"import cycles across folders: {crossing}"


def test_layers_of_modules():
    assert [_layer(m) for m in ("fold.errors", "fold.blocks.host", "fold.scheduler.program", "fold.compiler.build",
                                "fold.trainer", "fold.generation.tree", "fold")] == [0, 1, 2, 3, 4, 4, 5]


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_long_functions_and_a_short_compiler():
    long = []
    for path in sorted(FOLD.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append((str(path.relative_to(ROOT)), node.name, n))
            if isinstance(node, ast.ClassDef) and node.name == "Compiler":
                assert node.end_lineno - node.lineno + 1 < MAX_COMPILER_LINES
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
