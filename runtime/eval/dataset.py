"""Reading an eval task's dataset into samples, and importing the Python
functions a task names (``package.module:func`` or ``file.py:func``).

:func:`load_samples` reads JSONL, CSV or what a Python function returns; a
bad row is a :class:`~runtime.eval.task.TaskFileError` naming the dataset
file, the line (JSONL) or row (CSV) and the field. It reads files: call it
off the event loop.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from coterie.runtime.eval.task import (
    SAMPLE_FIELDS,
    EvalTask,
    Sample,
    TaskFileError,
    check_ref,
)


def import_function(ref: str, *, base_dir: Path) -> Callable[..., Any]:
    """Import ``package.module:func`` or ``file.py:func`` (relative to ``base_dir``).

    Raises ValueError (a malformed reference), ImportError (no such module or
    file, or it failed to import) or AttributeError (no such function).
    """
    check_ref(ref)
    module_name, _, func_name = ref.rpartition(":")
    if module_name.endswith(".py"):
        file = (base_dir / module_name).resolve()
        if not file.is_file():
            raise ImportError(f"no file {file}")
        # One module per file path: importing it again reuses it.
        key = "coterie_eval_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
        module = sys.modules.get(key)
        if module is None:
            spec = importlib.util.spec_from_file_location(key, file)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {file} as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            try:
                spec.loader.exec_module(module)
            except BaseException as exc:
                del sys.modules[key]
                raise ImportError(f"{file} failed to import: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise
        except Exception as exc:  # the module's own code failed: say so as an ImportError
            raise ImportError(
                f"{module_name} failed to import: {type(exc).__name__}: {exc}"
            ) from exc
    target: Any = module
    for attr in func_name.split("."):
        if not hasattr(target, attr):
            raise AttributeError(f"{module_name} has no attribute {func_name!r}")
        target = getattr(target, attr)
    if not callable(target):
        raise AttributeError(f"{ref} is not callable")
    return target  # type: ignore[no-any-return]


def load_samples(
    task: EvalTask,
    *,
    limit: int | None = None,
    loaders: Mapping[str, Callable[..., Any]] | None = None,
) -> list[Sample]:
    """The task's samples in dataset order (only the first ``limit``, if given).

    A bad row raises :class:`TaskFileError` naming the dataset and the line
    (JSONL) or row (CSV, header not counted). This reads files: from async
    code, call it through ``asyncio.to_thread``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    spec = task.dataset
    if spec.function is not None:
        label = f"{spec.function} (dataset.function of {task.label})"
        return _collect(_function_rows(task, spec.function), label, spec.fields, limit)
    if spec.loader is not None:
        loader = (loaders or {}).get(spec.loader)
        if loader is None:
            known = ", ".join(sorted(loaders or {})) or "none"
            raise TaskFileError(
                task.label,
                [
                    f"dataset.loader: no plugin registered a loader {spec.loader!r} "
                    f"(loaded: {known})"
                ],
            )
        label = f"plugin loader {spec.loader} (dataset.loader of {task.label})"
        return _collect(_call_rows(loader, label), label, spec.fields, limit)
    file = Path(spec.path or "")
    if not file.is_absolute():
        file = task.base_dir / file
    label = str(file)
    if not file.is_file():
        raise TaskFileError(label, [f"file not found (dataset.path of {task.label})"])
    try:
        text = file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskFileError(label, [f"expected UTF-8 text: {exc}"]) from None
    if spec.resolved_format == "csv":
        rows = _csv_rows(text, label, spec.fields)
    else:
        rows = _jsonl_rows(text, label)
    return _collect(rows, label, spec.fields, limit)


_Row = tuple[str, int, "dict[str, Any] | Sample"]  # (where, 1-based row number, row)


def _jsonl_rows(text: str, label: str) -> Iterator[_Row]:
    index = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(
                label, [f"line {lineno}: expected a JSON object, found invalid JSON ({exc})"]
            ) from None
        if not isinstance(row, dict):
            raise TaskFileError(
                label, [f"line {lineno}: expected a JSON object, got {type(row).__name__}"]
            )
        index += 1
        yield f"line {lineno}", index, row


