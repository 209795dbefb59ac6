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
in the file): a run more than ``MULTIPLE_SLACK`` times that multiple is a FAIL row. The multiple it was *first*
pinned at is kept beside it (``first_multiples``), and no re-pin moves it: a re-pin that raises a multiple past
``CREEP_SLACK`` times its first pin (or past ``MULTIPLE_SLACK`` times its last) is a downgrade, so re-pins in
small steps (1 -> 1.1 -> 1.2 -> 1.3 x) cannot add up to a worse case unasked. The first pin goes only with the
case's "as accurate" pin (exact, or refused), and a file written before first pins were kept was first pinned
at its ``multiples``.

Re-pinning cannot slip: ``changes`` lists every pin a run would change, every raised multiple included, and a
*downgrade* (exact -> as accurate -> refused, ``RANK``; another refusal reason; a multiple raised past the bounds
above) is written only where the case is named in ``--allow-downgrade`` (``downgrades``); the command prints
every change either way. A multiple so accepted is written, its first pin kept: the file shows it beside the
first pin, and each further raise past the bound needs naming again.

Nothing here imports TensorFlow or Keras.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from harness.errors import InvalidValue

__all__ = ["PINS", "pins_path", "Key", "key_of", "pinned", "load", "outcome_of", "meets", "observed", "missed",
           "judged", "rejudged", "pins_of", "write", "RANK", "rank", "changes", "downgrades", "describe", "case_name",
           "load_multiples", "load_first_multiples", "multiples_of", "MULTIPLE_SLACK", "CREEP_SLACK", "Change"]

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
# A re-pin may raise an "as accurate" case's multiple to this many times the one first pinned for it unasked;
# further is a downgrade. Held to the first pin, not the last: re-pins each within the slack of the one before
# would otherwise compound (1 -> 1.9 -> 3.7 -> 7 x within MULTIPLE_SLACK each).
CREEP_SLACK = 1.25


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
    if not isinstance(data, dict) or not isinstance(data.get("pins"), dict) or not all(
            isinstance(data.get(section, {}), dict) for section in ("multiples", "first_multiples")):
        raise InvalidValue(f"{path}: expected {{\"pins\": {{\"model|keras|method|split|optimizer\": outcome}}, "
                           f"\"multiples\" and \"first_multiples\": {{\"model|keras|method|split|optimizer\": "
                           "number}}")
    return data


def load_multiples(path: Path | str | None = None) -> dict[Key, float]:
    """The floor multiple each "as accurate" pin of ``path`` records (``multiples``); none for a case without.

    Raises:
        InvalidValue: the file is not such a JSON object, or a multiple is not a positive finite number.
    """
    return _numbers(pins_path() if path is None else Path(path), "multiples")


def load_first_multiples(path: Path | str | None = None) -> dict[Key, float]:
    """The floor multiple each "as accurate" pin of ``path`` was first pinned at (``first_multiples``); where the
    file records a multiple and no first one (written before first pins were kept), that multiple.

    Raises:
        InvalidValue: the file is not such a JSON object, or a multiple is not a positive finite number.
    """
    path = pins_path() if path is None else Path(path)
    return {**_numbers(path, "multiples"), **_numbers(path, "first_multiples")}


def _numbers(path: Path, section: str) -> dict[Key, float]:
    import math

    multiples: dict[Key, float] = {}
    for text, value in _read(path).get(section, {}).items():
        parts = tuple(text.split("|"))
        if len(parts) != 5 or isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0):
            raise InvalidValue(f"{path}: {section}: a multiple is 'model|keras|method|split|optimizer': a finite "
                               f"number >= 0; got {text!r}: {value!r}")
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

    return {key_of(r): _rounded(r.floor_multiple) for r in rows
            if outcome_of(observed(r.status)) == _AS_ACCURATE and getattr(r, "floor_multiple", None) is not None
            and math.isfinite(r.floor_multiple)}


def _rounded(multiple: float) -> float:
    """A multiple as pins record it (three significant digits)."""
    return float(f"{multiple:.3g}")


class Change(NamedTuple):
    """A pin a run would change: ``key``'s pinned outcome ``before`` -> ``after``. Where the case stays "as
    accurate" at a higher multiple, ``multiple`` is that multiple (as pins record it), ``last`` the one pinned
    for it now and ``first`` the one first pinned."""

    key: Key
    before: str
    after: str
    multiple: float | None = None
    last: float | None = None
    first: float | None = None

    @property
    def is_downgrade(self) -> bool:
        """Whether writing it needs ``--allow-downgrade``: the case moves further from one device (``rank``
        grows, or a refusal's reason changes), or its multiple rises past ``CREEP_SLACK`` times the first pin or
        ``MULTIPLE_SLACK`` times the last (a multiple that is not finite: past both)."""
        if self.multiple is not None and self.first is not None and self.last is not None:
            return not (self.multiple <= CREEP_SLACK * self.first and self.multiple <= MULTIPLE_SLACK * self.last)
        return rank(self.after) > rank(self.before) or rank(self.after) == rank(self.before) > 0


