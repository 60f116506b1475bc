"""A real PDF made in the test, byte by byte as the PDF 1.4 reference lays one out: a catalog, a page tree,
one page per text with its content stream (Flate-compressed when asked), the standard Helvetica font, and a
cross-reference table with each object's exact offset. No PDF library is needed to make it."""

from __future__ import annotations

import zlib


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(pages: list[list[str]], *, compress: bool = False) -> bytes:
    """A PDF with one page per item of `pages`, each line of it drawn one under the other in Helvetica."""
    count = len(pages)
    # Objects: 1 catalog, 2 page tree, 3 font, then per page: the page and its content stream.
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(f"{4 + 2 * n} 0 R".encode() for n in range(count))
        + f"] /Count {count} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for n, lines in enumerate(pages):
        drawn = (
            "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({_escape(line)}) Tj T*" for line in lines) + " ET"
        )
        stream = drawn.encode("cp1252")
        extra = ""
        if compress:
            stream, extra = zlib.compress(stream), " /Filter /FlateDecode"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * n} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        objects.append(f"<< /Length {len(stream)}{extra} >>\nstream\n".encode() + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)
