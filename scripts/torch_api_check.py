"""Checks a torch's Python sources for every torch API that aotid's compile
worker (python/aotid_worker) and exporter (python/aotid_export) call, and
every inductor option aotid sets or documents, without importing torch (a
CUDA torch does not import where the NVIDIA libraries are missing).

    python scripts/torch_api_check.py TORCH_DIR

TORCH_DIR is torch's package folder (site-packages/torch, or an unpacked
wheel's torch/). Prints one line per use, ok or what is missing; exits 1
when anything is. scripts/torch_wheel_check.sh runs it against the torch
versions aotid supports besides the pinned one; the test
exporter.TorchHasTheApisAotidCalls runs it against the torch aotid links. A
use added to the worker or the exporter belongs in USES or OPTIONS.
"""

from __future__ import annotations

import ast
import os
import sys

# (file under TORCH_DIR, dotted name in it, positional arguments aotid
# passes, keyword arguments aotid passes). A name is a function, a class
# (its __init__ is checked, less self), a property, or a module-level
# assignment (arguments then unchecked: a C function given a docstring).
USES = [
    ("export/__init__.py", "export", 2, ["dynamic_shapes", "strict"]),
    ("export/__init__.py", "save", 2, ["extra_files"]),
    ("export/__init__.py", "load", 1, []),
    ("export/dynamic_shapes.py", "Dim", 1, ["min", "max"]),
    ("export/dynamic_shapes.py", "_DerivedDim", 0, []),
    ("export/dynamic_shapes.py", "refine_dynamic_shapes_from_suggested_fixes", 2, []),
    ("utils/_pytree.py", "SUPPORTED_NODES", 0, []),
    ("utils/_pytree.py", "NodeDef.flatten_with_keys_fn", 0, []),
    ("utils/_pytree.py", "MappingKey", 0, []),
    ("utils/_pytree.py", "GetAttrKey", 0, []),
    ("utils/_pytree.py", "SequenceKey", 0, []),
    ("export/exported_program.py", "ExportedProgram.range_constraints", 0, []),
    ("export/exported_program.py", "ExportedProgram.graph_signature", 0, []),
    ("export/exported_program.py", "ExportedProgram.module", 0, []),
    ("export/graph_signature.py", "ExportGraphSignature.user_inputs", 0, []),
    ("export/graph_signature.py", "ExportGraphSignature.user_outputs", 0, []),
    ("export/passes/__init__.py", "move_to_device_pass", 2, []),
    ("export/pt2_archive/_package.py", "load_pt2", 1, []),
    ("export/pt2_archive/_package.py", "package_pt2", 1, ["exported_programs", "extra_files"]),
    ("export/pt2_archive/_package.py", "PT2ArchiveContents.exported_programs", 0, []),
    ("export/pt2_archive/_package.py", "PT2ArchiveContents.extra_files", 0, []),
    ("_inductor/__init__.py", "aoti_compile_and_package", 1, ["package_path", "inductor_configs"]),
    ("_inductor/__init__.py", "aoti_load_package", 1, []),
    ("__init__.py", "_check", 1, []),
    ("nn/functional.py", "scaled_dot_product_attention", 3, ["attn_mask"]),
    ("nn/functional.py", "silu", 1, []),
    ("nn/functional.py", "embedding", 2, []),
    ("_C/_VariableFunctions.pyi", "_weight_int8pack_mm", 3, []),
]

# Inductor options: the worker's defaults and the options a package may ask
# for (python/aotid_worker/compile.py), the exporter's, and those the docs
# and tests name.
OPTIONS = [
    "cpp.dynamic_threads", "cpp.simdlen", "cpp.cxx", "cpp.threads",
    "max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "max_autotune_gemm_backends",
    "coordinate_descent_tuning", "epilogue_fusion", "freezing",
    "aot_inductor.package_cpp_only", "aot_inductor.force_mmap_weights", "aot_inductor.package_constants_in_so",
    "aot_inductor.embed_kernel_binary",
]


def parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def find(body: list, name: str):
    """The last definition of `name` among `body`'s statements: a def, a
    class, or an assignment (plain or annotated)."""
    found = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node
        elif isinstance(node, ast.If):  # definitions under a TYPE_CHECKING or version test
            found = find(node.body, name) or find(node.orelse, name) or found
    return found


def check_call(fn, positional: int, keywords: list[str], drop_self: bool) -> str:
    """'' when `fn` takes `positional` arguments by position and each of
    `keywords` by name; else what it lacks."""
    a = fn.args
    pos = [p.arg for p in a.posonlyargs + a.args][1 if drop_self else 0:]
    named = {p.arg for p in a.args + a.kwonlyargs}  # positional-only ones cannot be named
    if len(pos) < positional and a.vararg is None:
        return f"takes {len(pos)} positional arguments, aotid passes {positional}"
    missing = [k for k in keywords if k not in named and a.kwarg is None]
    return f"has no argument {', '.join(missing)}" if missing else ""


def check_use(torch_dir: str, rel: str, dotted: str, positional: int, keywords: list[str]) -> str:
    path = os.path.join(torch_dir, rel)
    if not os.path.exists(path):
        return f"{rel} is missing"
    body = parse(path).body
    node, parts = None, dotted.split(".")
    for i, part in enumerate(parts):
        node = find(body, part)
        if node is None:
            return f"{rel} defines no {'.'.join(parts[:i + 1])}"
        body = getattr(node, "body", [])
    if isinstance(node, ast.ClassDef):
        init = find(node.body, "__init__")
        if init is None:  # a dataclass or a class whose base takes the arguments
            return ""
        return check_call(init, positional, keywords, drop_self=True)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        is_method = len(parts) > 1
        return check_call(node, positional, keywords, drop_self=is_method)
    return ""


def config_names(torch_dir: str) -> set[str]:
    """Every option torch/_inductor/config.py defines, dotted for those in
    its nested classes (cpp.dynamic_threads)."""
    names: set[str] = set()

    def walk(body: list, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.Assign):
                names.update(prefix + t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(prefix + node.target.id)
            elif isinstance(node, ast.ClassDef):
                walk(node.body, prefix + node.name + ".")
            elif isinstance(node, (ast.If, ast.Try)):
                walk(node.body, prefix)
                walk(getattr(node, "orelse", []), prefix)

    walk(parse(os.path.join(torch_dir, "_inductor", "config.py")).body, "")
    return names


def torch_version(torch_dir: str) -> str:
    for node in parse(os.path.join(torch_dir, "version.py")).body:
        value = getattr(node, "value", None)
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "__version__" and isinstance(value, ast.Constant):
            return str(value.value)
    return "unknown"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not os.path.isfile(os.path.join(argv[0], "version.py")):
        print("usage: torch_api_check.py TORCH_DIR (torch's package folder, with version.py)", file=sys.stderr)
        return 2
    torch_dir = argv[0]
    print(f"torch {torch_version(torch_dir)} at {torch_dir}")
    failed = 0
    for rel, dotted, positional, keywords in USES:
        problem = check_use(torch_dir, rel, dotted, positional, keywords)
        failed += bool(problem)
        print(f"  {'MISSING' if problem else 'ok':8} {dotted}{': ' + problem if problem else ''}")
    have = config_names(torch_dir)
    for name in OPTIONS:
        failed += name not in have
        print(f"  {'ok' if name in have else 'MISSING':8} inductor option {name}")
    print(f"{failed} missing" if failed else "every use found")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
