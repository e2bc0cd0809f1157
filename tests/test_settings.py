"""The settings registry (``collectives/settings.py``): every COLLECTIVES_* variable the package
names is declared there and read nowhere else; the parsers and their errors (the variable and
the text named); per-call settings see a change at the next read, parsed once per text;
``python -m collectives info`` lists them; docs/settings.md's table is the registry's."""
import pathlib
import re
import subprocess
import sys

import pytest

from collectives import settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "collectives"
NAME = re.compile(r"COLLECTIVES_[A-Z0-9_]+")


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_variable_the_package_names_is_declared():
    named = {name for path in _sources() for name in NAME.findall(path.read_text())}
    assert named <= set(settings.REGISTRY), sorted(named - set(settings.REGISTRY))
    assert set(settings.REGISTRY) <= named | {"COLLECTIVES_MPI_INCLUDE"}


def test_nothing_else_reads_them_from_the_environment():
    # os.environ.get("COLLECTIVES_..."), os.environ["COLLECTIVES_..."], os.getenv(...), and
    # the same through a constant named ENV_*; writes (children's environment) are allowed
    read = re.compile(r"(environ\.get\(|getenv\(|environ\[)\s*(\"COLLECTIVES_|'COLLECTIVES_|"
                      r"ENV_|[A-Z_]*_ENV\b)")
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in _sources() if path.name != "settings.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if read.search(line) and "] =" not in line]
    assert not offenders, offenders


def test_declarations_are_complete():
    for name, setting in settings.REGISTRY.items():
        assert setting.name == name and setting.when in settings.WHEN
        assert setting.doc and setting.kind and "|" not in setting.doc + setting.kind
    with pytest.raises(ValueError, match="new COLLECTIVES_"):
        settings.declare("COLLECTIVES_DEBUG", settings.text, "", settings.CALL, "again")
    with pytest.raises(ValueError, match="COLLECTIVES_"):
        settings.declare("OTHER_THING", settings.text, "", settings.CALL, "not ours")


@pytest.mark.parametrize("text, value", [
    ("4096", 4096), ("64K", 64 << 10), ("64k", 64 << 10), ("8M", 8 << 20), ("8MB", 8 << 20),
    ("1GiB", 1 << 30), ("1.5G", 3 << 29), (" 0 ", 0), ("2T", 2 << 40), ("1e6", 10**6)])
def test_byte_sizes(text, value):
    assert settings.byte_size(text) == value


@pytest.mark.parametrize("text", ["lots", "-1", "64Q", "K", "nan", "inf", "1.2.3", "B"])
def test_bad_byte_sizes(text):
    with pytest.raises(ValueError, match="bytes"):
        settings.byte_size(text)


def test_flags_integers_and_choices():
    assert [settings.flag(t) for t in ("1", "true", "Yes", "ON", "0", "false", "no", "Off")] \
        == [True] * 4 + [False] * 4
    with pytest.raises(ValueError, match="expected 1 or 0"):
        settings.flag("2")
    assert settings.integer(1)(" 4 ") == 4
    with pytest.raises(ValueError, match=">= 1"):
        settings.integer(1)("0")
    with pytest.raises(ValueError, match="an integer"):
        settings.integer()("four")
    assert settings.choice("OFF", "INFO")("info") == "INFO"
    with pytest.raises(ValueError, match="one of OFF, INFO"):
        settings.choice("OFF", "INFO")("loud")
    assert settings.positive_number("2.5") == 2.5
    for bad in ("0", "-1", "inf", "x"):
        with pytest.raises(ValueError, match="> 0"):
            settings.positive_number(bad)


def test_a_bad_value_names_the_variable_and_the_text(monkeypatch):
    cases = {"COLLECTIVES_WINDOW": "0", "COLLECTIVES_SOCKET_SHM_BYTES": "8 megs",
             "COLLECTIVES_DEBUG": "loud", "COLLECTIVES_SOCKET_CMA": "maybe",
             "COLLECTIVES_STORE_MAX_CLIENTS": "-3"}
    for name, text in cases.items():
        monkeypatch.setenv(name, text)
        with pytest.raises(ValueError) as info:
            settings.get(name)
        assert f"{name}={text!r}" in str(info.value), str(info.value)
    with pytest.raises(ValueError, match="unknown setting 'COLLECTIVES_NOPE'"):
        settings.get("COLLECTIVES_NOPE")


