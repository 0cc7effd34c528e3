"""Long-term memory: records, the LanceDB store, embedders, chunking,
document reading, the server that owns a store and the per-persona client.

Importing this package loads neither LanceDB, Arrow nor torch. The records
and the client (what every persona process needs) load with the package;
the store, the server, the embedders and the document readers load on first
use of one of their names, so a persona process never pays for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from coterie.runtime.memory.client import MemoryBackend, MemoryClient
from coterie.runtime.memory.records import (
    RECOMMENDED_DIMENSIONS,
    IngestResult,
    MemoryInput,
    MemoryRow,
    MemoryStats,
    Mode,
    RecallHit,
    Source,
    UserModelRow,
)

if TYPE_CHECKING:
    from coterie.runtime.memory.choice import (
        EmbedderChoice,
        LazyEmbedder,
        build_embedder,
        choose_embedder,
        embedder_from_settings,
        embedder_process_env,
    )
    from coterie.runtime.memory.chunking import chunk_spans, chunk_text
    from coterie.runtime.memory.documents import read_document
    from coterie.runtime.memory.embedders import (
        Embedder,
        FullTextOnly,
        HashingEmbedder,
        MiniLMEmbedder,
        NumpyMiniLMEmbedder,
        OpenAIEmbedder,
    )
    from coterie.runtime.memory.server import MemoryServer, open_store
    from coterie.runtime.memory.store import MemoryStore

#: Names loaded on first use, and the module each comes from.
_LAZY = {
    "chunk_spans": "chunking",
    "chunk_text": "chunking",
    "read_document": "documents",
    "Embedder": "embedders",
    "FullTextOnly": "embedders",
    "HashingEmbedder": "embedders",
    "MiniLMEmbedder": "embedders",
    "NumpyMiniLMEmbedder": "embedders",
    "OpenAIEmbedder": "embedders",
    "EmbedderChoice": "choice",
    "LazyEmbedder": "choice",
    "build_embedder": "choice",
    "choose_embedder": "choice",
    "embedder_from_settings": "choice",
    "embedder_process_env": "choice",
    "MemoryServer": "server",
    "open_store": "server",
    "MemoryStore": "store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "RECOMMENDED_DIMENSIONS",
    "Embedder",
    "EmbedderChoice",
    "FullTextOnly",
    "HashingEmbedder",
    "IngestResult",
    "LazyEmbedder",
    "MemoryBackend",
    "MemoryClient",
    "MemoryInput",
    "MemoryRow",
    "MemoryServer",
    "MemoryStats",
    "MemoryStore",
    "MiniLMEmbedder",
    "Mode",
    "NumpyMiniLMEmbedder",
    "OpenAIEmbedder",
    "RecallHit",
    "Source",
    "UserModelRow",
    "build_embedder",
    "choose_embedder",
    "chunk_spans",
    "chunk_text",
    "embedder_from_settings",
    "embedder_process_env",
    "open_store",
    "read_document",
]
