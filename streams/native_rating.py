"""The rating stage's native path (native/, the `gpumeter_native` extension, Rust).

Rating a sample in Python costs ~50-80 µs of the worker's one core (pydantic-core validation,
Decimal arithmetic, the model, the JSON line, the row); the native path reads the same line,
checks the per-sample fields (contract 1's rules for ids, names, priority, telemetry and
labels) and writes the same row and rated line in a few µs. What depends on the window, kind,
selector and quantity (whether they are valid, the card in force, the rate, the exact
unit-seconds and list cost, and their JSON) it does not decide: it asks ``window`` below once
per window, and ``rating`` once per card, window length, kind, selector and quantity, which
rates a prototype sample of them with the Python path (``parse_sample`` and ``Rater.rate``)
and hands back its values and JSON fragments.

A line the native path does not plainly accept (escapes in a string, a JSON float, an unknown
or repeated field, a combination the Python path refused, ...) comes back as None and goes to
the Python path, which accepts it or words the rejection. So the native path may accept less
than the Python one, never more, and never other values: tests/unit/streams/test_native_rating.py
compares the rows and line bytes of both on the same input.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import orjson

from gpumeter.core.models import SampleRejected, checked_window, parse_sample
from gpumeter.infra.schema import RATED_USAGE
from pricing.rating import Rater

log = logging.getLogger(__name__)

try:
    from gpumeter_native import NativeRater

    BUILT = True
except ImportError:  # not built (`make install` builds it): the Python path rates everything
    BUILT = False

# RatedUsage fields as encode_rated writes them, in the runs of the line the native path takes
# from Python; the row takes their values by name (the native path places every value by its
# rated_usage insert column, which it is given at construction).
WINDOW_FIELDS = ("window_start", "window_end", "period")
RATING_FIELDS = ("quantity", "unit_seconds", "gpu_model", "mig_profile", "capacity_type")
PRICE_FIELDS = ("rate_card", "currency", "unit_price", "capacity_multiplier", "list_cost")
# A prototype's own fields: any valid text (its rating does not depend on them).
_PROTOTYPE = ('"event_id":"prototype","cluster":"p","node":"p","tenant":"p","namespace":"p",'
              '"pod":"p","pod_uid":"p"')

Window = tuple[bytes, dict[str, Any], int, str]
Rating = tuple[bytes, bytes, dict[str, Any]]


def _decimal_text(value: object) -> str:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _fields_json(values: dict[str, Any], names: tuple[str, ...]) -> bytes:
    """``"name":value,...`` as encode_rated's orjson call writes these fields."""
    return orjson.dumps({name: values[name] for name in names}, default=_decimal_text,
                        option=orjson.OPT_UTC_Z)[1:-1]


class NativeRating:
    """The native rater of one Rater (one set of rate cards)."""

    def __init__(self, rater: Rater) -> None:
        if not BUILT:
            raise RuntimeError("gpumeter_native is not built: run `make install`")
        self.rater = rater
        self._native = NativeRater(self.window, self.rating, Decimal, RATED_USAGE.insert_columns)

    def rate_lines(self, lines: list[bytes], partition: int, offset: int) -> list[tuple[Any, ...] | None]:
        """Per line, its rated_usage row with the rated line last, or None: the Python path's."""
        rows: list[tuple[Any, ...] | None] = self._native.rate_lines(lines, partition, offset)
        return rows

    def window(self, window_start: str, window_end: str) -> Window | None:
        """What a window (its two JSON tokens) gives every sample of it: the line's
        ``"window_start":..,"window_end":..,"period":..``, those values by name, a key for the
        card in force and the exact length in seconds; None where the Python path must decide."""
        try:
            start_text, end_text = orjson.loads(window_start), orjson.loads(window_end)
            if type(start_text) is not str or type(end_text) is not str:
                return None
            checked = checked_window(start_text, end_text)
            if checked is None:
                return None
            card, start, end, period = self.rater.window(checked[0], checked[1])
            if card is None:
                return None
            values = {"window_start": start, "window_end": end, "period": period}
            return _fields_json(values, WINDOW_FIELDS), values, id(card), str(checked[2])
        except Exception:  # a defect here must not stop rating: the Python path takes over
            log.exception("native rating: window %s %s declined", window_start, window_end)
            return None

    def rating(self, window_start: str, window_end: str, kind: str, quantity: str, gpu_model: str | None,
               mig_profile: str | None, capacity_type: str | None) -> Rating | None:
        """The rating of every sample of this card, window length, kind, selector and quantity
        (JSON tokens; None where a field is absent), as the Python path rates a prototype sample
        of them in the window given: the line's ``"quantity":..`` to ``"capacity_type":..`` and
        ``"rate_card":..`` to ``"list_cost":..``, and those values by name; None where it
        refuses one."""
        parts = [_PROTOTYPE, '"kind":' + orjson.dumps(kind).decode(), '"window_start":' + window_start,
                 '"window_end":' + window_end, '"quantity":' + quantity]
        for name, token in (("gpu_model", gpu_model), ("mig_profile", mig_profile),
                            ("capacity_type", capacity_type)):
            if token is not None:
                parts.append(f'"{name}":{token}')
        try:
            sample = parse_sample(("{" + ",".join(parts) + "}").encode())
            values = self.rater.rate(sample).__dict__
            return (_fields_json(values, RATING_FIELDS), _fields_json(values, PRICE_FIELDS),
                    {name: values[name] for name in RATING_FIELDS + PRICE_FIELDS})
        except (SampleRejected, TypeError):
            return None  # the Python path rates (or rejects) each such sample itself
        except Exception:  # a defect here must not stop rating: the Python path takes over
            log.exception("native rating: %s %s in %s declined", kind, quantity, window_start)
            return None
