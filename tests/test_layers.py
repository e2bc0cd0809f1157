"""The layer rules (DESIGN.md), read from the source with ``ast``: imports point down.

- Transports move bytes only: no module of ``collectives/transports/`` imports an executor,
  the group, the facade or anything above it, not even inside a function; and none reaches
  an executor's state: no attribute (read, written, or named to getattr/setattr/hasattr) whose
  name says executor, nor any attribute an executor module sets on a transport.
- Executors keep their own state: none sets an attribute on a transport or reads one of its
  private attributes; they use its public interface and hooks.
- ``collectives/algorithms/`` is pure (schedules, parameters as data, the model): no I/O, no
  environment, no logging set-up. Its modules import from the package only what lies below
  them, no module of the standard library that reaches files, processes, sockets, the
  environment or logging, and call no ``open``/``print``/``input``, no ``environ``/``getenv``,
  no ``sys.stdout``/``stderr``/``stdin``/``argv``, no numpy file I/O. The tuning file is
  ``collectives/tuning_file.py``'s, the environment ``collectives/settings.py``'s, logging
  ``collectives/debug.py``'s. One exception, for names whose home is above: a module-level
  ``__getattr__`` (PEP 562) may import them there, since it runs only when code asks this
  module for such a name, never when the module is imported.
"""
import ast
import pathlib

import pytest

import collectives

PACKAGE = pathlib.Path(collectives.__file__).parent
ROOT = PACKAGE.parent
# what lies below the transports
TRANSPORTS_MAY_IMPORT = ("errors", "ops", "signature", "auth", "debug", "settings", "kernels",
                         "transports")
# what lies below the algorithms (settings and debug read the environment: not these)
ALGORITHMS_MAY_IMPORT = ("errors", "ops", "kernels", "algorithms")
# standard-library modules that reach files, processes, sockets, the environment or logging
IO_MODULES = frozenset({
    "os", "io", "json", "pathlib", "shutil", "tempfile", "glob", "fnmatch", "fileinput",
    "pickle", "shelve", "marshal", "csv", "sqlite3", "logging", "socket", "ssl", "select",
    "selectors", "subprocess", "multiprocessing", "mmap", "fcntl", "urllib", "http",
    "importlib", "builtins", "warnings"})
IO_BUILTINS = frozenset({"open", "print", "input", "breakpoint", "__import__", "exec", "eval"})
IO_ATTRIBUTES = frozenset({"environ", "environb", "getenv", "putenv", "stdout", "stderr",
                           "stdin", "argv", "tofile"})
NUMPY_IO = frozenset({"load", "save", "savez", "savez_compressed", "loadtxt", "savetxt",
                      "genfromtxt", "fromfile", "memmap", "DataSource"})
FORWARDER = "__getattr__"       # PEP 562: answers a name asked of the module, lazily


def _relative(path):
    return str(path.relative_to(ROOT))


def _modules(folder):
    """(path, dotted module name, source) of every Python module under ``folder``."""
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        yield path, ".".join(path.relative_to(ROOT).with_suffix("").parts), path.read_text()


def _target(node, module):
    """The absolute names an import node imports (``from x import y`` -> x.y candidates)."""
    package = module.rsplit(".", 1)[0]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        return [target] if node.module else [f"{target}.{a.name}" for a in node.names]
    return [a.name for a in node.names]


def _walk(tree):
    """(node, whether it lies inside a module-level ``__getattr__``) for every node."""
    forwarders = {id(n) for top in tree.body if isinstance(top, ast.FunctionDef)
                  and top.name == FORWARDER for n in ast.walk(top)}
    for node in ast.walk(tree):
        yield node, id(node) in forwarders


def _imports(source: str, module: str):
    """Every ``collectives.*`` module that ``source`` (the text of ``module``) imports, with
    its line and whether the import lies in a module-level ``__getattr__``."""
    for node, forwarding in _walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _target(node, module):
                if name == "collectives" or name.startswith("collectives."):
                    yield node.lineno, name, forwarding


def _below(name):
    return name.split(".")[1] if "." in name else ""


# ---------------------------------------------------------------------------------------------
# Transports


