"""Parsing of durations ("7ms", "500us", "0.007s") and sizes ("512MiB", "2GB"); no torch here."""

from __future__ import annotations

import math
import re

from pareto.errors import UsageError

_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/]*)\s*$")

_DURATION_MS = {
    "ns": 1e-6,
    "us": 1e-3,
    "µs": 1e-3,
    "ms": 1.0,
    "s": 1e3,
    "sec": 1e3,
    "min": 60e3,
    "h": 3600e3,
}
_SIZE_BYTES = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _split(text: str | float | int, what: str, example: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UsageError(f"{what} {text!r} is not a {what}; write it like {example}.")
    if isinstance(text, (int, float)):
        raise UsageError(f"{what.capitalize()} {text!r} has no unit; write it like {example}.")
    match = _QUANTITY.match(str(text))
    if match is None:
        raise UsageError(f"Cannot read {what} {text!r}; write it like {example}.")
    value, unit = float(match.group(1)), match.group(2)
    if not unit:
        raise UsageError(f"{what.capitalize()} {text!r} has no unit; write it like {example}.")
    return value, unit


def parse_duration_ms(text: str | float | int) -> float:
    """Parse a positive duration with a unit into milliseconds.

    Raises:
        UsageError: no unit, unknown unit, or a value that is not positive.
    """
    example = "'7ms', '500us' or '0.007s'"
    value, unit = _split(text, "duration", example)
    factor = _DURATION_MS.get(unit) or _DURATION_MS.get(unit.lower())
    if factor is None:
        raise UsageError(f"Unknown time unit {unit!r} in {text!r}; write it like {example}.")
    if not value > 0:
        raise UsageError(f"Duration {text!r} must be positive; write it like {example}.")
    return value * factor


#: The largest size a stored row holds: a signed 64-bit integer column (SQLite and PostgreSQL alike).
MAX_SIZE_BYTES = 2**63


def parse_size_bytes(text: str | float | int) -> int:
    """Parse a positive size with a unit (``512MiB``, ``2GB``) into bytes.

    Raises:
        UsageError: no unit, unknown unit, or a value that is not positive.
    """
    example = "'512MiB' or '2GB'"
    value, unit = _split(text, "size", example)
    factor = _SIZE_BYTES.get(unit.lower())
    if factor is None:
        raise UsageError(f"Unknown size unit {unit!r} in {text!r}; write it like {example}.")
    if not value > 0:
        raise UsageError(f"Size {text!r} must be positive; write it like {example}.")
    size = value * factor
    if not size < MAX_SIZE_BYTES:  # inf, and what a 64-bit database column cannot hold
        raise UsageError(f"Size {text!r} is over the 8 EiB a database stores; write it like {example}.")
    return round(size)


_RATE = re.compile(rf"^\s*{_NUMBER}\s*(?:samples?|items?|queries|q)?\s*(/\s*s|/\s*sec|per\s+s(?:econd)?|qps)\s*$", re.I)


def parse_rate_per_s(text: str | float | int) -> float:
    """Parse a positive throughput (``500/s``, ``500 samples/s``, ``1.2e4/s``) into items per second.

    Raises:
        UsageError: no ``/s`` unit, or a value that is not positive.
    """
    example = "'500/s'"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        raise UsageError(f"Throughput {text!r} has no unit; write it like {example}.")
    match = _RATE.match(str(text))
    if match is None:
        raise UsageError(f"Cannot read throughput {text!r}; write it like {example}.")
    value = float(match.group(1))
    if not value > 0:
        raise UsageError(f"Throughput {text!r} must be positive; write it like {example}.")
    return value


def parse_request_rate(text: str | float | int) -> float:
    """Parse a request rate (``800/s``, ``800 qps``, or a bare number, read as requests per second).

    Raises:
        UsageError: unreadable, not finite (``1e400/s``, ``nan``), or not above 0; one sentence each.
    """
    example = "'800/s' or 800"
    if isinstance(text, bool):
        raise UsageError(f"Cannot read the request rate {text!r}; write it like {example}.")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _RATE.match(str(text))
        try:
            value = float(match.group(1)) if match is not None else float(str(text).strip())
        except ValueError:
            raise UsageError(f"Cannot read the request rate {text!r}; write it like {example}.") from None
    if not math.isfinite(value):
        raise UsageError(f"The request rate {text!r} is not a finite number of requests per second.")
    if not value > 0:
        raise UsageError(f"The request rate {text!r} must be above 0 requests per second.")
    return value


def format_ms(value_ms: float | None) -> str:
    """Milliseconds for people: ``0.412 ms``, ``7.31 ms``, ``132 ms``."""
    if value_ms is None:
        return "—"
    if value_ms == float("inf"):
        return "∞"
    if value_ms < 0.01:
        return f"{value_ms * 1000:.3g} µs"
    if value_ms < 1:
        return f"{value_ms:.3f} ms"
    if value_ms < 100:
        return f"{value_ms:.2f} ms"
    return f"{value_ms:.0f} ms"


def format_bytes(value: float | None) -> str:
    """Bytes for people, in binary units: ``3.2 MiB``."""
    if value is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
