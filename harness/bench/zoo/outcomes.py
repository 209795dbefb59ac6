"""The pinned outcome of every zoo case: what each model x Keras x method x split (x optimizer setting)
must come out as, so that a case which changes kind fails instead of passing quietly.

An outcome is ``"exact"``, ``"as accurate as one device"`` or ``"refused: <reason id>"`` (the
``reason`` of the ``harness.errors.Refused`` harness raised). The pins live in ``outcomes.json``
beside this module (or the file ``HARNESS_ZOO_PINS`` names), written from a run by ``harness check
--zoo --pin-outcomes`` (cases not run keep their pins) and read as they are; a case not pinned
there must be exact.

A row meets its pin when it is the pinned kind, or ``exact`` where ``as accurate as one device``
is pinned (closer than required). Anything else is a FAIL row: an exact case that turns ``as
accurate`` or is refused, a refusal with another reason, a refused case that trains, an error.

Re-pinning cannot slip: ``changes`` lists every pin a run would change, and a *downgrade* (exact -> as
accurate -> refused, ``RANK``) is written only where the case is named in ``--allow-downgrade``
(``downgrades``); the command prints every change either way.

Nothing here imports TensorFlow or Keras.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import InvalidValue

__all__ = ["PINS", "pins_path", "Key", "key_of", "pinned", "load", "outcome_of", "meets", "observed", "missed",
           "judged", "rejudged", "pins_of", "write", "RANK", "rank", "changes", "downgrades", "describe", "case_name"]

PINS = Path(__file__).resolve().with_name("outcomes.json")  # the shipped pins


def pins_path() -> Path:
    """The pins in use: the file ``HARNESS_ZOO_PINS`` names, else ``PINS``."""
    return Path(os.environ.get("HARNESS_ZOO_PINS") or PINS)

Key = tuple[str, str, str, str, str]  # model, keras ("3"/"2"), method, split, optimizer label ("" in the model zoo)
_OUTCOMES = ("exact", "as accurate as one device")


def key_of(row: Any) -> Key:
    """The pin key of a ``ZooRow``."""
    return (row.model, row.keras, row.method, row.split, row.optimizer)


def case_name(key: Key) -> str:
    """A case as pins and ``--allow-downgrade`` name it: ``model|keras|method|split|optimizer``."""
    return "|".join(key)


_text = case_name


def _check(outcome: str, where: str) -> None:
    if outcome in _OUTCOMES or (outcome.startswith("refused: ") and len(outcome) > len("refused: ")):
        return
    raise InvalidValue(f"{where}: an outcome is one of {list(_OUTCOMES)} or 'refused: <reason id>'; got {outcome!r}")


def load(path: Path | str | None = None) -> dict[Key, str]:
    """The pins in ``path`` (``{"model|keras|method|split|optimizer": outcome}``); an absent file has none.

    Raises:
        InvalidValue: the file is not such a JSON object, or an outcome is not one of the kinds above.
    """
    path = pins_path() if path is None else Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InvalidValue(f"{path}: not JSON ({err})") from err
    if not isinstance(data, dict) or not isinstance(data.get("pins"), dict):
        raise InvalidValue(f"{path}: expected {{\"pins\": {{\"model|keras|method|split|optimizer\": outcome}}}}")
    pins: dict[Key, str] = {}
    for text, outcome in data["pins"].items():
        parts = tuple(text.split("|"))
        if len(parts) != 5 or not isinstance(outcome, str):
            raise InvalidValue(f"{path}: a pin is 'model|keras|method|split|optimizer': outcome; got {text!r}: "
                               f"{outcome!r}")
        _check(outcome, f"{path}: {text}")
        pins[parts] = outcome  # five strings, checked above
    return pins


def pinned(key: Key, pins: Mapping[Key, str]) -> str:
    """The pinned outcome of ``key``: its pin, else ``"exact"``."""
    return pins.get(key, "exact")


def outcome_of(status: str) -> str:
    """A row status as an outcome: the verdict, ``refused: <reason id>``, or ``FAIL``."""
    if status in _OUTCOMES:
        return status
    if status.startswith("refused: "):
        return "refused: " + status[len("refused: "):].split(":", 1)[0].strip()
    return "FAIL"


def meets(status: str, expected: str) -> bool:
    """Whether a row's ``status`` meets the pinned ``expected`` outcome (exact also meets as accurate)."""
    got = outcome_of(status)
    return got == expected or (expected == "as accurate as one device" and got == "exact")


