"""Pydantic's first validation error -> one UserError naming the file, the field path, the value and the fix
(unknown keys get the closest valid name). Used for scenarios, hardware profiles and custom topologies."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import get_args

from pydantic import BaseModel, ValidationError

from meshsim.sim.core.errors import UserError, closest


class _Absent:
    def __repr__(self) -> str:
        return "(missing)"


MISSING = _Absent()


def _submodel(annotation: object) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (X, X | None, list[X]), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _walk(root: type[BaseModel], loc: tuple) -> tuple[str, type[BaseModel] | None]:
    """Dotted path of an error location (pydantic's union-member tags dropped) and the model it ends in."""
    path, model = "", root
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif model is not None and part in model.model_fields:
            path = f"{path}.{part}" if path else part
            model = _submodel(model.model_fields[part].annotation)
    return path, model


def _phrase(err: dict) -> str:
    """The constraint an input failed, in words ('a whole number', 'a value greater than 0')."""
    kind, ctx = err["type"], err.get("ctx", {})
    bounds = {"greater_than": ("greater than", "gt"), "greater_than_equal": ("of at least", "ge"),
              "less_than": ("less than", "lt"), "less_than_equal": ("of at most", "le")}
    if kind in bounds:
        words, key = bounds[kind]
        return f"a value {words} {ctx[key]}"
    if kind == "out_of_range":  # sim/core/quantities.py: the plausible range, in words
        return err["msg"]
    if kind == "finite_number":
        return "a finite number"
    if kind == "literal_error":
        expected = ctx["expected"]
        return f"one of {expected}" if "," in expected or " or " in expected else expected
    for prefix, words in (("int_", "a whole number"), ("float_", "a number"), ("bool_", "true or false"),
                          ("string_", "text"), ("list_", "a list, e.g. [1, 2]"), ("dict_", "a section of keys"),
                          ("model_", "a section of keys")):
        if kind.startswith(prefix):
            return words
    return f"valid input ({err['msg']})"


def _unknown_key(root: type[BaseModel], err: dict, source: str,
                 key_fix: Callable[[str], str | None] | None = None) -> UserError:
    parent, model = _walk(root, err["loc"][:-1])
    key = str(err["loc"][-1])
    names = sorted(model.model_fields) if model else []
    where = f"section {parent}" if parent else "the top level"
    fix = key_fix(key) if key_fix else None
    if fix is None:
        guess = closest(key, names)
        hint = f"did you mean {guess!r}? " if guess else ""
        fix = f"{hint}valid keys in {where}: {', '.join(names)}"
    return UserError(f"{parent}.{key}" if parent else key, err["input"], fix, source=source,
                     problem=f"Unknown key {key!r} in {where}")


def _case_fix(path: str, err: dict) -> str | None:
    """'set PATH to 'rmsnorm'' when a refused value differs from an accepted one only in case ('RMSNorm')."""
    value = err["input"]
    if err["type"] != "literal_error" or not isinstance(value, str):
        return None
    accepted = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
    meant = [a for a in accepted if a.lower() == value.strip().lower()]
    return f"set {path} to {meant[0]!r} (values are lower case)" if meant else None


def _missing(path: str, source: str) -> UserError:
    parent, _, key = path.rpartition(".")
    where = f"under {parent}:" if parent else "at the top level"
    return UserError(path, MISSING, f"add `{key}: ...` {where} (fields: docs/scenarios.md)", source=source,
                     problem="Required field is missing")


def schema_error(exc: ValidationError, root: type[BaseModel], source: str,
                 other_name_fix: Callable[[str, object], str | None] | None = None,
                 key_fix: Callable[[str], str | None] | None = None) -> UserError:
    """Translate pydantic's first error (unknown keys first: they usually explain missing ones) into a
    UserError; errors of the same field from the members of a union are merged ('a whole number or
    'auto''). `other_name_fix(path, value)`: the fix when a refused value is another tool's name for an
    accepted one (scenarios/value_names.py), else None; `key_fix(key)` likewise for an unknown key (another
    tool's name for a field)."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    if first["type"] == "extra_forbidden":
        return _unknown_key(root, first, source, key_fix)
    path, _ = _walk(root, first["loc"])
    if first["type"] == "missing":
        return _missing(path, source)
    same = [e for e in errors if _walk(root, e["loc"])[0] == path and e["type"] != "missing"]
    phrases = " or ".join(dict.fromkeys(_phrase(e) for e in same))
    fix = _case_fix(path, first) or (other_name_fix(path, first["input"]) if other_name_fix and
                                     first["type"] == "literal_error" else None)
    return UserError(path or "(top level)", first["input"], fix or f"set {path or 'the file'} to {phrases}",
                     source=source, problem=f"Expected {phrases}")
