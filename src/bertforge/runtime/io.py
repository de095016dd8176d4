"""The one atomic writer (DESIGN §6): every output is written under a temporary name, flushed, and renamed into
place, so a killed run never leaves a half-written file or directory that looks complete.

    with atomic_path("out/shard_0.hdf5") as tmp:      # any writer: h5py, safetensors, savefig, ...
        write_somehow(tmp)
    write_text("out/summary.json", json.dumps(summary))
    with atomic_dir("runs/x/best") as tmp:             # a whole directory, replacing an older one
        save_pretrained(model, tmp)

The temporary name is hidden (`.NAME.tmp-PID`) and sits beside the target, on the same filesystem, so the
rename is atomic. A directory that already exists is moved aside first and removed after the new one is in
place: at every instant one complete copy exists. `commit` is the only function in bertforge that renames a
temporary file into place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from bertforge.errors import UserError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def temp_name(path: str | os.PathLike, tag: str = "tmp") -> Path:
    """A hidden sibling of `path` unique to this process: `.NAME.tmp-PID` (keeps the suffix last, so writers
    that pick a format from it, like matplotlib, still see `.png`)."""
    p = Path(path)
    return p.with_name(f".{p.stem}.{tag}-{os.getpid()}{p.suffix}")


def fsync_tree(path: Path) -> None:
    """Flush a file, or a directory's files and entries, so a rename after a crash never points at unwritten
    data."""
    paths = [path] if path.is_file() else [*(p for p in path.rglob("*") if p.is_file()), path]
    for p in paths:
        _fsync_one(p)


def commit(tmp: Path, final: Path) -> None:
    """Rename a finished temporary file or directory onto `final`, replacing what is there."""
    fsync_tree(tmp)
    if tmp.is_dir() and final.exists():
        old = temp_name(final, "old")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    else:
        os.replace(tmp, final)
    # the directory's entries only (the rename just made), not its files: a directory holding thousands of
    # committed files (parts of a Wikipedia run) must not be re-flushed file by file on every commit
    _fsync_one(final.parent)


def _fsync_one(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _discard(tmp: Path) -> None:
    # best effort: on a read-only or missing parent there is nothing to remove, and an error here would hide the
    # one that brought us here (unlink raises EROFS/ENOTDIR there even with missing_ok)
    with contextlib.suppress(OSError):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _atomic(path: str | os.PathLike, directory: bool) -> Iterator[Path]:
    final = Path(path)
    tmp = temp_name(final)
    _discard(tmp)
    try:
        if directory:
            tmp.mkdir(parents=True)
        yield tmp
        commit(tmp, final)
    except BaseException as e:
        _discard(tmp)
        raise_if_disk_full(e, final)
        raise_if_unwritable(e, tmp, final)
        raise


def is_disk_full(e: BaseException) -> bool:
    """A full disk or quota: an OSError ENOSPC/EDQUOT, a library's error that carries the OS message (h5py's
    OSError without errno, safetensors' SafetensorError), or an error raised while handling one."""
    seen: BaseException | None = e
    for _ in range(8):  # torch.save's writer reports the OSError it met as a RuntimeError with it as the context
        if seen is None or not isinstance(seen, Exception):
            return False
        if getattr(seen, "errno", None) in DISK_FULL or "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def raise_if_disk_full(e: BaseException, path: str | os.PathLike) -> None:
    """A full disk while writing `path` (its temporary file already removed) as one line: nothing earlier was
    touched, since every output is renamed into place only when complete."""
    if is_disk_full(e):
        raise UserError(
            f"no space left on the device while writing {_shown(path)}; it was not written (earlier outputs are "
            "intact): free some space and run the command again"
        ) from None


def raise_if_unwritable(e: BaseException, tmp: Path, path: str | os.PathLike) -> None:
    """An OSError of creating `tmp` or a file in it (read-only filesystem, no permission, a file where a
    directory should be) as one line naming `path`; errors of reading inputs inside the block stay as they are."""
    name = getattr(e, "filename", None)
    if isinstance(e, OSError) and name is not None and (Path(name) == tmp or tmp in Path(name).parents):
        raise UserError(
            f"cannot write {_shown(path)} ({e.strerror}); it was not written (earlier outputs are intact): "
            "choose a writable path"
        ) from None


