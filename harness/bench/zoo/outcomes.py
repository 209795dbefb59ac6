"""The pinned outcome of every zoo case: what each model x Keras x method x split (x optimizer setting)
must come out as, so that a case which changes kind fails instead of passing quietly.

An outcome is ``"exact"``, ``"as accurate as one device"`` or ``"refused: <reason id>"`` (the
``reason`` of the ``harness.errors.Refused`` harness raised). The pins live in ``outcomes.json``
beside this module (or the file ``HARNESS_ZOO_PINS`` names), written from a run by ``harness check
--zoo --pin-outcomes`` (cases not run keep their pins) and read as they are; a case not pinned
there must be exact.

Keras 3 on JAX has pins of its own beside TensorFlow's: their ``keras`` is ``"jax"``
(``mobilenet_v2|jax|towers|3:2|``), so that neither backend's run is held to, or re-pins, the other's.

A row meets its pin when it is the pinned kind, or ``exact`` where ``as accurate as one device``
is pinned (closer than required). Anything else is a FAIL row: an exact case that turns ``as
accurate`` or is refused, a refusal with another reason, a refused case that trains, an error.

An "as accurate" pin also records the multiple of its rounding floor the case came out at (``multiples``
in the file): a run more than ``MULTIPLE_SLACK`` times that multiple is a FAIL row, and re-pinning it is a
downgrade like any other.

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
           "judged", "rejudged", "pins_of", "write", "RANK", "rank", "changes", "downgrades", "describe", "case_name",
           "load_multiples", "multiples_of", "MULTIPLE_SLACK"]

PINS = Path(__file__).resolve().with_name("outcomes.json")  # the shipped pins


def pins_path() -> Path:
    """The pins in use: the file ``HARNESS_ZOO_PINS`` names, else ``PINS``."""
    return Path(os.environ.get("HARNESS_ZOO_PINS") or PINS)

# model, keras ("3"/"2" on TensorFlow, "jax": Keras 3 on JAX), method, split, optimizer label ("" in the model zoo)
Key = tuple[str, str, str, str, str]
_OUTCOMES = ("exact", "as accurate as one device")
_AS_ACCURATE = _OUTCOMES[1]
# An "as accurate" case FAILs at more than this many times the floor multiple pinned for it.
MULTIPLE_SLACK = 2.0


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
    data = _read(path)
    pins: dict[Key, str] = {}
    for text, outcome in data["pins"].items():
        parts = tuple(text.split("|"))
        if len(parts) != 5 or not isinstance(outcome, str):
            raise InvalidValue(f"{path}: a pin is 'model|keras|method|split|optimizer': outcome; got {text!r}: "
                               f"{outcome!r}")
        _check(outcome, f"{path}: {text}")
        pins[parts] = outcome  # five strings, checked above
    return pins


def _read(path: Path) -> dict:
    if not path.exists():
        return {"pins": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InvalidValue(f"{path}: not JSON ({err})") from err
    if not isinstance(data, dict) or not isinstance(data.get("pins"), dict) or not isinstance(
            data.get("multiples", {}), dict):
        raise InvalidValue(f"{path}: expected {{\"pins\": {{\"model|keras|method|split|optimizer\": outcome}}, "
                           f"\"multiples\": {{\"model|keras|method|split|optimizer\": number}}}}")
    return data


def load_multiples(path: Path | str | None = None) -> dict[Key, float]:
    """The floor multiple each "as accurate" pin of ``path`` records (``multiples``); none for a case without.

    Raises:
        InvalidValue: the file is not such a JSON object, or a multiple is not a positive finite number.
    """
    import math

    path = pins_path() if path is None else Path(path)
    multiples: dict[Key, float] = {}
    for text, value in _read(path).get("multiples", {}).items():
        parts = tuple(text.split("|"))
        if len(parts) != 5 or isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0):
            raise InvalidValue(f"{path}: a multiple is 'model|keras|method|split|optimizer': a finite number >= 0; "
                               f"got {text!r}: {value!r}")
        multiples[parts] = float(value)  # five strings, checked above
    return multiples


def pinned(key: Key, pins: Mapping[Key, str]) -> str:
    """The pinned outcome of ``key``: its pin, else ``"exact"``."""
    return pins.get(key, "exact")


def outcome_of(status: str) -> str:
    """A row status as an outcome: the verdict, ``refused: <reason id>``, or ``FAIL``."""
    if status in _OUTCOMES:
        return status
    if status.startswith(_AS_ACCURATE + " at "):  # with its floor multiple (``judged``)
        return _AS_ACCURATE
    if status.startswith("refused: "):
        return "refused: " + status[len("refused: "):].split(":", 1)[0].strip()
    return "FAIL"


def meets(status: str, expected: str) -> bool:
    """Whether a row's ``status`` meets the pinned ``expected`` outcome (exact also meets as accurate)."""
    got = outcome_of(status)
    return got == expected or (expected == "as accurate as one device" and got == "exact")


def judged(status: str, expected: str, multiple: float | None = None, pinned_multiple: float | None = None) -> str:
    """``status`` held to the pin ``expected``: as it is where it meets it (or FAILed already), else a FAIL naming
    the pin it missed. An "as accurate" row at ``multiple`` of its rounding floor, where its pin records
    ``pinned_multiple``, misses it above ``MULTIPLE_SLACK`` times that."""
    if status.startswith("FAIL"):
        return status
    if not meets(status, expected):
        return missed(status, expected)
    if _grown(status, multiple, pinned_multiple):
        return missed(f"{status} at {multiple:.3g} x its rounding floor", f"{expected} at {pinned_multiple:.3g} x "
                      f"(at most {MULTIPLE_SLACK:g} x that)")
    return status


