"""How gluontl reads a file it did not write this minute: one policy for every reader.

Recipes, data cards, run folders and datasets come from other people, so each read is bounded
and its failures are the caller's input error naming the file, never an internal error:

- YAML: ``SafeYamlLoader`` (PyYAML's safe loader without anchors/aliases, the "billion laughs"
  bomb, without explicit tags, and at most ``MAX_YAML_DEPTH`` levels deep), files of at most
  ``MAX_YAML_BYTES``.
- JSON: ``read_json`` refuses a file over its cap before reading it, and any nesting Python's
  parser cannot take.
- JSON lines (``metrics.jsonl``): ``read_json_lines`` skips a broken row and counts it; rows
  after it still count (a torn last line from kill -9 is one such row).
- File names that are not UTF-8 (bytes from old archives) come in as surrogate escapes
  (``os.fsdecode``); ``shown`` writes them as ``\\xff`` in messages, ``name_bytes`` hashes them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

MAX_YAML_BYTES = 1 << 20  # recipes and dataset cards are small text files
MAX_YAML_DEPTH = 64  # nesting levels of a YAML document; PyYAML's composer recurses once per level
MAX_TEXT_BYTES = 64 << 20  # label files, class lists, hosts files: small text
MAX_JSON_BYTES = 64 << 20  # run-folder records, cards, cache records: kilobytes in practice
MAX_JSON_LINES_BYTES = 256 << 20  # metrics.jsonl: ~200 bytes a row, a million logged steps


def shown(name: str | os.PathLike) -> str:
    """``name`` printable whatever its bytes: undecodable bytes (surrogate escapes) as ``\\xff``."""
    text = os.fsdecode(name) if not isinstance(name, str) else name
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def name_bytes(name: str) -> bytes:
    """The bytes of a file name as the file system holds them (for hashes and keys)."""
    return name.encode("utf-8", "surrogateescape")


class SafeYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (billion laughs), explicit tags (``!!python/...``,
    ``!!binary``, ``!!set``) or nesting deeper than ``MAX_YAML_DEPTH``: plain data only."""

    _depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.YAMLError(f"aliases (*{event.anchor}) are not allowed, line {event.start_mark.line + 1}")
        if getattr(event, "tag", None) not in (None, "!"):
            raise yaml.YAMLError(f"tags ({event.tag}) are not allowed, line {event.start_mark.line + 1}")
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels, line {event.start_mark.line + 1}")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_yaml(text: str, loader: type[SafeYamlLoader] = SafeYamlLoader) -> Any:
    """``text`` as plain data; every failure is a ``yaml.YAMLError``."""
    try:
        return yaml.load(text, Loader=loader)
    except RecursionError:  # flow collections nest in the parser too
        raise yaml.YAMLError("nested too deeply") from None


def read_text(path: str | Path, error: type[Exception], what: str = "text file", *,
              max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a file of at most ``max_bytes``, or ``error`` naming it."""
    path = Path(path)
    try:
        return _bytes(path, max_bytes, error, what).decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"Cannot read {what} '{shown(path)}': it is not UTF-8 text.") from None


def read_yaml(path: str | Path, error: type[Exception], what: str = "YAML file", *,
              max_bytes: int = MAX_YAML_BYTES, loader: type[SafeYamlLoader] = SafeYamlLoader) -> Any:
    """The plain data of a YAML file, or ``error`` naming it."""
    p = Path(path)
    text = read_text(p, error, what, max_bytes=max_bytes)
    try:
        return parse_yaml(text, loader)
    except yaml.YAMLError as e:
        raise error(f"Cannot read {what} '{shown(p)}': it is not valid YAML ({' '.join(str(e).split())}).") from None


def parse_json(text: str | bytes) -> Any:
    """JSON text as data; every failure (syntax, too deep, a number too long) is a ``ValueError``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_json(path: str | Path, error: type[Exception], what: str = "JSON file", *,
              max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The data of a JSON file of at most ``max_bytes``, or ``error`` naming it."""
    p = Path(path)
    text = read_text(p, error, what, max_bytes=max_bytes)
    try:
        return parse_json(text)
    except ValueError as e:
        raise error(f"Cannot read {what} '{shown(p)}': it is not valid JSON ({e}).") from None


def read_json_lines(path: str | Path, error: type[Exception], what: str = "JSON lines file", *,
                    max_bytes: int = MAX_JSON_LINES_BYTES) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a file with one per line, and how many lines were not one (skipped,
    never ending the read: a damaged middle row costs that row alone). Blank lines do not count."""
    p = Path(path)
    if not p.is_file():
        return [], 0
    rows, skipped = [], 0
    for line in _bytes(p, max_bytes, error, what).split(b"\n"):
        if not line.strip():
            continue
        try:
            row = parse_json(line.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is one: a bad byte spoils its own row only
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


def read_bytes(path: str | Path, error: type[Exception], what: str = "file", *,
               max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a file of at most ``max_bytes``, or ``error`` naming it."""
    return _bytes(Path(path), max_bytes, error, what)


def _bytes(path: Path, limit: int, error: type[Exception], what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit:
            raise error(f"Cannot read {what} '{shown(path)}': it is {size:,} bytes, over the {limit:,} such a file "
                        f"may have; it is not the file gluontl expects, or it was damaged.")
        return path.read_bytes()
    except OSError as e:
        raise error(f"Cannot read {what} '{shown(path)}': {e.strerror or e}.") from None


__all__ = ["MAX_JSON_BYTES", "MAX_JSON_LINES_BYTES", "MAX_TEXT_BYTES", "MAX_YAML_BYTES", "MAX_YAML_DEPTH", "SafeYamlLoader",
           "name_bytes", "parse_json", "parse_yaml", "read_bytes", "read_json", "read_json_lines", "read_text", "read_yaml", "shown"]
