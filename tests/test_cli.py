import json
import subprocess
import sys

import pytest

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


def test_every_available_command_has_help():
    for cmd in cli.COMMANDS:
        if cli._available(cmd):
            out = run(cmd.name, "--help").stdout
            assert "usage: bertforge" in out


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


@pytest.mark.parametrize("cmd", [c for c in cli.COMMANDS])
def test_dispatch_table_targets_resolve(cmd):
    if not cli._available(cmd):
        pytest.skip(f"{cmd.name} has not landed")
    add, run_ = cli._resolve(cmd)
    assert callable(add) and callable(run_)
