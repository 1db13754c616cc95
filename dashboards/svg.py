"""Small SVG pieces the offline reports' charts share."""

from __future__ import annotations

import html


def empty_svg(message: str, width: int) -> str:
    """A chart's place when there is nothing to draw: the reason, in grey."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40" role="img" '
            f'aria-label="{html.escape(message)}"><text x="10" y="24" font-size="13" fill="#555">'
            f'{html.escape(message)}</text></svg>')
