"""The machinery under coa.config: errors that name the key, field help, building a frozen dataclass
from a mapping (unknown and missing keys, types, nested sections, the key path of every error), seeds.

    from coa.config.kit import build, to_dict
    cfg = build(SftConfig, {"lr": 1e-4, ...}, "sft")   # -> SftConfig, or ConfigError("sft.lr: ...")

A section's ``__post_init__`` validates its own fields with ``_require(ok, "field", "how to fix")``;
``build`` puts the section's path in front of the field, so a section used in many places (an
``engine:``) reports where it sits. coa.config.sections declares the sections; this module knows none of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A params problem; the message names the key and says how to fix it."""


def _help(text: str, **kw: Any) -> Any:
    return field(metadata={"help": text}, **kw)


def _require(ok: bool, key: str, message: str) -> None:
    """Raise ConfigError("key: message") unless ok. In a ``__post_init__`` the key is the field's own name
    (``max_batch``, ``splits.eval``); ``build`` puts the section's path in front (``rl.engine.max_batch``)."""
    if not ok:
        raise ConfigError(f"{key}: {message}")


def derive_seed(seed: int, *names: str) -> int:
    """A stable 31-bit seed for one named random choice, derived from `common.seed`.

    Every random choice in the pipeline takes its seed from here, so one number drives them all
    and two choices never share a stream.
    """
    digest = hashlib.sha256(":".join([str(seed), *names]).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; build nested dataclasses. Ints pass as floats."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for tp_i in inner:  # the first the value fits (int | dict[str, int]: a number, or one per key)
            try:
                return _coerce(tp_i, value, key)
            except ConfigError as e:
                errors.append(str(e))
        if len(inner) == 1:
            raise ConfigError(errors[0])
        raise ConfigError(f"{key}: {value!r} fits none of its forms: "
                          + "; or ".join(e.removeprefix(f"{key}: ") for e in errors))
    if origin is Literal:
        _require(value in args, key, f"must be one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        _require(isinstance(value, list), key, f"must be a list, got {type(value).__name__}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _require(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return {_coerce(args[0], k, key): _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        _require(ok, key, f"must be a number, got {value!r}")
        return float(value)
    if tp is int:
        _require(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp is bool:
        _require(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is str:
        _require(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"{key}: unsupported annotation {_type_name(tp)}")


def build(cls: type, data: Any, key: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and reporting missing ones."""
    _require(isinstance(data, dict), key or "params", f"must be a mapping of {cls.__name__} fields, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    prefix = f"{key}." if key else ""
    for name in data:
        if name not in known:
            close = difflib.get_close_matches(str(name), list(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{prefix}{name}: unknown key; {hint}allowed keys: {', '.join(known)}")
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            _require(has_default, f"{prefix}{name}", f"missing; add it ({f.metadata.get('help', '')})")
            continue
        kwargs[name] = _coerce(hints[name], data[name], f"{prefix}{name}")
    try:
        return cls(**kwargs)
    except ConfigError as err:  # a validator names its own field; where the section sits is known here
        raise ConfigError(f"{prefix}{err}") from None


def to_dict(cfg: Any) -> Any:
    """The resolved config as plain data (saved beside every checkpoint, logged to MLflow)."""
    return dataclasses.asdict(cfg)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are indexed (sources.0.kind); an empty list is a value."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(data, list) and data:
        for i, v in enumerate(data):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = data
    return out


def load_yaml(cls: type, path: str | Path, overrides: dict[str, Any] | None = None) -> Any:
    """Read a YAML file and build ``cls`` from it. `overrides` maps dotted keys to values (tests, CLIs)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such params file; run from the repository root or pass --params")
    data = yaml.safe_load(path.read_text()) or {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return build(cls, data, "")
