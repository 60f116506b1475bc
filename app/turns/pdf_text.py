"""A PDF's text, for a model that does not read documents (PARLEY_FILES_PDF_TEXT, docs/files.md): the text of
each page in order, as pypdf extracts it (its layout-free mode: the characters in the order the page draws
them, lines kept). Images and scanned pages have none; OCR is not attempted.

pypdf is imported where it is used: a service without the setting never loads it.
"""

from __future__ import annotations

import io
import logging

log = logging.getLogger(__name__)


def pdf_text(data: bytes, limit: int) -> str | None:
    """The text of the PDF's pages, blank pages left out, at most `limit` characters (then a line that says
    it was cut); None when the file cannot be read as a PDF (malformed, or encrypted with a password)."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return None
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    # pypdf raises many kinds on a malformed file (its PdfReadError, and ValueError, KeyError, TypeError,
    # AssertionError from deep in a parser): the turn goes on and says the text could not be read.
    except Exception:
        log.warning("a PDF's text could not be extracted", exc_info=True)
        return None
    text = "\n\n".join(page for page in pages if page)
    if len(text) > limit:
        return text[:limit] + f"\n[the text is cut at {limit} characters]"
    return text
