"""The checks the donor and the worker share: where an INVOKE's array frames land, and
which exception an ERROR frame's code becomes."""

from __future__ import annotations

import pytest

from remote_gpu import errors
from remote_gpu.errors import Code, Fatal
from remote_gpu.protocol import DType, Flags, Header, Op, place_array

HEAD = Header(Op.INVOKE, 7, 3, parts=2, offset=4096)
BASE, SIZE = 4096, 1024


def _array(part: int = 1, flags: Flags = Flags.NONE, offset: int = 0, length: int = 16) -> Header:
    return Header(
        Op.INVOKE,
        7,
        3,
        flags=flags,
        dtype=DType.UINT8,
        part=part,
        parts=2,
        shape=(length,),
        offset=offset,
        length=length,
    )


def test_inline_arrays_land_at_the_cursor_of_a_stream_lease() -> None:
    assert place_array(_array(), HEAD, 1, 7, False, BASE, BASE + 64, SIZE) == BASE + 64


def test_shm_arrays_keep_their_offset_inside_the_slot() -> None:
    h = _array(flags=Flags.SHM, offset=BASE + 512)
    assert place_array(h, HEAD, 1, 7, True, BASE, BASE, SIZE) == BASE + 512


@pytest.mark.parametrize(
    ("h", "part", "lease", "shm", "code", "message"),
    [
        (_array(part=2), 1, 7, False, Code.BAD_FRAME, "out of sequence"),
        (_array(), 1, 8, False, Code.BAD_FRAME, "out of sequence"),
        (_array(flags=Flags.SHM, offset=BASE), 1, 7, False, Code.BAD_FRAME, "stream transport"),
        (_array(), 1, 7, True, Code.BAD_FRAME, "inline payload on a shared-memory lease"),
        (_array(flags=Flags.SHM, offset=BASE - 1), 1, 7, True, Code.MEMORY_QUOTA, "outside"),
        (_array(flags=Flags.SHM, offset=BASE + SIZE - 8), 1, 7, True, Code.MEMORY_QUOTA, "outside"),
        (_array(length=SIZE + 1), 1, 7, False, Code.MEMORY_QUOTA, "1024-byte slot"),
    ],
)
def test_defective_array_frames_are_fatal(
    h: Header, part: int, lease: int, shm: bool, code: Code, message: str
) -> None:
    with pytest.raises(Fatal, match=message) as caught:
        place_array(h, HEAD, part, lease, shm, BASE, BASE, SIZE)
    assert (caught.value.code, caught.value.seq) == (code, 3)


def test_every_error_code_but_internal_has_its_own_exception() -> None:
    for code in Code:
        exc = errors.from_code(code.value, "boom")
        assert (exc.code, exc.message) == (code, "boom")
        assert (type(exc) is errors.RemoteGPUError) == (code is Code.INTERNAL)
    assert isinstance(errors.from_code("bad_sequence", ""), errors.FrameError)
    assert isinstance(errors.from_code("deadline_exceeded", ""), TimeoutError)
    unknown = errors.from_code("martian", "boom")
    assert type(unknown) is errors.RemoteGPUError
    assert unknown.message == "martian: boom"
