"""Long-term memory: records, the LanceDB store, embedders, chunking,
document reading, the server that owns a store and the per-persona client.

Importing this package loads neither LanceDB, Arrow nor torch: those load
when a store is opened or a model embeds its first text.
"""

from __future__ import annotations

from runtime.memory.chunking import chunk_spans, chunk_text
from runtime.memory.client import MemoryBackend, MemoryClient
from runtime.memory.documents import read_document
from runtime.memory.embedders import (
    Embedder,
    HashingEmbedder,
    LazyEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    build_embedder,
    embedder_from_settings,
    embedder_process_env,
)
from runtime.memory.records import (
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
from runtime.memory.server import MemoryServer, open_store
from runtime.memory.store import MemoryStore

__all__ = [
    "RECOMMENDED_DIMENSIONS",
    "Embedder",
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
    "OpenAIEmbedder",
    "RecallHit",
    "Source",
    "UserModelRow",
    "build_embedder",
    "chunk_spans",
    "chunk_text",
    "embedder_from_settings",
    "embedder_process_env",
    "open_store",
    "read_document",
]
