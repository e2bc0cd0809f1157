"""The layer rule (DESIGN.md): imports point down. Transports move bytes only: no module of
``collectives/transports/`` imports an executor, the group, the facade or anything above it,
not even inside a function. What a transport may use of the package is listed here."""
import ast
import pathlib

import collectives

PACKAGE = pathlib.Path(collectives.__file__).parent
# what lies below the transports
TRANSPORTS_MAY_IMPORT = ("errors", "ops", "signature", "auth", "debug", "settings", "kernels",
                         "transports")


def _imports(source: str, module: str):
    """Every ``collectives.*`` module that ``source`` (the text of ``module``) imports."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == "collectives" or name.startswith("collectives."):
                yield node.lineno, name


def test_transports_import_nothing_above_them():
    wrong = []
    for path in sorted((PACKAGE / "transports").rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for line, name in _imports(path.read_text(), module):
            below = name.split(".")[1] if "." in name else ""
            if below not in TRANSPORTS_MAY_IMPORT:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert not wrong, "transports must not import executors, the group or the facade:\n" + \
        "\n".join(wrong)


def test_the_rule_sees_relative_and_lazy_imports():
    source = "def f():\n    from ..executors import host\n    from .. import group\n"
    found = [name for _, name in _imports(source, "collectives.transports.probe")]
    assert found == ["collectives.executors", "collectives.group"]
