"""Decimal arithmetic rules shared by rating and invoicing.

One context for every money computation: 60 significant digits is far beyond any
real quantity, so intermediate results are exact until the single rounding step
the billing contract allows (each invoice line, to 0.01, half-up).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import ROUND_HALF_UP, Context, Decimal, localcontext

CENT = Decimal("0.01")
MICRO = Decimal("0.000001")
SECONDS_PER_HOUR = Decimal(3600)
# Scale of unit-seconds and list cost in ClickHouse (Decimal(38, 18)).
STORE_SCALE = 18
STORE_QUANTUM = Decimal(1).scaleb(-STORE_SCALE)

_CONTEXT = Context(prec=60, rounding=ROUND_HALF_UP)


@contextmanager
def exact() -> Iterator[None]:
    """Run the block with the 60-digit billing context."""
    with localcontext(_CONTEXT):
        yield


def round_money(amount: Decimal) -> Decimal:
    """Round once to cents, half-up (contract 3, step 4)."""
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def format_money(amount: Decimal) -> str:
    """Money as a string with exactly two decimals."""
    return str(amount.quantize(CENT, rounding=ROUND_HALF_UP))


def format_quantity(quantity: Decimal) -> str:
    """Unit-hours as a string with exactly six decimals (display only)."""
    return str(quantity.quantize(MICRO, rounding=ROUND_HALF_UP))


def product(first: Decimal, *factors: Decimal) -> Decimal:
    """Exact product in the billing context.

    The hot path of rating calls this per sample; passing the context to each operation
    costs a fraction of entering ``exact()`` (a generator plus a context copy).
    """
    result = first
    for factor in factors:
        result = _CONTEXT.multiply(result, factor)
    return result


def per_hour(value: Decimal) -> Decimal:
    """``value / 3600`` in the billing context (unit-seconds to unit-hours)."""
    return _CONTEXT.divide(value, SECONDS_PER_HOUR)


def to_store(value: Decimal) -> Decimal:
    """Quantize to the ClickHouse Decimal(38, 18) scale."""
    return value.quantize(STORE_QUANTUM, rounding=ROUND_HALF_UP, context=_CONTEXT)
