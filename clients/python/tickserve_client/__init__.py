"""tickserve's Python client: inference over shared memory (iceoryx2) from the server's host.

    from tickserve_client import ShmClient
    outputs = ShmClient().infer("alpha_mlp", {"features": x})   # numpy in, numpy out
"""
from .protocol import ServerError
from .shm import ShmClient

__all__ = ["ShmClient", "ServerError"]