def _shown(path: str | os.PathLike) -> Path:
    # what the user asked for, not a temporary name (atomic writers nest: a model dir in a checkpoint)
    return Path(*(re.sub(r"^\.(.+)\.(?:tmp|old)-\d+(.*)$", r"\1\2", part) for part in Path(path).parts))


def atomic_path(path: str | os.PathLike) -> contextlib.AbstractContextManager[Path]:
    """Yield a temporary path for a file; on success it replaces `path`, on error it is removed."""
    return _atomic(path, directory=False)


def atomic_dir(path: str | os.PathLike) -> contextlib.AbstractContextManager[Path]:
    """Yield a fresh temporary directory; on success it replaces `path` (an older directory is swapped out,
    never deleted before the new one is in place), on error it is removed."""
    return _atomic(path, directory=True)


def cache_dir() -> Path:
    """bertforge's cache of results measured or solved once per machine (the matmul peak, packing plans):
    $BERTFORGE_CACHE, else ~/.cache/bertforge."""
    return Path(os.environ.get("BERTFORGE_CACHE", Path.home() / ".cache" / "bertforge"))


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def read_json_object(path: Path, fix: str, label: str = "") -> dict:
    """A JSON object from a file we wrote; invalid JSON or another JSON value is one line naming the file
    (`label` before the path, e.g. "checkpoint ") and what to do (`fix`)."""
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{label}{path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(out, dict):
        raise UserError(f"{label}{path} does not hold a JSON object; {fix}")
    return out


def strict_json(obj: Any, **dumps: Any) -> str:
    """`obj` as JSON text with NaN and ±inf (a target never reached, a median of nothing) written as null:
    json.dumps would write NaN/Infinity, tokens strict parsers (jq, JavaScript, Go) reject. `dumps`: json.dumps'
    other arguments (indent, default)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return [clean(x) for x in v] if isinstance(v, (list, tuple)) else v

    return json.dumps(clean(obj), allow_nan=False, **dumps)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


_OLD = re.compile(r"^\.(?P<stem>.+)\.old-(?P<pid>\d+)(?P<suffix>(\.[^.]*)?)$")  # temp_name(final, "old")


def remove_stale(directory: str | os.PathLike) -> int:
    """Delete the temporary files and directories that killed runs left in `directory`; returns how many. An
    `.old` copy whose final name is missing is put back instead: `commit` renames the old output away before it
    renames the new one in, so a process killed between the two left the old one as the only complete copy (a
    checkpoint re-saved at its step, with keep_last 1: the run's only checkpoint)."""
    n = 0
    for p in [*Path(directory).glob(".*.tmp-*"), *Path(directory).glob(".*.gone-*")]:  # gone: being deleted
        _discard(p)
        n += 1
    for p in Path(directory).glob(".*.old-*"):
        if (m := _OLD.match(p.name)) and _alive(int(m["pid"])):
            continue  # a live writer between its two renames
        final = p.with_name(m["stem"] + m["suffix"]) if m else None
        if final is not None and not final.exists():
            with contextlib.suppress(OSError):
                p.rename(final)
                n += 1
                continue
        _discard(p)
        n += 1
    return n


def remove_dead_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of `path` (`temp_name`'s `.NAME.tmp-PID` beside it) whose process is gone: what a
    killed writer of that one output left. Others' temporaries in the same folder, and live ones, stay."""
    p = Path(path)
    gone = []
    for tmp in p.parent.glob(f".{glob_escape(p.stem)}.tmp-*{glob_escape(p.suffix)}"):
        pid = tmp.name[len(p.stem) + 6 :].removesuffix(p.suffix)
        if pid.isdigit() and not _alive(int(pid)):
            _discard(tmp)
            gone.append(tmp)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def delete_outputs(paths: Iterable[Path], out: Path, say=print, quiet: Iterable[str] = ()) -> None:
    """`--overwrite`: delete an earlier run's outputs `paths` (files and directories) in `out` and say which
    (`quiet`: names not worth saying, e.g. a record file)."""
    paths = list(paths)
    names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in paths if p.name not in set(quiet))
    for p in paths:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    say(f"--overwrite: deleted the earlier run's {names} in {out}")


def remove_earlier(directory: str | os.PathLike, prefix: str, suffix: str, keep: Iterable[str]) -> list[str]:
    """Delete the files `PREFIX<N>SUFFIX` in `directory` that are not in `keep` — what an earlier run of the same
    command wrote with more shards — so that a reader of the directory never takes them for this run's;
    returns their names."""
    pattern = re.compile(rf"{re.escape(prefix)}\d+{re.escape(suffix)}")
    kept = set(keep)
    gone = [p for p in Path(directory).iterdir() if pattern.fullmatch(p.name) and p.name not in kept and p.is_file()]
    for p in gone:
        p.unlink()
    return sorted((p.name for p in gone), key=lambda n: (len(n), n))


def writable_dir(path: str | os.PathLike, option: str = "path") -> Path:
    """Create directory `path` (and missing parents) and write a probe file in it, now, before any work: a path
    that is a file, on a read-only filesystem or without permission is one line naming it and `option` (the
    setting or flag that chose it)."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise UserError(f"output directory {d} is a file, not a directory; choose another {option}")
    probe = d / f".write-test-{os.getpid()}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        _discard(probe)
        raise UserError(f"output directory {d} is not writable ({e.strerror}); choose another {option}") from None
    return d


def read_input(path: Path, what: str, fix: str, not_a: str = "") -> bytes:
    """The bytes of input file `path`; missing, a directory or unreadable, it is one line naming it as `what`,
    with `fix` (and `not_a`, what a directory there is not: ", not a TSV file")."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist; {fix}") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a directory{not_a}; {fix}") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror}); {fix}") from None


