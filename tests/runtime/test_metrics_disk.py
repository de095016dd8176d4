"""A full disk while appending a metrics row is one line naming the file, and earlier rows stay readable."""

from __future__ import annotations

import errno
import io

import pytest

from bertforge.errors import UserError
from bertforge.runtime.metrics import MetricsLogger, read_jsonl


class _FullAfter:
    """A text file that accepts `rows` writes, then fails as a full disk does."""

    def __init__(self, fh, rows: int):
        self.fh, self.rows, self.name = fh, rows, fh.name

    def write(self, text: str) -> int:
        if self.rows <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.rows -= 1
        return self.fh.write(text)

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def test_a_full_disk_while_logging_is_one_line(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False, stream=io.StringIO())
    logger._jsonl = _FullAfter(logger._jsonl, rows=1)
    logger.log(1, {"loss": 2.0})
    with pytest.raises(UserError) as e:
        logger.log(2, {"loss": 1.5})
    msg = str(e.value)
    assert "no space left" in msg and "metrics.jsonl" in msg and "\n" not in msg
    logger.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]
