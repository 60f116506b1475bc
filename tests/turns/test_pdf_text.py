"""app.turns.pdf_text on real PDFs made in the test (tests/support/pdf.py): each page's text in order, plain
and Flate-compressed streams, a cut at the limit, and a file that is not a PDF read as None."""

from __future__ import annotations

import pytest

from app.turns.pdf_text import pdf_text
from tests.support.pdf import make_pdf


@pytest.mark.parametrize("compress", [False, True])
def test_each_pages_text_comes_in_order(compress: bool) -> None:
    pdf = make_pdf(
        [["Quarterly report", "Revenue grew (a lot)."], [], ["Second page: costs fell."]], compress=compress
    )
    text = pdf_text(pdf, 10_000)
    assert text is not None
    assert text.split("\n\n") == ["Quarterly report\nRevenue grew (a lot).", "Second page: costs fell."]


def test_the_text_is_cut_at_the_limit() -> None:
    text = pdf_text(make_pdf([["abcdefghij" * 5]]), 20)
    assert text == "abcdefghij" * 2 + "\n[the text is cut at 20 characters]"


def test_a_file_that_is_not_a_readable_pdf_is_none(caplog: pytest.LogCaptureFixture) -> None:
    assert pdf_text(b"%PDF-1.7 but nothing after", 100) is None
