"""Response headers no HTTP peer sends (rls/response_cache/entry.py header_problem): judged without
int() on unbounded or non-ASCII text, named in one line, never an exception."""

from __future__ import annotations

import pytest

from rls.response_cache.entry import content_length, header_problem, status_code
from rls.response_cache.keys import Headers


def headers(*pairs: tuple[str, bytes]) -> Headers:
    return Headers(pairs)


@pytest.mark.parametrize("raw, expected", [
    (b"200", 200), (b"599", 599), (b"20", None), (b"2000", None), (b"2" * 5000, None),
    (b"\xb2\xb2\xb2", None), (b"\xd9\xa3\xd9\xa3\xd9\xa3"[:3], None), (b" 20", None),
    (b"-20", None),
])
def test_status_is_three_ascii_digits(raw: bytes, expected: int | None) -> None:
    assert status_code(headers((":status", raw))) == expected


@pytest.mark.parametrize("raw, expected", [
    (b"0", 0), (b" 42 ", 42), (b"9" * 19, int("9" * 19)), (b"9" * 20, None),
    (b"9" * 5000, None), (b"4, 4", None), (b"", None), (b"\xb2", None), (b"+4", None),
])
def test_content_length_is_up_to_19_ascii_digits(raw: bytes, expected: int | None) -> None:
    assert content_length(headers(("content-length", raw))) == expected


def test_header_problem_names_each_malformation() -> None:
    ok = [(":status", b"200"), ("content-length", b"4")]
    assert header_problem(headers(*ok)) is None
    absent = header_problem(headers(("content-length", b"4")))
    assert absent == ":status (absent) is not three digits"
    problem = header_problem(headers((":status", b"2" * 5000)))
    assert problem is not None and problem.startswith(":status b'2222") and "…" in problem
    assert "content-length" in (header_problem(headers(*ok[:1], ("content-length", b"x"))) or "")
    assert "300 bytes" in (header_problem(headers(*ok, ("n" * 300, b"v"))) or "")
    many = [(f"h{i}", b"") for i in range(65536)]
    assert "65538 headers" in (header_problem(headers(*ok, *many)) or "")
