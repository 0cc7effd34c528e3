"""A shell process's output: the rolling buffer and the secret redactor."""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_BUFFER_BYTES = 64 * 1024


class OutputBuffer:
    """A rolling byte buffer addressed by absolute offsets.

    Offsets count every byte ever appended; only the last ``cap`` bytes are
    kept. ``read(since)`` reports how many requested bytes were already gone.
    """

    def __init__(self, cap: int = DEFAULT_BUFFER_BYTES) -> None:
        if cap <= 0:
            raise ValueError("cap must be positive")
        self.cap = cap
        self._data = bytearray()
        self._start = 0  # absolute offset of _data[0]

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._start + len(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def append(self, chunk: bytes) -> None:
        if not chunk:
            return
        if len(chunk) >= self.cap:
            self._start = self.end + len(chunk) - self.cap
            self._data = bytearray(chunk[-self.cap :])
            return
        self._data += chunk
        excess = len(self._data) - self.cap
        if excess > 0:
            del self._data[:excess]
            self._start += excess

    def read(self, since: int | None = None) -> tuple[bytes, int, int]:
        """``(chunk, next_offset, dropped_bytes)`` from absolute offset ``since``."""
        pos = self._start if since is None else max(0, since)
        dropped = 0
        if pos < self._start:
            dropped = self._start - pos
            pos = self._start
        pos = min(pos, self.end)
        return bytes(self._data[pos - self._start :]), self.end, dropped


class Redactor:
    """Replaces secret values in a byte stream, even when split across chunks.

    Only a suffix that could begin a secret is held back until more arrives.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        pairs = [(v.encode(), f"[redacted:{k}]".encode()) for k, v in secrets.items() if v]
        self._pairs = sorted(pairs, key=lambda p: -len(p[0]))
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._pairs:
            return chunk
        data = self._replace(self._pending + chunk)
        hold = self._hold(data)
        self._pending = data[len(data) - hold :] if hold else b""
        return data[: len(data) - hold]

    def flush(self) -> bytes:
        out, self._pending = self._pending, b""
        return out

    def _replace(self, data: bytes) -> bytes:
        for value, marker in self._pairs:
            data = data.replace(value, marker)
        return data

    def _hold(self, data: bytes) -> int:
        best = 0
        for value, _ in self._pairs:
            for k in range(min(len(value) - 1, len(data)), best, -1):
                if data.endswith(value[:k]):
                    best = k
                    break
        return best

    def text(self, text: str) -> str:
        for value, marker in self._pairs:
            text = text.replace(value.decode(), marker.decode())
        return text


__all__ = ["DEFAULT_BUFFER_BYTES", "OutputBuffer", "Redactor"]
