"""The package layout is layered: a module imports only from its own package and the layers below it,
and no two modules import each other, directly or around a circle (lazy imports inside functions
count: they are import edges all the same).

Layers, bottom to top: errors, vocabulary, limits, files, allocator; trajectory (no torch) and kernels; model and
parallel; render; output (the video writers); views, play and eval; api (the Python API); batch; serve (the render service); cli. `camrender/__init__.py` is the public facade and may reach any layer lazily.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "errors": 0, "limits": 0.5, "files": 0.5, "allocator": 0.5, "vocabulary": 0.25,
    "trajectory": 1, "kernels": 1,
    "model": 2, "parallel": 2,
    "render": 3,
    "output": 3.5,
    "views": 4, "play": 4, "eval": 4,
    "api": 4.5, "batch": 4.6, "serve": 4.7,
    "cli": 5, "__main__": 6,
}
NO_TORCH = ("trajectory",)


def module_files():
    """{dotted module name: file} of every module of camrender (kernels/ included as camrender.kernels)."""
    files = {}
    for path in (ROOT / "camrender").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in (ROOT / "kernels").glob("*.py"):
        name = "camrender.kernels" + ("" if path.stem == "__init__" else "." + path.stem)
        files[name] = path
    return files


def imports_of(name: str, path: Path, known: set) -> set:
    """camrender modules `name` imports anywhere in its file (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return {module for module in found if module in known and module != name}


def layer_of(module: str):
    parts = module.split(".")
    return None if len(parts) == 1 else parts[1]


@pytest.fixture(scope="module")
def graph():
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}, files


def test_every_package_has_a_layer(graph):
    edges, _ = graph
    assert {layer_of(m) for m in edges if layer_of(m)} <= set(LAYERS)


def test_no_module_imports_a_higher_layer(graph):
    edges, _ = graph
    upward = []
    for module, targets in edges.items():
        if module == "camrender":
            continue
        for target in targets:
            if target == "camrender":
                continue
            source_layer, target_layer = layer_of(module), layer_of(target)
            if source_layer != target_layer and LAYERS[target_layer] >= LAYERS[source_layer]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports up or across the layers: " + ", ".join(sorted(upward))


def model_part(module: str):
    """"stage1", "refiner" or "shared" (camrender/model/*.py) for a module of camrender.model, else None."""
    parts = module.split(".")
    if parts[:2] != ["camrender", "model"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ("stage1", "refiner") else "shared"


def test_model_parts_import_downward_only(graph):
    """Inside camrender.model: the shared modules (settings, device, fp8, adopt, graphs) import neither
    stage, stage 1 never imports the refiner; the refiner may read stage 1 (it refines stage 1's latents)."""
    edges, _ = graph
    allowed = {"shared": {"shared"}, "stage1": {"shared", "stage1"}, "refiner": {"shared", "stage1", "refiner"}}
    wrong = [f"{module} -> {target}" for module, targets in edges.items() if model_part(module)
             for target in targets if model_part(target) and model_part(target) not in allowed[model_part(module)]]
    assert not wrong, "imports across camrender.model's parts: " + ", ".join(sorted(wrong))


def find_circles(edges: dict) -> list:
    """Every import circle of a {module: imported modules} graph, as "a -> b -> a" strings."""
    circles = []
    state = {}

    def visit(module, stack):
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                circles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    return circles


def test_no_import_circles(graph):
    edges, _ = graph
    edges = {module: targets - {"camrender"} for module, targets in edges.items() if module != "camrender"}
    circles = find_circles(edges)
    assert not circles, "import circles: " + "; ".join(circles)


def test_no_import_circles_between_bench_scripts():
    """bench/ scripts import each other by bare name (`from common import ...`), lazily too."""
    scripts = {path.stem: path for path in (ROOT / "bench").glob("*.py")}
    edges = {}
    for name, path in scripts.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
        edges[name] = {target for target in found if target in scripts and target != name}
    circles = find_circles(edges)
    assert not circles, "import circles in bench/: " + "; ".join(circles)


def test_trajectory_layer_needs_no_torch_and_no_model():
    offenders = []
    for layer in NO_TORCH:
        for path in (ROOT / "camrender" / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                              if n.split(".")[0] in ("torch", "diffusers", "triton")]
    assert not offenders, offenders


def test_modules_stay_small():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for path in list((ROOT / "camrender").rglob("*.py")) + list((ROOT / "kernels").glob("*.py"))}
    assert {path: size for path, size in sizes.items() if size > 420} == {}
