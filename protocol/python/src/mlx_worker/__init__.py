"""The Python side of mlx-worker's protocol (protocol.md): a client for the ``mlx-worker``
binary, blocking (:class:`Client`) and asyncio (:class:`AsyncClient`), the protocol's types
(:mod:`mlx_worker.types`, generated from ``protocol/schema.json``), one exception class per
error code (:mod:`mlx_worker.errors`), and Studio's drop-in backend and message bridge
(:mod:`mlx_worker.studio`). Standard library only.
"""

from . import _types as types
from ._core import BINARY_ENV, find_binary
from ._types import PROTOCOL_VERSION
from .aio import AsyncClient, AsyncGeneration
from .client import Client, Generation
from .errors import (
    BusyError,
    ContextOverflowError,
    GenerationFailedError,
    MemoryBudgetError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    LoadFailedError,
    MethodNotFoundError,
    MLXWorkerError,
    NoModelError,
    ParseError,
    RequestCancelledError,
    WorkerDiedError,
    WorkerError,
    WorkerNotFoundError,
)

__version__ = "0.1.0"

__all__ = [
    "BINARY_ENV",
    "PROTOCOL_VERSION",
    "AsyncClient",
    "AsyncGeneration",
    "BusyError",
    "Client",
    "ContextOverflowError",
    "Generation",
    "GenerationFailedError",
    "MemoryBudgetError",
    "InternalError",
    "InvalidParamsError",
    "InvalidRequestError",
    "LoadFailedError",
    "MLXWorkerError",
    "MethodNotFoundError",
    "NoModelError",
    "ParseError",
    "RequestCancelledError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerNotFoundError",
    "find_binary",
    "types",
]