def test_unset_or_blank_is_the_default_and_a_change_is_seen_at_the_next_read(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_WINDOW", raising=False)
    assert settings.WINDOW() == 1 and not settings.WINDOW.is_set()
    monkeypatch.setenv("COLLECTIVES_WINDOW", "  ")
    assert settings.WINDOW() == 1 and not settings.WINDOW.is_set()
    monkeypatch.setenv("COLLECTIVES_WINDOW", "4")
    assert settings.WINDOW() == 4 and settings.WINDOW.is_set()
    assert settings.WINDOW.raw() == "4"
    monkeypatch.setenv("COLLECTIVES_WINDOW", "8")
    assert settings.WINDOW() == 8
    monkeypatch.delenv("COLLECTIVES_WINDOW")
    assert settings.WINDOW() == 1


def test_a_text_is_parsed_once(monkeypatch):
    calls = []

    def parser(text):
        calls.append(text)
        return int(text)
    setting = settings.Setting("COLLECTIVES_TEST_ONLY", parser, 0, settings.CALL, "a test")
    monkeypatch.setenv("COLLECTIVES_TEST_ONLY", "3")
    assert [setting() for _ in range(5)] == [3] * 5 and calls == ["3"]
    monkeypatch.setenv("COLLECTIVES_TEST_ONLY", "4")
    assert setting() == 4 and calls == ["3", "4"]


def test_debug_level_rejects_unknown_values(monkeypatch):
    from collectives import debug
    monkeypatch.setenv("COLLECTIVES_DEBUG", "info")
    assert debug.level() == "INFO"
    monkeypatch.setenv("COLLECTIVES_DEBUG", "verbose")
    with pytest.raises(ValueError, match="COLLECTIVES_DEBUG='verbose': expected one of OFF, "
                                         "INFO, DETAIL"):
        debug.level()


def _info(*args, env=None):
    import os
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COLLECTIVES_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "collectives", *args], capture_output=True,
                          text=True, env=environment, timeout=120, cwd=ROOT)


def test_info_lists_every_setting_with_its_value_here():
    out = _info("info", env={"COLLECTIVES_WINDOW": "4", "COLLECTIVES_SECRET": "hush-hush-hush-hush",
                             "COLLECTIVES_SOCKET_SHM_BYTES": "oops"})
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()
             if line.strip().startswith("COLLECTIVES_")}
    assert set(lines) == set(settings.REGISTRY)
    assert "4 (default 1)" in lines["COLLECTIVES_WINDOW"]
    assert "1 (default)" in lines["COLLECTIVES_SOCKET_SHM"]
    assert "hush-hush" not in out.stdout and "(set, not shown)" in lines["COLLECTIVES_SECRET"]
    assert "INVALID" in lines["COLLECTIVES_SOCKET_SHM_BYTES"] and "'oops'" in \
        lines["COLLECTIVES_SOCKET_SHM_BYTES"]
    assert "[group]" in lines["COLLECTIVES_TUNING"] and "[call]" in lines["COLLECTIVES_DEBUG"]


def test_cli_prints_the_table_and_refuses_unknown_commands():
    out = _info("info", "--settings-table")
    assert out.returncode == 0 and out.stdout.strip() == settings.markdown_table()
    bad = _info("infos")
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_docs_settings_table_is_the_registrys():
    text = (ROOT / "docs" / "settings.md").read_text()
    start, end = "<!-- settings table: python -m collectives info --settings-table -->", \
        "<!-- end of settings table -->"
    assert start in text and end in text, "docs/settings.md needs the settings table's markers"
    table = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert table == settings.markdown_table(), (
        "docs/settings.md's settings table differs from the registry: paste the output of "
        "python -m collectives info --settings-table between the markers")
