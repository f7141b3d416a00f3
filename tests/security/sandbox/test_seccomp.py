"""The hand-written seccomp filter's syscall numbers agree with this machine's kernel headers."""

from __future__ import annotations

import platform
import re
import struct
from pathlib import Path

import pytest

from security.sandbox import seccomp

HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}


@pytest.mark.parametrize("arch", sorted(HEADERS))
def test_syscall_numbers_match_the_kernel_headers(arch: str) -> None:
    header = HEADERS[arch]
    if not header.exists():
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())}
    table = seccomp._ARCHES[arch][1]
    assert {k: v for k, v in table.items() if numbers.get(k) != v} == {}


def test_filter_is_built_for_this_machine_and_ends_allowing() -> None:
    program = seccomp.build()
    if platform.machine() not in HEADERS:
        assert program is None
        return
    assert program is not None and len(program) % 8 == 0
    code, _, _, k = struct.unpack("=HBBI", program[-16:-8])  # the allow after the clone flag check
    assert (code, k) == (0x06, 0x7FFF0000)
