"""--config that is not a YAML file: one line saying what is wrong with it (not a UnicodeDecodeError traceback,
not "does not exist" for a directory)."""

from __future__ import annotations

import os

import pytest

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.errors import ConfigError


def test_a_binary_file_is_not_text(tmp_path):
    f = tmp_path / "random.bin"
    f.write_bytes(b"\xff\xfe" + os.urandom(64))
    with pytest.raises(ConfigError, match=rf"^config file {f} is not text \(byte 0 is not UTF-8\); pass a YAML file"):
        load_config("pretrain", f)


def test_a_directory_is_said_to_be_one(tmp_path):
    with pytest.raises(ConfigError, match=rf"^config {tmp_path} is a directory; pass a YAML file or a preset name$"):
        load_config("pretrain", tmp_path)


@pytest.mark.parametrize("what", ["directory", "binary"])
def test_the_cli_prints_one_line(tmp_path, capsys, what):
    config = tmp_path
    if what == "binary":
        config = tmp_path / "x.yaml"
        config.write_bytes(b"\x80\x81")
    assert main(["pretrain", "--config", str(config), "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        f"bertforge pretrain: error: config {'file ' * (what == 'binary')}"
    ), err
