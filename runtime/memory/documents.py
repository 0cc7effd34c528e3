"""Reading documents for the knowledge base: UTF-8 text and PDF.

Every expected failure is a :class:`~runtime.errors.ToolError` the model can
act on (``not_found``, ``too_large``, ``binary_file``, ``not_utf8``,
``unreadable``). ``pypdf`` is imported
only when a PDF is read.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from coterie.runtime.errors import ToolError

if TYPE_CHECKING:
    from pypdf import PdfReader

__all__ = ["read_document"]

#: How much of a file to sniff for NUL bytes when deciding it is binary.
_SNIFF = 8192


def read_document(path: Path, *, max_bytes: int = 10_000_000) -> str:
    """The text of ``path``: a PDF's extracted text, or the file as UTF-8.

    Line endings are normalised to ``\\n`` and a UTF-8 byte-order mark is
    dropped. Files over ``max_bytes`` are refused before they are read.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ToolError("not_found", f"{path} does not exist") from None
    except OSError as exc:
        raise ToolError("unreadable", f"{path} cannot be read: {exc.strerror or exc}") from None
    if not path.is_file():
        raise ToolError("unreadable", f"{path} is not a regular file")
    if size > max_bytes:
        raise ToolError(
            "too_large", f"{path} is {size:,} bytes; documents are limited to {max_bytes:,} bytes"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ToolError("unreadable", f"{path} cannot be read: {exc.strerror or exc}") from None

    if data.startswith(b"%PDF-") or path.suffix.lower() == ".pdf":
        text = _pdf_text(path, data)
    else:
        text = _utf8_text(path, data)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _utf8_text(path: Path, data: bytes) -> str:
    if b"\x00" in data[:_SNIFF]:
        # Valid UTF-8 can contain NUL, but text documents do not: this is a
        # binary file (an image, an archive, UTF-16 …).
        raise ToolError("binary_file", f"{path} looks like a binary file, not text or PDF")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ToolError(
            "not_utf8",
            f"{path} is not UTF-8 text (invalid byte at offset {exc.start}); "
            "convert it to UTF-8 first",
        ) from None


def _pdf_text(path: Path, data: bytes) -> str:
    try:
        import pypdf
    except ImportError:  # pragma: no cover - pypdf is a declared dependency
        raise ToolError("unreadable", "PDF support is not installed (pip install pypdf)") from None

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _open_without_password(reader):
            raise ToolError("unreadable", f"{path} is an encrypted PDF; a password is required")
        pages = [page.extract_text() or "" for page in reader.pages]
    except ToolError:
        raise
    except Exception as exc:
        # pypdf signals damaged files with many exception types (PdfReadError,
        # ValueError, KeyError …), none of which the caller can do more about.
        reason = str(exc) or type(exc).__name__
        raise ToolError("unreadable", f"{path} is not a readable PDF: {reason}") from None
    text = "\n\n".join(page.strip() for page in pages if page.strip())
    if not text:
        raise ToolError(
            "unreadable", f"{path} has no extractable text (a scanned PDF needs OCR first)"
        )
    return text


def _open_without_password(reader: PdfReader) -> bool:
    # A PDF with only an owner password (print/copy restrictions) opens with
    # the empty user password; anything else needs a password we lack.
    try:
        return bool(reader.decrypt(""))
    except Exception:
        return False