def changes(rows: Sequence[Any], pins: Mapping[Key, str], multiples: Mapping[Key, float] | None = None,
            first: Mapping[Key, float] | None = None) -> list[Change]:
    """Each case of ``rows`` whose outcome differs from its pin in ``pins``, or that stays "as accurate" at a
    higher floor multiple than the one pinned last (``multiples``; where it has none, its first). Such a raise
    carries the multiple the case was first pinned at (``first``, from ``load_first_multiples``; a case missing
    there was first pinned at its ``multiples`` one). ``Change.is_downgrade`` says which need ``--allow-downgrade``.

    Raises:
        InvalidValue: a row FAILed otherwise (see ``pins_of``).
    """
    new = pins_of(rows)
    multiples = multiples or {}
    first = {**multiples, **(first or {})}
    out = []
    for row in rows:
        key = key_of(row)
        before, after = pinned(key, pins), new.get(key, "exact")
        if before != after:
            out.append(Change(key, before, after))
            continue
        raised = _raised(after, getattr(row, "floor_multiple", None), multiples.get(key, first.get(key)))
        if raised is not None:
            last = multiples.get(key, first[key])  # set where raised is
            out.append(Change(key, f"{before} at {last:.3g} x", f"{after} at {raised:.3g} x", raised, last,
                              first[key]))
    return out


def _raised(outcome: str, multiple: float | None, last: float | None) -> float | None:
    """The multiple an "as accurate" case came out at, as pins record it, where it is higher than ``last`` (not
    finite: infinite); else None."""
    import math

    if outcome != _AS_ACCURATE or multiple is None or last is None:
        return None
    now = _rounded(multiple) if math.isfinite(multiple) else math.inf
    return now if now > last else None


def downgrades(found: Sequence[Change], allowed: Sequence[str] = ()) -> list[Change]:
    """The changes of ``found`` that need ``--allow-downgrade`` (``Change.is_downgrade``) and that no pattern of
    ``allowed`` names (``fnmatch`` patterns over ``model|keras|method|split|optimizer``)."""
    from fnmatch import fnmatchcase

    return [change for change in found
            if change.is_downgrade and not any(fnmatchcase(_text(change.key), pattern) for pattern in allowed)]


def describe(change: Change) -> str:
    """One line for a change of a pin: ``m|3|towers|3:2|: exact -> as accurate as one device (downgrade)``, or
    for a raised multiple ``m|3|towers|3:2|: multiple 1.90 x, first pinned 1.00 x (+90%), last 1.00 x
    (downgrade: past 1.25 x the first pin)``."""
    key, before, after = change.key, change.before, change.after
    if change.multiple is not None and change.first is not None and change.last is not None:
        return f"{_text(key)}: {_raise(change.multiple, change.first, change.last)}"
    how = "downgrade" if rank(after) > rank(before) else "upgrade" if rank(after) < rank(before) else "changed"
    return f"{_text(key)}: {before} -> {after} ({how})"


def _raise(multiple: float, first: float, last: float) -> str:
    """A raised multiple against its first and last pins, and whether that is a downgrade."""
    import math

    share = f"{multiple / first - 1:+.0%}" if first > 0 and math.isfinite(multiple) else "+inf%"
    text = f"multiple {multiple:#.3g} x, first pinned {first:#.3g} x ({share}), last {last:#.3g} x"
    past = [bound for bound, limit in ((f"{CREEP_SLACK:g} x the first pin", CREEP_SLACK * first),
                                       (f"{MULTIPLE_SLACK:g} x the last", MULTIPLE_SLACK * last))
            if not multiple <= limit]
    return text + (f" (downgrade: past {' and '.join(past)})" if past else "")


def write(rows: Sequence[Any], path: Path | str | None = None) -> dict[Key, str]:
    """Pins the outcomes of ``rows`` in ``path``: their cases' pins and multiples replaced, every other case's
    kept, and each "as accurate" pin's first multiple kept as it was first pinned (``_first_pins``). Returns all
    the pins written.

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
    _save(path, pins, multiples, _first_pins(load_first_multiples(path), multiples, pins))
    return pins


def _first_pins(before: Mapping[Key, float], multiples: Mapping[Key, float],
                pins: Mapping[Key, str]) -> dict[Key, float]:
    """The first multiple of each "as accurate" pin of ``pins``: the one ``before`` records (never moved by a
    re-pin, accepted downgrades included: how far a case has come stays in the file), else its multiple in
    ``multiples`` (a case pinned "as accurate" at a multiple for the first time)."""
    return {k: before[k] if k in before else multiples[k] for k in {*before, *multiples}
            if pins.get(k) == _AS_ACCURATE}


def _save(path: Path, pins: Mapping[Key, str], multiples: Mapping[Key, float], first: Mapping[Key, float]) -> None:
    """Writes a pins file: one JSON object per section, each sorted by case, one entry a line (reviewable
    diffs)."""
    path.write_text(json.dumps({
        "about": "pinned zoo outcomes (harness/bench/zoo/outcomes.py); written by harness check --zoo --pin-outcomes; "
                 "multiples: the rounding-floor multiple of each 'as accurate' pin; first_multiples: the one it was "
                 f"first pinned at (a re-pin past {CREEP_SLACK:g} x it needs --allow-downgrade)",
        "pins": {_text(k): pins[k] for k in sorted(pins)},
        "multiples": {_text(k): multiples[k] for k in sorted(multiples)},
        "first_multiples": {_text(k): first[k] for k in sorted(first)}}, indent=1) + "\n")
