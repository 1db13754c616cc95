"""Pieces of the kube extender's JSON answers, encoded once per node instead of per request.

A 5,000-node prioritize or filter answer is thousands of small JSON fragments (a
HostPriority, a FailedNodes member) that change only when a node's allocation does. The fit
tables (``placement.FitTable``) keep each node's fragments next to its score, updated with it,
so a request joins ready bytes in C instead of building a dict per node and encoding it. The
fragments are exactly what orjson writes for the same values; names orjson refuses (a lone
surrogate from a ``\\ud800`` escape) are written by the standard library instead, as the plain
path does.
"""

from __future__ import annotations

import json

import orjson


def json_string(text: str) -> bytes:
    """``text`` as a JSON string."""
    try:
        return orjson.dumps(text)
    except TypeError:  # a lone surrogate: only the standard library writes it (escaped)
        return json.dumps(text).encode()


def json_value(value: object) -> bytes:
    """``value`` as compact JSON, as the server encodes an answer: orjson, or the standard
    library where orjson refuses (a lone surrogate, an integer beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def failed_piece(name: str, reason: str) -> bytes:
    """One FailedNodes member: ``<name>:<reason>``, both as JSON strings."""
    return json_string(name) + b":" + json_string(reason)


def host_piece(name: str, score: int) -> bytes:
    """One HostPriority: ``{"Host":<name>,"Score":<score>}``."""
    return b'{"Host":' + json_string(name) + b',"Score":' + str(score).encode() + b"}"


class HostPieces(dict[str, bytes]):
    """``{"Host":<name>,"Score":<score>}`` per node name, for one score.

    Filled on first use (``__missing__``, so a hit is a C-level lookup) and emptied when it
    grows past ``limit``: the names come from requests, so the memory must stay bounded.
    """

    __slots__ = ("limit", "score")

    def __init__(self, score: int, limit: int) -> None:
        super().__init__()
        self.score = score
        self.limit = limit

    def __missing__(self, name: str) -> bytes:
        if len(self) >= self.limit:
            self.clear()
        piece = self[name] = host_piece(name, self.score)
        return piece


class PiecesByScore(dict[int, HostPieces]):
    """The pieces of each score (0..10: at most eleven tables)."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __missing__(self, score: int) -> HostPieces:
        pieces = self[score] = HostPieces(score, self.limit)
        return pieces


PIECES_PER_SCORE = 100_000  # names remembered per score: a large cluster, twice over
# Pieces of names no fit table holds (unknown nodes, pods placement does not apply to).
REQUESTED_PIECES = PiecesByScore(PIECES_PER_SCORE)


class KnownHosts(dict[str, bytes]):
    """A fit table's host pieces: node name -> its piece; a name the table does not know
    answers the piece of ``default_score`` (not stored here: it is not a node of the table)."""

    __slots__ = ("default_score",)

    def __init__(self, default_score: int) -> None:
        super().__init__()
        self.default_score = default_score

    def __missing__(self, name: str) -> bytes:
        return REQUESTED_PIECES[self.default_score][name]
