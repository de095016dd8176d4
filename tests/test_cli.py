import argparse
import json
import subprocess
import sys

from bertforge import cli


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "bertforge", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_help_lists_commands():
    out = run("--help").stdout
    assert "info" in out and "bench" in out


def test_no_arguments_prints_help():
    assert "COMMAND" in run().stdout


def test_every_command_has_help():
    for cmd in cli.COMMANDS:
        out = run(cmd.name, "--help").stdout
        assert f"usage: bertforge {cmd.name}" in out


def _parsers(p: argparse.ArgumentParser, path: str):
    """`p` and every sub-command parser under it, with its command path."""
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_help_shows_the_defaults():
    """Each option with a default says it in its --help line, in every command and sub-command."""
    missing, nones = [], []
    for cmd in cli.COMMANDS:
        root = cli.build_parser(cmd.name)
        sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd.name]
        for path, p in _parsers(sub, cmd.name):
            fmt = p._get_formatter()
            for a in p._actions:
                if not a.option_strings or a.default in (None, argparse.SUPPRESS) or a.nargs == 0 and a.const is None:
                    continue  # positionals, options without a default, --help/--version
                text = fmt._expand_help(a) if a.help else ""
                if "default" not in text.lower():
                    missing.append(f"{path} {a.option_strings[0]}")
            if "(default: None)" in p.format_help():
                nones.append(path)
    assert not missing, f"options whose --help does not show their default: {missing}"
    assert not nones, f"'(default: None)' in the --help of {nones}"


HEAVY = ("torch", "transformers", "h5py", "matplotlib", "tritonclient", "numpy")


def test_importing_the_cli_imports_nothing_heavy():
    # `bertforge --help` imports the command table and every handler module in it; torch alone takes seconds
    code = f"import sys, bertforge.cli; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"heavy modules imported by `import bertforge.cli`: {proc.stdout}"


def test_info_json_has_matmul_peak():
    data = json.loads(run("info", "--json").stdout)
    peak = data["matmul_peak_gflops"]
    assert peak["fp32"] > 1 and peak["bf16"] > 0
    assert data["devices"][0]["device"] == "cpu"
    assert data["torch"] and data["python"] and data["threads"] >= 1


def test_info_text():
    out = run("info").stdout
    assert "matmul peak" in out and "GFLOP/s" in out


def test_unknown_option_is_one_line():
    proc = run("info", "--bogus", check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "--bogus" in proc.stderr


def test_bad_value_is_one_line():
    proc = run("info", "--device", "tpu", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown device" in proc.stderr


def test_the_table_holds_each_handler_pair_once():
    names = [c.name for c in cli.COMMANDS]
    assert len(set(names)) == len(names)
    for cmd in cli.COMMANDS:  # `info` -> info_add / info_run: the table names the handlers, no strings
        assert cmd.add.__name__.endswith("_add") and cmd.run.__name__.endswith("_run")
        assert cmd.add.__module__ == cmd.run.__module__ and cmd.add.__name__[:-4] == cmd.run.__name__[:-4]


def test_ctrl_c_while_the_parser_loads_is_one_line(monkeypatch, capsys):
    """Ctrl-C in the first seconds (torch importing while the parser is built) was a KeyboardInterrupt
    traceback through the import machinery."""
    from bertforge import cli

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["pretrain", "--config", "x"]) == 130
    assert capsys.readouterr().err == "bertforge pretrain: interrupted\n"
