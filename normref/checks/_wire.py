"""The wire format between a check's client and the grader.

A message is a JSON header plus a dict of numpy arrays packed as an
uncompressed `.npz`. The reader trusts nothing in a frame: it refuses pickled
and object arrays, compressed members (a small frame must not inflate into
gigabytes) and any array whose declared shape needs more bytes than the frame
carries, all before it allocates anything. A frame larger than MAX_FRAME, or a
header larger than MAX_HEADER, is refused unread.
"""

import io
import json
import math
import struct
import zipfile

import numpy as np

MAX_FRAME = 64 * 1024 * 1024
MAX_HEADER = 1024 * 1024
MAX_ARRAYS = 4096
_LENGTHS = struct.Struct("!II")


class FrameRefused(ValueError):
    """A frame that breaks the wire format's limits; it was not loaded."""


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


def _read_member(archive, info):
    """One .npy member as an array, checked before anything is allocated."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise FrameRefused(f"{info.filename}: compressed members are refused")
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
        else:
            raise FrameRefused(f"{info.filename}: npy version {version} is refused")
        if dtype.hasobject:
            raise FrameRefused(f"{info.filename}: object arrays are refused")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > info.file_size:
            raise FrameRefused(f"{info.filename}: declares {nbytes} bytes, carries fewer")
        data = member.read(nbytes)
    if len(data) != nbytes:
        raise FrameRefused(f"{info.filename}: truncated array")
    array = np.frombuffer(data, dtype=dtype, count=math.prod(shape))
    return array.reshape(shape, order="F" if fortran else "C").copy()


def load_arrays(payload):
    """{name: array} from an uncompressed .npz payload, refusing anything unsafe."""
    if not payload:
        return {}
    try:
        archive = zipfile.ZipFile(io.BytesIO(payload))
    except zipfile.BadZipFile as exc:
        raise FrameRefused(f"not an npz archive: {exc}") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ARRAYS:
            raise FrameRefused(f"{len(infos)} arrays in one frame (at most {MAX_ARRAYS})")
        if sum(info.file_size for info in infos) > len(payload):
            raise FrameRefused("the members declare more bytes than the frame holds")
        arrays = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise FrameRefused(f"{info.filename}: not an .npy member")
            arrays[info.filename[:-4]] = _read_member(archive, info)
    return arrays


def receive(sock):
    """Read one frame; returns (header dict, {name: array})."""
    header_len, payload_len = _LENGTHS.unpack(_read_exactly(sock, _LENGTHS.size))
    if header_len > MAX_HEADER or header_len + payload_len > MAX_FRAME:
        raise FrameRefused(f"message of {header_len + payload_len} bytes is too large")
    header = json.loads(_read_exactly(sock, header_len))
    if not isinstance(header, dict):
        raise FrameRefused("the header is not a JSON object")
    return header, load_arrays(_read_exactly(sock, payload_len))


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
