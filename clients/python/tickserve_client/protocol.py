"""The shared-memory protocol's fixed binary layout (docs/shm.md, crates/tickserve-shm-protocol):
requests written, answers read. Little-endian; every block 8-byte aligned."""
import struct

import numpy as np

REQUEST_MAGIC = b"TSQ2"  # version 2: 64-bit model handles
ANSWER_MAGIC = b"TSA2"
LOOKUP, INFER = 1, 2
ANSWER_LOOKUP, ANSWER_INFER, ANSWER_ERROR = 1, 2, 3

# Triton's TYPE_* numbers.
DATATYPES = {
    1: ("BOOL", np.dtype(np.bool_)), 2: ("UINT8", np.dtype(np.uint8)),
    3: ("UINT16", np.dtype("<u2")), 4: ("UINT32", np.dtype("<u4")), 5: ("UINT64", np.dtype("<u8")),
    6: ("INT8", np.dtype(np.int8)), 7: ("INT16", np.dtype("<i2")), 8: ("INT32", np.dtype("<i4")),
    9: ("INT64", np.dtype("<i8")), 10: ("FP16", np.dtype("<f2")), 11: ("FP32", np.dtype("<f4")),
    12: ("FP64", np.dtype("<f8")),
}
CODES = {dtype: code for code, (_, dtype) in DATATYPES.items()}
ERRORS = {1: "INVALID_ARGUMENT", 2: "NOT_FOUND", 3: "PAYLOAD_TOO_LARGE", 4: "UNAVAILABLE",
          5: "RESOURCE_EXHAUSTED", 6: "DEADLINE_EXCEEDED", 7: "INTERNAL", 8: "FAILED_PRECONDITION",
          9: "OUT_OF_RANGE"}

_HEADER = struct.Struct("<4sBBHQQII")
_ANSWER = struct.Struct("<4sBBHQIIII")
_LOOKUP_ANSWER = struct.Struct("<4sBBHQQII")
_TENSOR = struct.Struct("<HBBIQ")
_BLOCK = struct.Struct("<BBHI")
_PARAMETER = struct.Struct("<HBBI")
FLAG_PARAMETERS = 1
PARAMETERS_VERSION = 1


class ServerError(Exception):
    """The server refused or failed a request: `code` as gRPC spells it, and its message."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _pad(n):
    return (n + 7) & ~7


def lookup_request(request_id, name, version=""):
    name_b, version_b = name.encode(), version.encode()
    return b"".join([
        _HEADER.pack(REQUEST_MAGIC, LOOKUP, 0, 0, request_id, 0, 0, 0),
        struct.pack("<HHI", len(name_b), len(version_b), 0),
        name_b.ljust(_pad(len(name_b)), b"\0"), version_b.ljust(_pad(len(version_b)), b"\0"),
    ])


def _parameter(name, value):
    """One parameter of the block: bool, int (int64, or uint64 above it), float or str."""
    name_b = name.encode()
    if isinstance(value, bool):
        kind, data = 1, struct.pack("<Q", int(value))
    elif isinstance(value, int):
        kind, data = (2, struct.pack("<q", value)) if value < 2**63 else (3, struct.pack("<Q", value))
    elif isinstance(value, float):
        kind, data = 4, struct.pack("<d", value)
    elif isinstance(value, str):
        kind, data = 5, value.encode()
    else:
        raise TypeError(f"parameter {name}: {type(value).__name__}; bool, int, float or str")
    return b"".join([_PARAMETER.pack(len(name_b), kind, 0, len(data)),
                     name_b.ljust(_pad(len(name_b)), b"\0"), data.ljust(_pad(len(data)), b"\0")])


def infer_request(request_id, handle, timeout_us, inputs, parameters=None):
    """`inputs`: (name bytes, array) pairs; `parameters`: a dict of v2 parameters
    (`priority`, `sequence_id`, `sequence_start`, ...), sent in the parameter block."""
    flags = FLAG_PARAMETERS if parameters else 0
    parts = [_HEADER.pack(REQUEST_MAGIC, INFER, flags, len(inputs), request_id, handle, timeout_us, 0)]
    if parameters:
        parts.append(_BLOCK.pack(PARAMETERS_VERSION, 0, len(parameters), 0))
        parts.extend(_parameter(name, value) for name, value in parameters.items())
    for name, array in inputs:
        code = CODES.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
        if code is None:
            raise TypeError(f"input {name.decode()}: numpy dtype {array.dtype} has no tickserve datatype")
        data = np.ascontiguousarray(array).tobytes()
        parts.append(_TENSOR.pack(len(name), code, array.ndim, 0, len(data)))
        parts.append(struct.pack(f"<{array.ndim}q", *array.shape))
        parts.append(name.ljust(_pad(len(name)), b"\0"))
        parts.append(data.ljust(_pad(len(data)), b"\0"))
    return b"".join(parts)


def _tensors(view, at, count):
    tensors = []
    for _ in range(count):
        name_len, code, ndims, _, data_len = _TENSOR.unpack_from(view, at)
        at += _TENSOR.size
        dims = struct.unpack_from(f"<{ndims}q", view, at)
        at += 8 * ndims
        name = bytes(view[at:at + name_len]).decode()
        at += _pad(name_len)
        data = view[at:at + data_len]
        at += _pad(data_len)
        tensors.append((name, code, dims, data))
    return tensors


def read_answer(view):
    """An answer's kind and contents: ("lookup", handle, inputs, outputs), ("infer", outputs dict)."""
    magic, kind, error, count, request_id, _, queue_us, compute_us, _ = _ANSWER.unpack_from(view, 0)
    _, _, _, _, _, handle, _, inputs = _LOOKUP_ANSWER.unpack_from(view, 0)
    if magic != ANSWER_MAGIC:
        raise ConnectionError("not a tickserve answer")
    if kind == ANSWER_ERROR:
        length, = struct.unpack_from("<I", view, _ANSWER.size)
        message = bytes(view[_ANSWER.size + 8:_ANSWER.size + 8 + length]).decode()
        raise ServerError(ERRORS.get(error, f"ERROR {error}"), message)
    tensors = _tensors(view, _ANSWER.size, count)
    if kind == ANSWER_LOOKUP:
        return ("lookup", handle, tensors[:inputs], tensors[inputs:])
    outputs = {}
    for name, code, dims, data in tensors:
        dtype = DATATYPES[code][1]
        outputs[name] = np.frombuffer(bytes(data), dtype=dtype).reshape(dims)
    return ("infer", outputs)