def test_transports_import_nothing_above_them():
    wrong = []
    for path, module, source in _modules("transports"):
        for line, name, _ in _imports(source, module):
            if _below(name) not in TRANSPORTS_MAY_IMPORT:
                wrong.append(f"{_relative(path)}:{line} imports {name}")
    assert not wrong, "transports must not import executors, the group or the facade:\n" + \
        "\n".join(wrong)


def test_the_rule_sees_relative_and_lazy_imports():
    source = "def f():\n    from ..executors import host\n    from .. import group\n"
    found = [name for _, name, _ in _imports(source, "collectives.transports.probe")]
    assert found == ["collectives.executors", "collectives.group"]


def _is_transport(node):
    """``transport`` or ``<anything>.transport``: what executors call the transport."""
    return (isinstance(node, ast.Name) and node.id == "transport") or \
        (isinstance(node, ast.Attribute) and node.attr == "transport")


def _string_argument(node):
    """The attribute a getattr/setattr/hasattr/delattr call names, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id in ("getattr", "setattr", "hasattr", "delattr") and \
            len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
            isinstance(node.args[1].value, str):
        return node.args[1].value
    return None


def pinned(source: str):
    """The attributes ``source`` sets on a transport (``transport.x = ...``,
    ``self.transport.x += ...``, ``setattr(transport, "x", ...)``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        names.update(t.attr for t in targets
                     if isinstance(t, ast.Attribute) and _is_transport(t.value))
        if _string_argument(node) and node.func.id == "setattr" and \
                _is_transport(node.args[0]):
            names.add(node.args[1].value)
    return names


def pinned_by_executors():
    """What executor modules set on a transport: executor state kept on the transport."""
    return set().union(*(pinned(source) for _, _, source in _modules("executors")))


def executor_state(source: str, pinned=frozenset()):
    """(line, name) of every attribute ``source`` reads, writes or names to getattr & co.
    whose name says executor, or that executors set on a transport (``pinned``)."""
    for node in ast.walk(ast.parse(source)):
        name = node.attr if isinstance(node, ast.Attribute) else _string_argument(node)
        if name and ("executor" in name.lower() or name in pinned):
            yield node.lineno, name


def test_transports_reach_no_executor_state():
    pinned = pinned_by_executors()
    wrong = [f"{_relative(path)}:{line} reaches executor state .{name}"
             for path, _, source in _modules("transports")
             for line, name in executor_state(source, pinned)]
    assert not wrong, ("transports offer capabilities; what an executor keeps is the "
                       "executor's (DESIGN.md, the contract group -> executor -> "
                       "transport):\n" + "\n".join(wrong))


def private_reads(source: str):
    """(line, name) of every private attribute ``source`` reaches on a transport
    (``transport._x``, ``self.transport._x``, ``getattr(transport, "_x")``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_transport(node.value):
            name = node.attr
        elif _string_argument(node) and _is_transport(node.args[0]):
            name = node.args[1].value
        else:
            continue
        if name.startswith("_") and not name.startswith("__"):
            yield node.lineno, name


def test_executors_pin_nothing_on_a_transport_and_read_only_its_public_interface():
    wrong = [f"{_relative(path)}: sets .{name} on a transport"
             for path, _, source in _modules("executors") for name in sorted(pinned(source))]
    wrong += [f"{_relative(path)}:{line} reads the transport's private .{name}"
              for path, _, source in _modules("executors")
              for line, name in private_reads(source)]
    assert not wrong, ("an executor keeps its state itself and uses the transport's public "
                       "interface and hooks (before_close, add_error_check, aborted):\n"
                       + "\n".join(wrong))


def test_the_private_rule_sees_attributes_and_getattr():
    source = ("def f(self, transport):\n"
              "    transport._aborted\n"
              "    getattr(self.transport, '_graphs', None)\n"
              "    return transport.aborted, self._own, transport.__class__\n")
    assert sorted(private_reads(source)) == [(2, "_aborted"), (3, "_graphs")]


def test_the_state_rule_sees_pinned_names_and_getattr():
    source = ("def f(self, transport):\n"
              "    transport.peer_path = 'x'\n"
              "    self.transport.calls += 1\n"
              "    setattr(transport, '_graphs', {})\n"
              "    transport.before_close(f)\n")
    assert pinned(source) == {"peer_path", "calls", "_graphs"}
    probe = ("def g(self):\n"
             "    getattr(self, 'peer_executor', None)\n"
             "    self._graphs.clear()\n"
             "    return self.executor_hint, self.rank\n")
    assert sorted(executor_state(probe, {"_graphs"})) == [
        (2, "peer_executor"), (3, "_graphs"), (4, "executor_hint")]


# ---------------------------------------------------------------------------------------------
# Algorithms


def algorithms_offences(source: str, module: str):
    """What in ``source`` (the text of ``module``, a module of algorithms/) breaks the
    algorithms' rule, as (line, what)."""
    tree = ast.parse(source)
    for node, forwarding in _walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _target(node, module):
                top = name.split(".")[0]
                if top == "collectives":
                    if _below(name) not in ALGORITHMS_MAY_IMPORT and not forwarding:
                        yield node.lineno, f"imports {name} (above the algorithms)"
                elif top in IO_MODULES and not getattr(node, "level", 0):
                    yield node.lineno, f"imports {name}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in IO_BUILTINS:
            yield node.lineno, f"calls {node.func.id}()"
        elif isinstance(node, ast.Attribute):
            if node.attr in IO_ATTRIBUTES:
                yield node.lineno, f"uses .{node.attr}"
            elif node.attr in NUMPY_IO and isinstance(node.value, ast.Name) and \
                    node.value.id in ("np", "numpy"):
                yield node.lineno, f"uses {node.value.id}.{node.attr}"


def test_algorithms_do_no_io():
    wrong = [f"{_relative(path)}:{line} {what}"
             for path, module, source in _modules("algorithms")
             for line, what in algorithms_offences(source, module)]
    assert not wrong, ("algorithms/ is pure: files are tuning_file.py's, the environment "
                       "settings.py's, logging debug.py's:\n" + "\n".join(wrong))


def test_the_algorithms_rule_sees_io_of_every_kind():
    module = "collectives.algorithms.probe"
    source = ("import os, json\n"
              "from pathlib import Path\n"
              "from .. import settings\n"
              "def f(np, sys):\n"
              "    import logging\n"
              "    open('x')\n"
              "    print(sys.stderr)\n"
              "    np.save('x', 1)\n"
              "    return os.environ\n"
              "def __getattr__(name):\n"
              "    from ..tuning_file import load_params\n"
              "    return load_params\n")
    found = sorted(algorithms_offences(source, module))
    assert found == [(1, "imports json"), (1, "imports os"), (2, "imports pathlib"),
                     (3, "imports collectives.settings (above the algorithms)"),
                     (5, "imports logging"), (6, "calls open()"), (7, "calls print()"),
                     (7, "uses .stderr"), (8, "uses np.save"), (9, "uses .environ")]
    # the same import anywhere but a module-level __getattr__ is an offence
    nested = "def g():\n    from ..tuning_file import load_params\n"
    assert list(algorithms_offences(nested, module)) == [
        (2, "imports collectives.tuning_file (above the algorithms)")]


# where code imports them from -> (their home above, its name there)
RESOLVED_ABOVE = {
    ("collectives.algorithms", "choose"): ("tuning", "choose"),
    ("collectives.algorithms", "ENV_DEBUG"): ("debug", "ENV_DEBUG"),
    **{(f"collectives.algorithms.{module}", old): ("tuning_file", new)
       for module in ("cost", "params")
       for old, new in (("load_params", "load_params"), ("save_params", "save_params"),
                        ("read_tuning", "read"), ("write_tuning", "write"),
                        ("ENV_TUNING", "ENV_TUNING"))},
    ("collectives.algorithms.cost", "load_corrections"): ("tuning_file", "load_corrections"),
    ("collectives.algorithms.measured", "load"): ("tuning_file", "load_corrections"),
    ("collectives.algorithms.measured", "save"): ("tuning_file", "save_ratios"),
    ("collectives.algorithms.measured", "parse"): ("tuning_file", "ratios_of"),
}


@pytest.mark.parametrize("where, home", sorted(RESOLVED_ABOVE.items()))
def test_names_whose_home_is_above_still_resolve_where_code_imports_them(where, home):
    import importlib
    (module, name), (above, there) = where, home
    found = importlib.import_module(module)
    assert getattr(found, name) is getattr(importlib.import_module(f"collectives.{above}"),
                                           there)
    with pytest.raises(AttributeError):
        getattr(found, "no_such_name")
