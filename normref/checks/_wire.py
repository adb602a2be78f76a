"""The wire format between a check's client and the grader.

A message is a JSON header plus a dict of numpy arrays packed as `.npz` with
`allow_pickle=False`, so nothing that crosses it can run code on the other
side. Frames are length-prefixed; a frame larger than MAX_FRAME is refused.
"""

import io
import json
import struct

import numpy as np

MAX_FRAME = 256 * 1024 * 1024
_LENGTHS = struct.Struct("!II")


def pack(header, arrays):
    """Encode (header dict, {name: array}) into one frame of bytes."""
    header_bytes = json.dumps(header).encode()
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    payload = buffer.getvalue()
    return _LENGTHS.pack(len(header_bytes), len(payload)) + header_bytes + payload


def _read_exactly(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def send(sock, header, arrays=None):
    sock.sendall(pack(header, arrays or {}))


def receive(sock):
    """Read one frame; returns (header dict, {name: array})."""
    header_len, payload_len = _LENGTHS.unpack(_read_exactly(sock, _LENGTHS.size))
    if header_len + payload_len > MAX_FRAME:
        raise ValueError(f"message of {header_len + payload_len} bytes is too large")
    header = json.loads(_read_exactly(sock, header_len))
    with np.load(io.BytesIO(_read_exactly(sock, payload_len)), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return header, arrays


def flatten_cases(cases):
    """[(label, {key: array})] -> (labels, {"i/key": array})."""
    labels, arrays = [], {}
    for i, (label, case) in enumerate(cases):
        labels.append(label)
        for key, value in case.items():
            arrays[f"{i}/{key}"] = value
    return labels, arrays


def unflatten_cases(labels, arrays):
    """Inverse of flatten_cases."""
    cases = [(label, {}) for label in labels]
    for name, value in arrays.items():
        index, key = name.split("/", 1)
        cases[int(index)][1][key] = value
    return cases