def writable_file(path: str | os.PathLike, option: str) -> Path:
    """`path` can be written as a file (`writable_dir` of its directory, and not a directory itself); a one-line
    UserError naming `option` otherwise."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{option} {p} is a directory; name a file")
    writable_dir(p.parent, option)
    return p


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, option: str = "path") -> Iterator[Path]:
    """Create `path` (and missing parents) for a command's outputs, refused now when it cannot be written
    (`writable_dir`); if the command fails, the directories it created are removed again when they hold nothing
    (a failed run leaves no empty output directory behind), and a full disk is one line naming `path`."""
    d = Path(path)
    created = [p for p in (d, *d.parents) if not p.exists()]
    try:
        yield writable_dir(d, option)
    except BaseException as e:
        for p in created:  # deepest first
            if p.is_dir():
                remove_stale(p)
            with contextlib.suppress(OSError):
                p.rmdir()  # only when empty
        raise_if_disk_full(e, d)  # a write no atomic writer saw (a pack bucket, a spill file)
        raise


def check_open_files(n: int) -> None:
    """Writers that keep one file open per output shard: more than the process may open is refused before any
    work, not an OSError (EMFILE) after it."""
    try:
        import resource
    except ImportError:  # not on Unix: no limit to read
        return
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and n + 64 > soft:
        raise UserError(
            f"{n} shards need {n} files open at once and this process may open {soft} (`ulimit -n`): use fewer "
            "--shards/--eval-shards, or raise the limit"
        )


def refuse_empty_paths(
    flags: Iterable[tuple[str, str | None]],
    fix: str = "give it a value, or leave the flag out",
    error: type[UserError] = UserError,
) -> None:
    """(flag or key, value) pairs of paths: an empty value (`--out "$OUT"` with OUT unset) is refused in one line.
    Path("") is the working directory, and an empty value read as "not given" falls back to the default (no
    init checkpoint, no evaluation): either way the command would write or read somewhere the user did not name."""
    if empty := next((flag for flag, value in flags if value is not None and not str(value).strip()), None):
        raise error(f"{empty} is empty: {fix}")


def files_signature(tops: Iterable[Path]) -> str:
    """Where, how large and how recent the files under `tops` (files or directories) are, as one short hash:
    an output made from them is out of date once a file is added, replaced or edited, or when the same
    relative path names other files. Stat only: nothing is read."""
    import hashlib

    h = hashlib.sha256()
    for top in tops:
        for f in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if f.is_file():
                st = f.stat()
                h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:16]


def file_sha256(path: str | os.PathLike) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_SHA_MEMO: dict[tuple[str, int, int, int], str] = {}


def files_digest(files: Iterable[Path]) -> str:
    """The files' names and bytes, not their folders or times, as one short hash: a copy of the same files made
    elsewhere or at another time (a re-deployed dataset, a model copied without `cp -p`) has the same digest.
    Each file is read once per process while its size and mtime stay the same."""
    import hashlib

    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        key = (str(f.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _SHA_MEMO:
            _SHA_MEMO[key] = file_sha256(f)
        h.update(f"{f.name}:{_SHA_MEMO[key]}\n".encode("utf-8", "surrogateescape"))  # any file name
    return h.hexdigest()[:16]