def _csv_rows(text: str, label: str, fields: dict[str, str]) -> Iterator[_Row]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    if not header:
        return
    for name in ("input", *fields):
        column = fields.get(name, name)
        if column not in header:
            hint = "" if name in fields else f", or map it with dataset.fields.{name}"
            raise TaskFileError(
                label,
                [
                    f"{name}: expected a column {column!r} in the header{hint}; "
                    f"found columns {', '.join(header)}"
                ],
            )
    for index, row in enumerate(reader, 1):
        where = f"row {index} (line {reader.line_num})"
        if None in row or None in row.values():
            cells = len(row) - (None in row) + len(row.get(None) or [])  # type: ignore[call-overload]
            raise TaskFileError(
                label, [f"{where}: expected {len(header)} cells as in the header, found {cells}"]
            )
        yield where, index, dict(row)


def _function_rows(task: EvalTask, ref: str) -> Iterator[_Row]:
    try:
        function = import_function(ref, base_dir=task.base_dir)
    except (ImportError, AttributeError, ValueError) as exc:
        raise TaskFileError(
            task.label, [f"dataset.function: cannot import {ref!r}: {exc}"]
        ) from exc
    yield from _call_rows(function, f"{ref} (dataset.function of {task.label})")


def _call_rows(function: Callable[..., Any], label: str) -> Iterator[_Row]:
    try:
        rows = function()
    except Exception as exc:  # the user's function: report it as the dataset's failure
        raise TaskFileError(label, [f"the function raised {type(exc).__name__}: {exc}"]) from exc
    if inspect.isawaitable(rows):
        if inspect.iscoroutine(rows):
            rows.close()
        raise TaskFileError(label, ["expected a function returning rows, got an async one"])
    if isinstance(rows, str | bytes | dict) or not isinstance(rows, Iterable):
        found = type(rows).__name__
        raise TaskFileError(label, [f"expected an iterable of dicts or Samples, got {found}"])
    for index, row in enumerate(rows, 1):
        if not isinstance(row, dict | Sample):
            found = type(row).__name__
            raise TaskFileError(label, [f"row {index}: expected a dict or a Sample, got {found}"])
        yield f"row {index}", index, row


def _collect(
    rows: Iterator[_Row], label: str, fields: dict[str, str], limit: int | None
) -> list[Sample]:
    samples: list[Sample] = []
    seen: dict[str, str] = {}
    if limit == 0:
        return samples
    for where, index, row in rows:
        sample = row if isinstance(row, Sample) else _to_sample(row, where, index, label, fields)
        first = seen.get(sample.id)
        if first is not None:
            raise TaskFileError(
                label,
                [f"{where}: id {sample.id!r} is also the id of {first}; expected unique ids"],
            )
        seen[sample.id] = where
        samples.append(sample)
        if limit is not None and len(samples) >= limit:
            break
    if not samples:
        raise TaskFileError(label, ["expected at least one sample, found none"])
    return samples


def _to_sample(
    row: dict[str, Any], where: str, index: int, label: str, fields: dict[str, str]
) -> Sample:
    column = {name: fields.get(name, name) for name in SAMPLE_FIELDS}
    problems: list[str] = []

    def problem(name: str, what: str) -> None:
        field = name if column[name] == name else f"{name} (column {column[name]!r})"
        problems.append(f"{where}: {field}: {what}")

    value = row.get(column["input"])
    if value is None:
        problem("input", "missing; expected a string")
    elif not isinstance(value, str) or not value.strip():
        problem("input", f"expected a non-empty string, got {value!r}")
    sample_input = value if isinstance(value, str) else ""

    target: str | list[str] = ""
    value = row.get(column["target"])
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        target = _text(value)
    elif isinstance(value, list) and all(_is_number(v) or isinstance(v, str) for v in value):
        target = [_text(v) for v in value]
    elif value is not None:
        problem("target", f"expected a string, a number or a list of them, got {value!r}")

    sample_id = str(index)
    value = row.get(column["id"])
    if isinstance(value, str) and value.strip():
        sample_id = value.strip()
    elif isinstance(value, int) and not isinstance(value, bool):
        sample_id = str(value)
    elif column["id"] in row:
        problem("id", f"expected a non-empty string or an integer, got {value!r}")

    metadata = {k: v for k, v in row.items() if k not in column.values()}
    value = row.get(column["metadata"])
    if isinstance(value, str) and value.strip():
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if isinstance(value, dict):
        metadata.update(value)
    elif value is not None and value != "":
        problem("metadata", f"expected a JSON object, got {value!r}")

    if problems:
        raise TaskFileError(label, problems)
    return Sample(id=sample_id, input=sample_input, target=target, metadata=metadata)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: str | float) -> str:
    return value if isinstance(value, str) else str(value)


__all__ = ["import_function", "load_samples"]
