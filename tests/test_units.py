from __future__ import annotations

import pytest

from pareto.errors import UsageError
from pareto.units import format_ms, parse_duration_ms, parse_size_bytes


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("7ms", 7.0),
        ("7 ms", 7.0),
        ("500us", 0.5),
        ("500µs", 0.5),
        ("0.007s", 7.0),
        ("2min", 120_000.0),
        ("1.5e3us", 1.5),
        (" 10 s ", 10_000.0),
    ],
)
def test_durations(text: str, ms: float) -> None:
    assert parse_duration_ms(text) == pytest.approx(ms)


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("7", "has no unit"),
        (7, "has no unit"),
        ("7parsecs", "Unknown time unit"),
        ("-3ms", "must be positive"),
        ("0ms", "must be positive"),
        ("fast", "Cannot read"),
        ("", "Cannot read"),
    ],
)
def test_bad_durations_say_the_right_form(text: object, phrase: str) -> None:
    with pytest.raises(UsageError, match=phrase) as info:
        parse_duration_ms(text)  # type: ignore[arg-type]
    assert "'7ms'" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "n"),
    [("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("2 gb", 2 * 10**9), ("1.5KiB", 1536), ("10B", 10)],
)
def test_sizes(text: str, n: int) -> None:
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("text", ["512", "2 parsecs", "-1GB", "GB"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size_bytes(text)


def test_format_ms() -> None:
    assert format_ms(0.4123) == "0.412 ms"
    assert format_ms(7.314) == "7.31 ms"
    assert format_ms(None) == "—"
