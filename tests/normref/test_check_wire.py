"""The wire between the sandboxed kernel and the grader, frame by frame.

Each test fails on a small bug in normref/checks/_wire.py (`make mutation`),
among them a reader that would unpickle what the kernel sends.
"""

import io
import json
import socket
import struct
import threading
import zipfile

import numpy as np
import pytest

from normref.checks import _wire
from normref.checks._wire import FrameRefused

UNPICKLED = []


class _Payload:
    """Unpickling this object runs code in the grader: it must never happen."""

    def __reduce__(self):
        return (UNPICKLED.append, ("the grader ran the kernel's code",))


def _through_a_socket(frame, *, close=True):
    """What _wire.receive makes of `frame` sent over a real socket pair."""
    grader, kernel = socket.socketpair()
    grader.settimeout(10)
    sender = threading.Thread(target=lambda: (kernel.sendall(frame),
                                              kernel.close() if close else None))
    sender.start()
    try:
        return _wire.receive(grader)
    finally:
        sender.join()
        grader.close()
        kernel.close()


def _npz(members, compression=zipfile.ZIP_STORED):
    """An .npz built by hand: {member name: bytes}."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _npy(array, version=(1, 0)):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version, allow_pickle=True)
    return buffer.getvalue()


def _frame(header_bytes, payload):
    return struct.pack("!II", len(header_bytes), len(payload)) + header_bytes + payload


def test_a_pickled_object_array_is_refused_unread_by_receive():
    UNPICKLED.clear()
    pickled = np.array([_Payload(), 1], dtype=object)
    frame = _frame(b'{"op": "judge"}', _npz({"0/y.npy": _npy(pickled)}))
    with pytest.raises(FrameRefused, match="0/y.npy: object arrays are refused"):
        _through_a_socket(frame)
    assert UNPICKLED == []


def test_a_frame_round_trips_header_and_arrays_exactly():
    arrays = {"0/y": np.arange(12.0).reshape(3, 4), "0/f": np.asfortranarray(
        np.arange(6, dtype=np.float32).reshape(2, 3)), "1/s": np.array("text"),
        "1/b": np.array([True, False]), "2/e": np.zeros((0, 3)), "2/i": np.int64(7),
        "big": np.arange(300_000, dtype=np.float64)}  # 2.4 MB: several reads
    header, got = _through_a_socket(_wire.pack({"op": "judge", "n": [1, 2]}, arrays))
    assert header == {"op": "judge", "n": [1, 2]}
    assert sorted(got) == sorted(arrays)
    for name, array in arrays.items():
        array = np.asarray(array)
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)
    assert got["0/y"].flags.writeable


def test_a_frame_without_arrays():
    grader, kernel = socket.socketpair()
    with grader, kernel:
        _wire.send(kernel, {"passed": True})
        assert _wire.receive(grader) == ({"passed": True}, {})
    assert _through_a_socket(_frame(b"{}", b"")) == ({}, {})


@pytest.mark.parametrize("cut", [3, 10, 20])
def test_a_frame_cut_short_is_a_closed_connection(cut):
    frame = _wire.pack({"op": "cases"}, {"x": np.ones(3)})
    with pytest.raises(ConnectionError, match="^the other side closed the connection$"):
        _through_a_socket(frame[:cut])


def test_an_oversized_header_is_refused_before_it_is_read():
    frame = struct.pack("!II", _wire.MAX_HEADER + 1, 0)
    with pytest.raises(FrameRefused, match=f"message of {_wire.MAX_HEADER + 1} bytes"):
        _through_a_socket(frame, close=False)  # waits for nothing more


def test_a_header_at_the_limit_is_read():
    body = json.dumps({"pad": ""}).encode()
    header = json.dumps({"pad": " " * (_wire.MAX_HEADER - len(body))}).encode()
    assert len(header) == _wire.MAX_HEADER
    assert _through_a_socket(_frame(header, b""))[0]["pad"].strip() == ""


def test_an_oversized_frame_is_refused_before_it_is_read():
    frame = struct.pack("!II", 2, _wire.MAX_FRAME - 1)
    with pytest.raises(FrameRefused, match=f"message of {_wire.MAX_FRAME + 1} bytes is too"):
        _through_a_socket(frame, close=False)
    # At the limit, the reader waits for the bytes (here: the sender hangs up).
    frame = struct.pack("!II", 2, _wire.MAX_FRAME - 2) + b"{}"
    with pytest.raises(ConnectionError):
        _through_a_socket(frame)


@pytest.mark.parametrize("header", [b"[]", b"1", b'"x"', b"null"])
def test_a_header_that_is_not_an_object_is_refused(header):
    with pytest.raises(FrameRefused, match="^the header is not a JSON object$"):
        _through_a_socket(_frame(header, b""))


def test_the_limits():
    assert _wire.MAX_FRAME == 64 * 1024 * 1024 and _wire.MAX_HEADER == 1024 * 1024
    assert _wire.MAX_ARRAYS == 4096


def test_an_archive_that_is_not_one_is_refused():
    with pytest.raises(FrameRefused, match="^not an npz archive: "):
        _wire.load_arrays(b"PK\x03\x04garbage")
    assert _wire.load_arrays(b"") == {}


def test_more_arrays_than_the_limit_are_refused(monkeypatch):
    monkeypatch.setattr(_wire, "MAX_ARRAYS", 3)
    members = {f"{i}.npy": _npy(np.zeros(1)) for i in range(3)}
    assert sorted(_wire.load_arrays(_npz(members))) == ["0", "1", "2"]
    members["3.npy"] = _npy(np.zeros(1))
    with pytest.raises(FrameRefused, match=r"^4 arrays in one frame \(at most 3\)$"):
        _wire.load_arrays(_npz(members))


def test_members_that_declare_more_than_the_frame_holds_are_refused():
    payload = bytearray(_npz({"a.npy": _npy(np.zeros(4))}))
    # The central directory's uncompressed size of the only member: 4 bytes at offset 24.
    directory = payload.rindex(b"PK\x01\x02")
    struct.pack_into("<I", payload, directory + 24, len(payload) + 1)
    with pytest.raises(FrameRefused, match="^the members declare more bytes than the frame "
                       "holds$"):
        _wire.load_arrays(bytes(payload))
    struct.pack_into("<I", payload, directory + 24, len(payload))  # as many: not more
    np.testing.assert_array_equal(_wire.load_arrays(bytes(payload))["a"], np.zeros(4))


def test_a_member_that_is_not_npy_is_refused():
    with pytest.raises(FrameRefused, match="^x.txt: not an .npy member$"):
        _wire.load_arrays(_npz({"a.npy": _npy(np.zeros(1)), "x.txt": b"hello"}))


def test_a_compressed_member_is_refused():
    with pytest.raises(FrameRefused, match="^a.npy: compressed members are refused$"):
        _wire.load_arrays(_npz({"a.npy": _npy(np.random.default_rng(0).random(64))},
                                   zipfile.ZIP_DEFLATED))


def test_npy_version_two_is_read_and_three_is_refused():
    array = np.arange(5.0)
    got = _wire.load_arrays(_npz({"a.npy": _npy(array, version=(2, 0))}))
    np.testing.assert_array_equal(got["a"], array)
    version_three = _npy(array, version=(3, 0))
    with pytest.raises(FrameRefused, match=r"^a.npy: npy version \(3, 0\) is refused$"):
        _wire.load_arrays(_npz({"a.npy": version_three}))


def _header_only(shape, descr="<f8"):
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def test_an_array_that_declares_more_than_it_carries_is_refused():
    with pytest.raises(FrameRefused, match=r"^y.npy: declares 800 bytes, carries fewer$"):
        _wire.load_arrays(_npz({"y.npy": _header_only((100,))}))
    # Header and data together are as long as the declared data: still short.
    member = _header_only((16,)) + b"\x00" * 64
    with pytest.raises(FrameRefused, match=r"^y.npy: truncated array$"):
        _wire.load_arrays(_npz({"y.npy": member}))
    # A member exactly as long as its declared data holds a header and too little data.
    member = _header_only((16,))
    assert len(member) == 16 * 8
    with pytest.raises(FrameRefused, match=r"^y.npy: truncated array$"):
        _wire.load_arrays(_npz({"y.npy": member}))
    # Bytes after the declared data are not read.
    member = _header_only((2,)) + np.array([1.5, 2.5]).tobytes() + b"trailing"
    np.testing.assert_array_equal(_wire.load_arrays(_npz({"y.npy": member}))["y"], [1.5, 2.5])
    # Exactly the declared bytes: read.
    member = _header_only((2,)) + np.array([1.5, 2.5]).tobytes()
    np.testing.assert_array_equal(_wire.load_arrays(_npz({"y.npy": member}))["y"], [1.5, 2.5])


def test_cases_flatten_to_named_arrays_and_back():
    cases = [("one", {"x": np.ones(2), "w": np.zeros(1)}), ("two", {"x": np.arange(3.0)}),
             ("empty", {})]
    labels, arrays = _wire.flatten_cases(cases)
    assert labels == ["one", "two", "empty"]
    assert sorted(arrays) == ["0/w", "0/x", "1/x"]
    back = _wire.unflatten_cases(labels, arrays)
    assert [label for label, _ in back] == labels
    assert sorted(back[0][1]) == ["w", "x"] and back[2][1] == {}
    np.testing.assert_array_equal(back[1][1]["x"], np.arange(3.0))
    assert _wire.unflatten_cases(["a"], {"0/x/y": np.ones(1)})[0][1].keys() == {"x/y"}


@pytest.mark.parametrize("array", [np.array([{"a": 1}], dtype=object),
                                   np.array([b"x", None], dtype=object)])
def test_the_wire_refuses_object_and_pickled_arrays(array):
    buffer = io.BytesIO()
    np.savez(buffer, a=array)  # savez pickles object arrays
    with pytest.raises(_wire.FrameRefused, match="object arrays are refused"):
        _wire.load_arrays(buffer.getvalue())
