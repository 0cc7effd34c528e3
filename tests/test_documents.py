"""read_document: text, PDF, and the ToolErrors for everything else."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from coterie.runtime.errors import ToolError
from coterie.runtime.memory.documents import read_document


def make_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF with one line of Helvetica text per page."""
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def _kind(exc: pytest.ExceptionInfo[ToolError]) -> str:
    return exc.value.kind


def test_utf8_text_and_markdown(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("héllo\r\nwörld ✓", encoding="utf-8")
    (tmp_path / "b.md").write_bytes(b"\xef\xbb\xbf# Title\n\nbody")  # with a BOM
    assert read_document(tmp_path / "a.txt") == "héllo\nwörld ✓"
    assert read_document(tmp_path / "b.md") == "# Title\n\nbody"


def test_unknown_extension_is_read_as_text(tmp_path: Path) -> None:
    (tmp_path / "notes.rst").write_text("plain text", encoding="utf-8")
    assert read_document(tmp_path / "notes.rst") == "plain text"


def test_pdf_text_is_extracted(tmp_path: Path) -> None:
    path = tmp_path / "doc.pdf"
    path.write_bytes(make_pdf(["Hello PDF world", "Second page (with parens)"]))
    assert read_document(path) == "Hello PDF world\n\nSecond page (with parens)"


def test_pdf_is_recognised_by_its_magic_bytes(tmp_path: Path) -> None:
    path = tmp_path / "download.bin"
    path.write_bytes(make_pdf(["Magic works"]))
    assert read_document(path) == "Magic works"


def test_non_utf8_text(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("café crème".encode("latin-1"))
    with pytest.raises(ToolError) as exc:
        read_document(path)
    assert _kind(exc) == "not_utf8"
    assert "not UTF-8" in exc.value.detail


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.raises(ToolError) as exc:
        read_document(path)
    assert _kind(exc) == "binary_file"
    assert "binary" in exc.value.detail


def test_oversize_file(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text("x" * 2_000, encoding="utf-8")
    with pytest.raises(ToolError) as exc:
        read_document(path, max_bytes=1_000)
    assert _kind(exc) == "too_large"
    assert "2,000 bytes" in exc.value.detail


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as exc:
        read_document(tmp_path / "nope.txt")
    assert _kind(exc) == "not_found"
    with pytest.raises(ToolError) as exc:
        read_document(tmp_path)
    assert _kind(exc) == "unreadable"


def test_corrupt_pdf(tmp_path: Path) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 9 0 R\ngarbage")
    with pytest.raises(ToolError) as exc:
        read_document(path)
    assert _kind(exc) == "unreadable"


def test_pdf_extension_without_pdf_content(tmp_path: Path) -> None:
    path = tmp_path / "fake.pdf"
    path.write_text("just text pretending", encoding="utf-8")
    with pytest.raises(ToolError) as exc:
        read_document(path)
    assert _kind(exc) == "unreadable"


def test_encrypted_pdf(tmp_path: Path) -> None:
    import pypdf

    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(make_pdf(["secret"]))))
    writer.encrypt(user_password="pw", owner_password="owner", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    path = tmp_path / "locked.pdf"
    path.write_bytes(buf.getvalue())
    with pytest.raises(ToolError) as exc:
        read_document(path)
    assert _kind(exc) == "unreadable"
    assert "encrypted" in exc.value.detail


def test_owner_password_only_pdf_is_readable(tmp_path: Path) -> None:
    import pypdf

    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(make_pdf(["open text"]))))
    writer.encrypt(user_password="", owner_password="owner", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    path = tmp_path / "restricted.pdf"
    path.write_bytes(buf.getvalue())
    assert read_document(path) == "open text"


def test_pdf_without_text(tmp_path: Path) -> None:
    path = tmp_path / "blank.pdf"
    path.write_bytes(make_pdf([""]))
    with pytest.raises(ToolError) as exc:
        read_document(path)
    assert _kind(exc) == "unreadable"
    assert "no extractable text" in exc.value.detail