def judged(status: str, expected: str) -> str:
    """``status`` held to the pin ``expected``: as it is where it meets it (or FAILed already), else a FAIL naming
    the pin it missed."""
    if status.startswith("FAIL") or meets(status, expected):
        return status
    return missed(status, expected)


def rejudged(rows: Sequence[Any], pins: Mapping[Key, str]) -> list[Any]:
    """``rows`` (``ZooRow``) held to ``pins`` instead of the pins they ran with: what a run's JSON says today."""
    import dataclasses

    out = []
    for row in rows:
        expected = pinned(key_of(row), pins)
        out.append(dataclasses.replace(row, status=judged(observed(row.status), expected), expected=expected))
    return out


def observed(status: str) -> str:
    """The status a case came out with, before its pin was applied (a ``FAIL: pinned X, got Y`` row's ``Y``)."""
    if status.startswith(_MISSED):
        return status.split(", got ", 1)[1]
    return status


def missed(status: str, expected: str) -> str:
    """The status of a row whose ``status`` does not meet its pin ``expected``."""
    return f"{_MISSED}{expected}, got {status}"


_MISSED = "FAIL: pinned "


def pins_of(rows: Sequence[Any]) -> dict[Key, str]:
    """The outcomes the cases of ``rows`` came out with, as pins (their pins set aside), all but the exact ones
    (the default). A row that missed its pin is pinned as it came out: re-pinning is a reviewed change.

    Raises:
        InvalidValue: a row FAILed otherwise: a failure is fixed or refused by name, never pinned.
    """
    failed = [r for r in rows if outcome_of(observed(r.status)) == "FAIL"]
    if failed:
        raise InvalidValue("a FAIL is fixed or refused by name, never pinned; got "
                           + "; ".join(f"{_text(key_of(r))}: {r.status[:120]}" for r in failed[:5]))
    return {key_of(r): outcome_of(observed(r.status)) for r in rows if outcome_of(observed(r.status)) != "exact"}


RANK = {"exact": 0, "as accurate as one device": 1, "refused": 2}  # higher: further from one device's training


def rank(outcome: str) -> int:
    """An outcome's ``RANK`` (any refusal ranks as ``refused``)."""
    return RANK["refused" if outcome.startswith("refused: ") else outcome]


def changes(rows: Sequence[Any], pins: Mapping[Key, str]) -> list[tuple[Key, str, str]]:
    """``(key, pinned, new)`` for each case of ``rows`` whose outcome differs from its pin in ``pins``.

    Raises:
        InvalidValue: a row FAILed otherwise (see ``pins_of``).
    """
    new = pins_of(rows)
    out = []
    for row in rows:
        key = key_of(row)
        before, after = pinned(key, pins), new.get(key, "exact")
        if before != after:
            out.append((key, before, after))
    return out


def downgrades(found: Sequence[tuple[Key, str, str]], allowed: Sequence[str] = ()) -> list[tuple[Key, str, str]]:
    """The changes of ``found`` that move a case further from one device (``rank`` grows, or a refusal's reason
    changes) and that no pattern of ``allowed`` names (``fnmatch`` patterns over ``model|keras|method|split|
    optimizer``)."""
    from fnmatch import fnmatchcase

    return [(key, before, after) for key, before, after in found
            if (rank(after) > rank(before) or (rank(after) == rank(before) == RANK["refused"]))
            and not any(fnmatchcase(_text(key), pattern) for pattern in allowed)]


def describe(change: tuple[Key, str, str]) -> str:
    """One line for a change of a pin."""
    key, before, after = change
    how = "downgrade" if rank(after) > rank(before) else "upgrade" if rank(after) < rank(before) else "changed"
    return f"{_text(key)}: {before} -> {after} ({how})"


def write(rows: Sequence[Any], path: Path | str | None = None) -> dict[Key, str]:
    """Pins the outcomes of ``rows`` in ``path``: their cases' pins replaced, every other case's kept.
    Returns all the pins written.

    Raises:
        InvalidValue: a row FAILed (see ``pins_of``), or the file holds something else.
    """
    path = pins_path() if path is None else Path(path)
    pins = {k: v for k, v in load(path).items() if k not in {key_of(r) for r in rows}}
    pins.update(pins_of(rows))
    ordered = {_text(k): pins[k] for k in sorted(pins)}
    path.write_text(json.dumps({"about": "pinned zoo outcomes (harness/bench/zoo/outcomes.py); written by "
                                         "harness check --zoo --pin-outcomes", "pins": ordered}, indent=1) + "\n")
    return pins