def _grown(status: str, multiple: float | None, pinned_multiple: float | None) -> bool:
    import math

    return (status == _AS_ACCURATE and multiple is not None and pinned_multiple is not None
            and not (math.isfinite(multiple) and multiple <= MULTIPLE_SLACK * pinned_multiple))


def rejudged(rows: Sequence[Any], pins: Mapping[Key, str], multiples: Mapping[Key, float] | None = None) -> list[Any]:
    """``rows`` (``ZooRow``) held to ``pins`` (and ``multiples``) instead of the pins they ran with: what a run's
    JSON says today."""
    import dataclasses

    out = []
    for row in rows:
        expected = pinned(key_of(row), pins)
        status = judged(_verdict_of(row.status), expected, getattr(row, "floor_multiple", None),
                        (multiples or {}).get(key_of(row)))
        out.append(dataclasses.replace(row, status=status, expected=expected))
    return out


def _verdict_of(status: str) -> str:
    """The verdict a row came out with, its pin and floor multiple set aside."""
    found = observed(status)
    return _AS_ACCURATE if outcome_of(found) == _AS_ACCURATE else found


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
    """An outcome's ``RANK`` (any refusal ranks as ``refused``; an "as accurate" one with its multiple as "as
    accurate")."""
    return RANK["refused" if outcome.startswith("refused: ") else outcome_of(outcome)]


def multiples_of(rows: Sequence[Any]) -> dict[Key, float]:
    """The floor multiple of each "as accurate" row of ``rows`` that has one, as pins record it."""
    import math

    return {key_of(r): float(f"{r.floor_multiple:.3g}") for r in rows
            if outcome_of(observed(r.status)) == _AS_ACCURATE and getattr(r, "floor_multiple", None) is not None
            and math.isfinite(r.floor_multiple)}


def changes(rows: Sequence[Any], pins: Mapping[Key, str],
            multiples: Mapping[Key, float] | None = None) -> list[tuple[Key, str, str]]:
    """``(key, pinned, new)`` for each case of ``rows`` whose outcome differs from its pin in ``pins``, or that
    stays "as accurate" at more than ``MULTIPLE_SLACK`` times the floor multiple ``multiples`` pins for it
    (``"as accurate as one device at 1.2 x"`` -> ``... at 5.3 x``, a downgrade).

    Raises:
        InvalidValue: a row FAILed otherwise (see ``pins_of``).
    """
    new = pins_of(rows)
    multiples = multiples or {}
    out = []
    for row in rows:
        key = key_of(row)
        before, after = pinned(key, pins), new.get(key, "exact")
        if before != after:
            out.append((key, before, after))
        elif _grown(after, getattr(row, "floor_multiple", None), multiples.get(key)):
            out.append((key, f"{before} at {multiples[key]:.3g} x", f"{after} at {row.floor_multiple:.3g} x"))
    return out


def downgrades(found: Sequence[tuple[Key, str, str]], allowed: Sequence[str] = ()) -> list[tuple[Key, str, str]]:
    """The changes of ``found`` that move a case further from one device (``rank`` grows, or a refusal's reason
    changes) and that no pattern of ``allowed`` names (``fnmatch`` patterns over ``model|keras|method|split|
    optimizer``)."""
    from fnmatch import fnmatchcase

    return [(key, before, after) for key, before, after in found
            if (rank(after) > rank(before) or (rank(after) == rank(before) and rank(after) > 0))
            and not any(fnmatchcase(_text(key), pattern) for pattern in allowed)]


def describe(change: tuple[Key, str, str]) -> str:
    """One line for a change of a pin."""
    key, before, after = change
    how = ("downgrade" if rank(after) > rank(before) or (rank(after) == rank(before) == 1)
           else "upgrade" if rank(after) < rank(before) else "changed")
    return f"{_text(key)}: {before} -> {after} ({how})"


def write(rows: Sequence[Any], path: Path | str | None = None) -> dict[Key, str]:
    """Pins the outcomes of ``rows`` in ``path``: their cases' pins replaced, every other case's kept.
    Returns all the pins written.

    Raises:
        InvalidValue: a row FAILed (see ``pins_of``), or the file holds something else.
    """
    path = pins_path() if path is None else Path(path)
    ran = {key_of(r) for r in rows}
    pins = {k: v for k, v in load(path).items() if k not in ran}
    pins.update(pins_of(rows))
    multiples = {k: v for k, v in load_multiples(path).items() if k not in ran}
    multiples.update(multiples_of(rows))
    multiples = {k: v for k, v in multiples.items() if pins.get(k) == _AS_ACCURATE}
    path.write_text(json.dumps({
        "about": "pinned zoo outcomes (harness/bench/zoo/outcomes.py); written by harness check --zoo --pin-outcomes; "
                 "multiples: the rounding-floor multiple of each 'as accurate' pin",
        "pins": {_text(k): pins[k] for k in sorted(pins)},
        "multiples": {_text(k): multiples[k] for k in sorted(multiples)}}, indent=1) + "\n")
    return pins
