"""Typed configuration: dataclasses with a docstring per field, YAML presets, `--set` overrides, validation.

A config is a tree of dataclasses. Each stage owns its top-level class (see `CONFIG_KINDS`); sections shared
between stages (the model) live here. A preset is a YAML file under `configs/<kind>/NAME.yaml` and is data
only: every key must name a field, unknown keys are rejected with a did-you-mean suggestion, values are
coerced to the field's type, and every dataclass's `validate()` runs after the tree is built.

    cfg = load_config("pretrain", "demo_tiny_128", ["train.max_steps=50"])
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from bertforge.errors import ConfigError

# kind -> "module:Class"; the module is imported only when that kind is loaded.
CONFIG_KINDS: dict[str, str] = {
    "pretrain": "bertforge.train.config:PretrainConfig",
    "data": "bertforge.data.config:DataPrepConfig",
    "finetune": "bertforge.finetune.config:FinetuneConfig",
}

# Presets ship inside the package (so an installed wheel has them); the repository's top-level `configs/`
# is a link to this folder.
PRESET_DIR = Path(__file__).parent / "configs"


# ----------------------------------------------------------------------------------------------- sections
@dataclasses.dataclass
class ModelConfig:
    """The model to build or load; the architecture comes from a preset in `bertforge.model.config`."""

    preset: str = "tiny"
    """Size preset: tiny, mini, small, medium, base or large (see MODEL_PRESETS)."""
    init_from: str | None = None
    """Hugging Face-format model directory to initialise the weights from (None: random init)."""
    vocab_size: int | None = None
    """Vocabulary size; None takes the size of the data's vocab (or 30522)."""
    max_position_embeddings: int = 512
    """Number of learned position embeddings (the longest sequence the model accepts)."""
    hidden_dropout: float = 0.1
    """Dropout on embeddings and sub-layer outputs."""
    attention_dropout: float = 0.1
    """Dropout on attention probabilities."""
    attention: str = "auto"
    """Attention kernel: auto (varlen where available, else sdpa), sdpa, varlen or eager (the reference)."""
    activation_checkpointing: bool = False
    """Recompute each encoder layer in the backward pass to save activation memory."""
    compile: bool = False
    """Wrap the model in torch.compile."""

    def validate(self) -> None:
        from bertforge.model.config import MODEL_PRESETS

        if self.preset not in MODEL_PRESETS:
            raise ConfigError(
                f"model.preset: unknown preset {self.preset!r}{_did_you_mean(self.preset, MODEL_PRESETS)}; "
                f"choose one of {', '.join(MODEL_PRESETS)}"
            )
        if self.attention not in ("auto", "sdpa", "varlen", "eager"):
            raise ConfigError(f"model.attention must be auto, sdpa, varlen or eager, not {self.attention!r}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.vocab_size is not None and self.vocab_size < 8:
            raise ConfigError(f"model.vocab_size must be at least 8, got {self.vocab_size}")


# ------------------------------------------------------------------------------------------- machinery
def _did_you_mean(name: str, choices: Sequence[str] | Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (read from its source)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def config_class(kind: str) -> type:
    if kind not in CONFIG_KINDS:
        raise ConfigError(f"unknown config kind {kind!r}{_did_you_mean(kind, CONFIG_KINDS)}")
    module, _, name = CONFIG_KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def list_presets(kind: str) -> list[str]:
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.yaml"))


def find_preset(kind: str, name_or_path: str | Path) -> Path:
    """`NAME` finds configs/<kind>/NAME.yaml; anything that exists as a file is read as a path."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    preset = PRESET_DIR / kind / f"{name_or_path}.yaml"
    if preset.is_file():
        return preset
    if path.suffix in (".yaml", ".yml") or "/" in str(name_or_path):
        raise ConfigError(f"config file {name_or_path} does not exist")
    names = list_presets(kind)
    raise ConfigError(
        f"no {kind} preset named {str(name_or_path)!r}{_did_you_mean(str(name_or_path), names)}; "
        f"presets: {', '.join(names) or '(none)'}; or pass a path to a YAML file"
    )


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) != len(typing.get_args(tp))
    return tp, False


def _coerce(value: Any, tp: Any, key: str) -> Any:
    tp, optional = _strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "~")):
        if optional:
            return None
        raise ConfigError(f"{key}: a value is required (got null)")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, key + ".")
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
                return value.lower() in ("true", "yes", "on", "1")
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise ValueError
        if tp is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if origin in (list, tuple):
            (item_tp, *rest) = typing.get_args(tp) or (Any,)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise ValueError
            if origin is tuple and rest and rest[0] is not Ellipsis:
                items = [_coerce(v, t, key) for v, t in zip(value, typing.get_args(tp), strict=True)]
            else:
                items = [_coerce(v, item_tp, key) for v in value]
            return origin(items)
        if origin is dict or tp is dict:
            if not isinstance(value, Mapping):
                raise ValueError
            return dict(value)
        if tp is Any:
            return value
    except (ValueError, TypeError):
        name = getattr(tp, "__name__", str(tp))
        raise ConfigError(f"{key}: expected {name}, got {value!r}") from None
    return value


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"unknown config key '{prefix}{key}'{_did_you_mean(str(key), fields)}; "
                f"valid keys here: {', '.join(fields)}"
            )
    kwargs = {name: _coerce(data[name], hints[name], prefix + name) for name in fields if name in data}
    return cls(**kwargs)


def _set_path(data: dict[str, Any], cls: type, dotted: str, raw: str) -> None:
    """Put one `a.b.c=value` override into the raw dict, checking every key against the dataclasses."""
    parts = dotted.split(".")
    node, node_cls, prefix = data, cls, ""
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(node_cls)}
        if part not in fields:
            raise ConfigError(
                f"--set {dotted}: unknown key '{prefix + part}'{_did_you_mean(part, fields)}; "
                f"valid keys here: {', '.join(fields)}"
            )
        tp, _ = _strip_optional(typing.get_type_hints(node_cls)[part])
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                raise ConfigError(f"--set {dotted}: {prefix + part!r} is a section; set one of its keys")
            node[part] = yaml.safe_load(raw) if raw.strip() else ""
            return
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"--set {dotted}: {prefix + part!r} is a value, not a section")
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {prefix + part!r} is not a mapping in the config file")
        node_cls, prefix = tp, prefix + part + "."


def validate_tree(obj: Any) -> None:
    """Run `validate()` on every nested dataclass, innermost first, then on `obj` itself."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate_tree(value)
    if hasattr(obj, "validate"):
        obj.validate()


def build_config(cls: type, data: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()) -> Any:
    """Build and validate a config of class `cls` from a raw mapping plus `key=value` overrides."""
    data = _deep_copy(data or {})
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        _set_path(data, cls, key.strip(), raw)
    cfg = _build(cls, data)
    validate_tree(cfg)
    return cfg


def load_config(kind: str, name_or_path: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
    """Load preset NAME (or a YAML file) of the given kind, apply overrides, validate."""
    cls = config_class(kind)
    data: dict[str, Any] = {}
    if name_or_path is not None:
        path = find_preset(kind, name_or_path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    try:
        return build_config(cls, data, overrides)
    except ConfigError as e:
        where = f" (in {name_or_path})" if name_or_path is not None else ""
        raise ConfigError(f"{e}{where}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, docstring) for every leaf field of a config class: the text of `--help`'s key list."""
    rows = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        tp, _ = _strip_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, prefix + f.name + ".")
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "")  # type: ignore[misc]
            rows.append((prefix + f.name, repr(default), docs.get(f.name, "")))
    return rows
