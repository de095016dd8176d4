"""A `tritonclient` client for `bertforge serve` (HTTP or gRPC), used by `bertforge predict` and the tests."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertforge.errors import UserError
from bertforge.serve.tasks import TASKS


def server_message(err: Exception) -> str:
    """The useful line of a Triton error: `bertforge serve` sends one line; a served function that fails outside
    its per-request handling (or a server without bertforge's proxy patch) sends PyTriton's whole traceback."""
    text = str(err)
    m = re.findall(r"RequestError: (.*)", text)
    if m:
        return m[-1].strip()
    return text.strip().splitlines()[-1] if text.strip() else repr(err)


# host:port (a name, an IPv4 address or a bracketed IPv6 one), and for HTTP an optional base path
_URL = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]{1,5})(?P<path>/\S*)?")


def check_url(url: str, protocol: str) -> None:
    """A server address as tritonclient takes it, or a UserError naming --url and the form it needs."""
    m = _URL.fullmatch(url)
    if m is None or not 1 <= int(m["port"]) <= 65535 or (m["path"] and protocol == "grpc"):
        form = "host:port" if protocol == "grpc" else "host:port[/base-path]"
        raise UserError(f"--url {url!r} is not a {protocol} server address ({form}, e.g. 127.0.0.1:8000)")


class Client:
    """Sends string rows to one task of a running server; returns the output arrays."""

    def __init__(self, url: str = "127.0.0.1:8000", protocol: str = "http", timeout_s: float = 60.0):
        if protocol not in ("http", "grpc"):
            raise UserError(f"protocol must be http or grpc, not {protocol!r}")
        url = re.sub(r"^(https?|grpc)://", "", url)
        check_url(url, protocol)  # tritonclient's own error is a ValueError, then an AttributeError from __del__
        self.protocol, self.url, self.timeout_s = protocol, url, timeout_s
        if protocol == "http":
            import tritonclient.http as mod

            self._client = mod.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)
        else:
            import tritonclient.grpc as mod

            self._client = mod.InferenceServerClient(url)
        self._mod = mod

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def infer_raw(
        self,
        model_name: str,
        arrays: dict[str, np.ndarray],
        datatypes: dict[str, str] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Send arrays as they are (tests use this to send malformed requests); returns `outputs`, or every output
        the server answered."""
        inputs = []
        for name, arr in arrays.items():
            dt = (datatypes or {}).get(name) or (
                "BYTES"
                if arr.dtype == object
                else {"float32": "FP32", "int64": "INT64", "int32": "INT32"}[str(arr.dtype)]
            )
            inp = self._mod.InferInput(name, list(arr.shape), dt)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        # http: the connection/network timeouts set above apply; grpc takes a per-call deadline
        kw = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        res = self._client.infer(model_name, inputs, **kw)  # no outputs asked for: the server sends all of them
        answer = res.get_response(as_json=True) if self.protocol == "grpc" else res.get_response()
        names = outputs or [o["name"] for o in answer["outputs"]]
        return {n: res.as_numpy(n) for n in names}

    def metadata(self, model_name: str) -> dict[str, Any]:
        md = self._client.get_model_metadata(model_name)
        if self.protocol == "grpc":
            from google.protobuf.json_format import MessageToDict

            md = MessageToDict(md, preserving_proto_field_name=True)
        return md

    def infer(self, task: str, **columns: Sequence[str]) -> dict[str, np.ndarray]:
        """`infer("qa", question=[...], context=[...])`: one request, one row per string; the model's outputs (a
        regression model served as classify answers `score` alone)."""
        if task not in TASKS:
            raise UserError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        spec = TASKS[task]
        arrays = {}
        for io in spec.inputs:
            col = columns.get(io.name)
            if col is None:
                if not io.optional:
                    raise UserError(f"task {task} needs input {io.name!r}")
                continue
            if isinstance(col, (str, bytes)):  # a bare string would be sent as one row per character
                raise UserError(f"input {io.name!r} must be a list of strings, one per row: pass [{col!r}]")
            bad = [s for s in col if not isinstance(s, str)]
            if not col or bad:  # were an AttributeError from .encode, and Triton's "expected shape [-1,1], got [0]"
                what = f"holds {type(bad[0]).__name__} {bad[0]!r:.40}" if bad else "has no rows"
                raise UserError(f"input {io.name!r} {what}; pass a non-empty list of strings, one per row")
            arrays[io.name] = np.array([[s.encode("utf-8")] for s in col], dtype=object)  # (B, 1)
        unknown = set(columns) - {io.name for io in spec.inputs}
        if unknown:
            raise UserError(
                f"task {task} has no inputs {sorted(unknown)}; it takes {', '.join(io.name for io in spec.inputs)}"
            )
        return self.infer_raw(spec.model_name, arrays)


def rows_as_json(task: str, out: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Output arrays as one JSON-able dict per row."""
    n = len(next(iter(out.values())))
    rows = []
    for i in range(n):
        if task == "qa":
            rows.append({"answer": out["answer"][i][0].decode(), "score": float(out["score"][i][0])})
        elif task == "classify" and "score" in out:  # a regression model: its one output, or each of several
            scores = [float(v) for v in out["score"][i]]  # (only the first was printed: the others were lost)
            rows.append({"score": scores[0] if len(scores) == 1 else scores})
        elif task == "classify":
            rows.append(
                {
                    "label": out["label"][i][0].decode(),
                    "label_id": int(out["label_id"][i][0]),
                    "probabilities": [float(p) for p in out["probabilities"][i]],
                }
            )
        elif task == "embed":
            rows.append({"embedding": [float(x) for x in out["embedding"][i]]})
        else:
            masks = []
            for m in range(out["token_ids"].shape[1]):
                if out["token_ids"][i][m][0] < 0:
                    continue
                masks.append(
                    [
                        {"token": t.decode(), "token_id": int(j), "score": float(s)}
                        for t, j, s in zip(out["tokens"][i][m], out["token_ids"][i][m], out["scores"][i][m])
                    ]
                )
            rows.append({"masks": masks})
    return rows
