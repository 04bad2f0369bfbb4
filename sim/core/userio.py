"""Reading the user's files: one error path for every command.

- `read_text`: a file as UTF-8 (a byte-order mark is allowed), at most a size limit; unreadable, too large
  or non-UTF-8 files are UserErrors naming the file.
- `load_yaml` / `load_json`: parsed documents whose size, nesting depth and alias expansion stay under
  sim/core/limits.py's limits; duplicate YAML keys are refused; syntax errors name the line.
- `dumps_finite`: JSON out without Infinity or NaN. Where output files go: sim/core/outfiles.py.
- `snapshot_files` / `pinned_files`: a sweep reads every referenced file once; inside `pinned_files` every
  read of those paths (and `is_file`) sees the snapshot's bytes, so each configuration is computed from
  exactly the content its digest describes, even if the file is edited while the sweep runs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType

import yaml

from meshsim.sim.core.errors import CommandFailed, FilePath, UserError
from meshsim.sim.core.limits import (
    MAX_JSON_BYTES,
    MAX_NESTING,
    MAX_NUMBER_DIGITS,
    MAX_YAML_BYTES,
    MAX_YAML_NODES,
)

# ----- reading ---------------------------------------------------------------------------------------
FileSnapshot = Mapping[str, bytes | None]  # normalized path -> its bytes, or None: missing when read
_NOTHING_PINNED: FileSnapshot = MappingProxyType({})
_PINNED: ContextVar[FileSnapshot] = ContextVar("meshsim_pinned_files", default=_NOTHING_PINNED)


def _key(path: str | Path) -> str:
    return os.path.normpath(str(path))


def snapshot_files(paths: Iterable[str | Path], max_bytes: int = MAX_YAML_BYTES) -> dict[str, bytes | None]:
    """Each path's bytes, read once now (None when it cannot be read; an oversized file keeps its first
    max_bytes + 1 bytes so that read_text still refuses it with the size)."""
    snapshot: dict[str, bytes | None] = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                snapshot[_key(path)] = fh.read(max_bytes + 1)
        except OSError:
            snapshot[_key(path)] = None
    return snapshot


@contextmanager
def pinned_files(snapshot: FileSnapshot | None) -> Iterator[None]:
    """Inside the block, reads of the snapshot's paths return its bytes instead of the disk's."""
    token = _PINNED.set({**_PINNED.get(), **(snapshot or {})})
    try:
        yield
    finally:
        _PINNED.reset(token)


def is_file(path: str | Path) -> bool:
    """Path.is_file(), or what the pinned snapshot says about the path."""
    pinned = _PINNED.get()
    key = _key(path)
    return pinned[key] is not None if key in pinned else Path(path).is_file()


def _read_bytes(path: Path, max_bytes: int, field: str, where: str) -> bytes:
    """The file's bytes (the pinned snapshot's when it holds the path); UserError if unreadable or too large."""
    pinned = _PINNED.get()
    key = _key(path)
    try:
        if key in pinned:
            data = pinned[key]
            if data is None:
                raise FileNotFoundError("it could not be read when the sweep started")
            size = len(data)
        else:
            size = path.stat().st_size
            data = path.read_bytes() if size <= max_bytes else b""
    except OSError as exc:
        raise UserError(field, FilePath(path), "check the path", source=where,
                        problem=f"Cannot read the file ({exc.strerror or exc})") from None
    if size > max_bytes:
        raise UserError(field, FilePath(path), "give a smaller file", source=where,
                        problem=f"The file is {size:,} bytes; meshsim reads at most {max_bytes:,} (README, Limits)")
    return data


def read_text(path: str | Path, *, field: str = "file", source: str | None = None,
              max_bytes: int = MAX_YAML_BYTES) -> str:
    """The file's text, decoded as UTF-8; UserError if it is missing, a directory, too large or not UTF-8."""
    path = Path(path)
    where = source or str(path)
    data = _read_bytes(path, max_bytes, field, where)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(field, FilePath(path), "save the file as UTF-8 text", source=where,
                        problem=f"Not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})") from None


_SAFE_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when PyYAML was built with it


class StrictLoader(_SAFE_BASE):
    """safe_load (libyaml-backed when available) that rejects a key given twice in one mapping (plain YAML
    keeps the last silently)."""


def _mapping_without_duplicates(loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A mapping whose keys are plain values (a list or mapping as a key, `? [a, b]`, is refused: no meshsim
    field is named by one, and Python cannot hash it) and given once each."""
    seen: set = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
            raise yaml.constructor.ConstructorError(
                None, None, f"a {kind} used as a key; keys are names (`key: value`)", key_node.start_mark)
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _bounded_int(loader, node: yaml.ScalarNode) -> int:
    """YAML's int, refused beyond MAX_NUMBER_DIGITS digits (Python would read 4,300 digits, then fail)."""
    digits = sum(c.isdigit() for c in node.value)
    if digits > MAX_NUMBER_DIGITS:
        raise yaml.constructor.ConstructorError(None, None, f"an integer of {digits:,} digits; numbers have at "
                                                f"most {MAX_NUMBER_DIGITS} (README, Limits)", node.start_mark)
    return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)


StrictLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def yaml_error(exc: Exception, text: str, source: str) -> UserError:
    """A YAML syntax error -> UserError naming the line, its text and the parser's complaint."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    if mark is None:
        return UserError("(file)", source, "fix the YAML syntax", source=source,
                         problem=f"YAML syntax error: {problem}")
    lines = text.splitlines()
    line = lines[mark.line].strip() if mark.line < len(lines) else ""
    return UserError(f"line {mark.line + 1}", line, f"fix the YAML at line {mark.line + 1}, column "
                     f"{mark.column + 1} (`key: value` pairs; nested sections indented with spaces)",
                     source=source, problem=f"YAML syntax error: {problem}")


def _too_deep(source: str, kind: str) -> UserError:
    return UserError("(file)", f"nesting > {MAX_NESTING}", f"flatten the {kind}: sections and lists nest at most {MAX_NESTING} deep",
                     source=source, problem=f"Nested more than {MAX_NESTING} levels (README, Limits)")


def check_shape(data: object, source: str, kind: str = "YAML") -> None:
    """Refuse documents nested deeper than MAX_NESTING or holding more than MAX_YAML_NODES values, counting
    a shared (aliased) value at each use: a 1 KB alias bomb expands to billions of values downstream."""
    stack: list[tuple[object, int]] = [(data, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise UserError("(file)", source, f"give a smaller {kind} document (aliases count at each use)",
                            source=source, problem=f"More than {MAX_YAML_NODES:,} values (README, Limits)")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        if children and depth >= MAX_NESTING:
            raise _too_deep(source, kind)
        stack.extend((child, depth + 1) for child in children)
        if isinstance(node, dict):
            stack.extend((key, depth + 1) for key in node)


def load_yaml(path: str | Path, *, field: str = "file", source: str | None = None) -> object:
    """Read, parse and shape-check a YAML file (safe tags only, no duplicate keys)."""
    where = source or str(path)
    return parse_yaml(read_text(path, field=field, source=where), where)


def _check_event_depth(text: str, where: str) -> None:
    """Refuse nesting deeper than MAX_NESTING from the parser's events, before any node is composed:
    libyaml's composer recurses in C once per level, so 100k nested brackets overflow the C stack (a
    crash, not a RecursionError); its event parser keeps an explicit stack and is safe at any depth."""
    depth = 0
    for event in yaml.parse(text, Loader=StrictLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise _too_deep(where, "YAML")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_yaml(text: str, where: str) -> object:
    """YAML text (of the file `where`) -> the shape-checked document."""
    try:
        _check_event_depth(text, where)
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise yaml_error(exc, text, where) from None
    except RecursionError:
        raise _too_deep(where, "YAML") from None
    check_shape(data, where)
    return data


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-')):,} digits; numbers have at most {MAX_NUMBER_DIGITS}")
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _json_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows (meshsim never writes it)")


def parse_json(text: str, where: str, *, field: str = "file", fix: str = "give a JSON file meshsim wrote") -> object:
    """JSON text -> the document: integers of at most MAX_NUMBER_DIGITS digits, finite floats only (no
    Infinity / NaN), nested at most MAX_NESTING deep; anything else a UserError."""
    try:
        data = json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except json.JSONDecodeError as exc:
        raise UserError(field, where, fix, source=where,
                        problem=f"Not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise _too_deep(where, "JSON") from None
    except ValueError as exc:
        raise UserError(field, where, fix, source=where, problem=f"Not a plain JSON number: {exc}") from None
    check_depth(data, where, "JSON")
    return data


def check_depth(data: object, source: str, kind: str = "JSON", start: int = 1) -> None:
    """Refuse documents nested deeper than MAX_NESTING (json.loads itself reads ~1,000 levels); `start`:
    the depth of `data` itself within its document."""
    stack: list[tuple[object, int]] = [(data, start)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        if children and depth >= MAX_NESTING:
            raise _too_deep(source, kind)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def load_json(path: str | Path, *, field: str = "file", fix: str = "give a JSON file meshsim wrote",
              source: str | None = None) -> object:
    """Read, parse and shape-check a JSON file (parse_json; size by MAX_JSON_BYTES)."""
    where = source or str(path)
    text = read_text(path, field=field, source=where, max_bytes=MAX_JSON_BYTES)
    return parse_json(text, where, field=field, fix=fix)


def dumps_finite(data: object, **kwargs) -> str:
    """json.dumps that never writes Infinity or NaN (allow_nan=False): a non-finite number at the output
    boundary is a bug, reported as one line naming its key, never a file a reader cannot parse."""
    try:
        return json.dumps(data, allow_nan=False, **kwargs)
    except ValueError:
        raise CommandFailed(f"internal error: a non-finite number at {_non_finite_path(data)} would be "
                            "written as JSON; nothing was written (please report it)") from None


def _non_finite_path(data: object, path: str = "") -> str:
    if isinstance(data, float) and not math.isfinite(data):
        return path or "(top level)"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for key, value in items:
        found = _non_finite_path(value, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key))
        if found:
            return found
    return ""
