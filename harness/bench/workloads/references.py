"""Looking up a user's object: ``MODULE:ATTR`` or ``path/to/file.py:ATTR`` (``--model``, ``--data``).

The module is imported, or the file run as a module of its own, once per process; a file's
directory goes first on ``sys.path`` (as for a script, so it imports its neighbours) and so
does the working directory for a module (as for ``python -m``). Every failure is one line
naming the option and the reference (``InvalidValue``): no such file or module, the module's
own import error, no such attribute. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.bench.workloads import FORMS
from harness.errors import InvalidValue

__all__ = ["Reference", "parse_reference", "load_reference"]

_MODULES: dict[str, ModuleType] = {}  # the user's files run as modules, by path: each runs once


@dataclass(frozen=True)
class Reference:
    """``MODULE:ATTR`` or ``path/to/file.py:ATTR``, parsed: ``target`` (the module or file), ``attr`` (dotted)."""

    text: str
    target: str
    attr: str
    is_file: bool


def parse_reference(text: str, option: str = "--model") -> Reference:
    """``text`` split at its last ``:``; a target ending in ``.py`` or holding a ``/`` is a file.

    Raises:
        InvalidValue: naming ``option`` and ``text``: no ``:``, an empty side, an ATTR or MODULE that is no
            Python name.
    """
    if not isinstance(text, str):
        raise InvalidValue(f"{option} takes {FORMS}; got {text!r}")
    target, sep, attr = text.rpartition(":")
    target = target.strip()
    if not sep or not target or not attr:
        raise InvalidValue(f"{option} {text!r} is not {FORMS}")
    if not all(part.isidentifier() for part in attr.split(".")):
        raise InvalidValue(f"{option} {text!r}: ATTR {attr!r} is not a Python name (or dotted names)")
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if not is_file and not all(part.isidentifier() for part in target.split(".")):
        raise InvalidValue(f"{option} {text!r}: {target!r} is neither a module name nor a path to a .py file")
    return Reference(text, target, attr, is_file)


def load_reference(text: str, option: str = "--model"):
    """The object ``text`` (``MODULE:ATTR`` or ``file.py:ATTR``) names, its module imported or its file run once.

    Raises:
        InvalidValue: no such file or module, the module failed to import (its error on the same line), no such
            attribute.
    """
    ref = parse_reference(text, option)
    obj: Any = _module(ref, option)
    parts = ref.attr.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            where = ref.target + (":" + ".".join(parts[:i]) if i else "")
            raise InvalidValue(f"{option} {text!r}: {where} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def _module(ref: Reference, option: str) -> ModuleType:
    if ref.is_file:
        path = Path(ref.target).expanduser().resolve()
        if not path.is_file():
            raise InvalidValue(f"{option} {ref.text!r}: no such file {path}")
        key = str(path)
        if key not in _MODULES:
            _MODULES[key] = _run_file(path, ref, option)
        return _MODULES[key]
    if "" not in sys.path and os.getcwd() not in sys.path:  # as python -m: a module of the working directory
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(ref.target)
    except ModuleNotFoundError as err:
        if err.name and (ref.target == err.name or ref.target.startswith(err.name + ".")):
            raise InvalidValue(f"{option} {ref.text!r}: no module named {err.name!r} (a file needs its path, "
                               f"path/to/file.py:{ref.attr})") from err
        raise _import_failed(ref, option, err) from err
    except Exception as err:  # noqa: BLE001  the user's module failed: one line, the traceback with --debug
        raise _import_failed(ref, option, err) from err


def _run_file(path: Path, ref: Reference, option: str) -> ModuleType:
    """Runs ``path`` as a module of its own (its directory first on ``sys.path``, as for a script)."""
    name = f"harness_user_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InvalidValue(f"{option} {ref.text!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001  the user's file failed: one line, the traceback with --debug
        del sys.modules[name]
        raise _import_failed(ref, option, err) from err
    return module


def _import_failed(ref: Reference, option: str, err: Exception) -> InvalidValue:
    line = (str(err).strip().splitlines() or [""])[0]
    return InvalidValue(f"{option} {ref.text!r}: importing {ref.target} failed: {type(err).__name__}: {line} "
                        "(--debug shows the traceback)")
