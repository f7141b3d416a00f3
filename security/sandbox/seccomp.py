"""A small seccomp filter for the local sandbox, as the classic BPF that ``bwrap --seccomp FD`` loads.

Written by hand (no libseccomp, no compiler): a deny list of syscalls that code analysing data never
needs and that are the usual kernel attack surface or escape tools — ptrace and cross-process memory,
mounts and namespaces, keyrings, bpf, perf, userfaultfd, io_uring, modules, kexec, reboot, the clock.
Each returns EPERM (``clone3`` returns ENOSYS, so glibc falls back to ``clone``, whose namespace flags
are then checked); ``clone`` with any CLONE_NEW* flag is EPERM; a foreign architecture (x32 or i386
on x86_64) kills the process. Only x86_64 and aarch64 are described; elsewhere :func:`build` returns
None and the sandbox runs without seccomp (``available().details`` says so).
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000

_NR, _ARCH, _ARG0_LO = 0, 4, 16  # offsets in struct seccomp_data (little endian)

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

_DENIED = (
    "ptrace process_vm_readv process_vm_writev kcmp pidfd_getfd "
    "mount umount2 pivot_root chroot unshare setns fsopen fsconfig fsmount move_mount open_tree mount_setattr "
    "open_by_handle_at name_to_handle_at fanotify_init quotactl "
    "keyctl add_key request_key bpf perf_event_open userfaultfd "
    "io_uring_setup io_uring_enter io_uring_register "
    "init_module finit_module delete_module kexec_load kexec_file_load reboot swapon swapoff acct "
    "syslog settimeofday clock_settime clock_adjtime adjtimex sethostname setdomainname vhangup"
).split()

_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "kcmp": 312,
            "pidfd_getfd": 438,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "unshare": 272,
            "setns": 308,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "move_mount": 429,
            "open_tree": 428,
            "mount_setattr": 442,
            "open_by_handle_at": 304,
            "name_to_handle_at": 303,
            "fanotify_init": 300,
            "quotactl": 179,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "acct": 163,
            "syslog": 103,
            "settimeofday": 164,
            "clock_settime": 227,
            "clock_adjtime": 305,
            "adjtimex": 159,
            "sethostname": 170,
            "setdomainname": 171,
            "vhangup": 153,
            "clone": 56,
            "clone3": 435,
        },
    ),  # fmt: skip
    "aarch64": (
        0xC00000B7,
        {
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "kcmp": 272,
            "pidfd_getfd": 438,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "unshare": 97,
            "setns": 268,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "move_mount": 429,
            "open_tree": 428,
            "mount_setattr": 442,
            "open_by_handle_at": 265,
            "name_to_handle_at": 264,
            "fanotify_init": 262,
            "quotactl": 60,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "acct": 89,
            "syslog": 116,
            "settimeofday": 170,
            "clock_settime": 112,
            "clock_adjtime": 266,
            "adjtimex": 171,
            "sethostname": 161,
            "setdomainname": 162,
            "vhangup": 58,
            "clone": 220,
            "clone3": 435,
        },
    ),  # fmt: skip
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture (``platform.machine()``), or None if not described."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nrs = arch
    denied = [nrs[name] for name in _DENIED]
    # layout: [arch check] [nr load] [x32 check] [one jeq per denied nr] [clone3] [clone] [allow]
    #         [deny: EPERM] [enosys] [clone flag check ...]
    prog: list[bytes] = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, audit_arch, jt=1, jf=0),
        _insn(_RET_K, _KILL_PROCESS),
        _insn(_LD_W_ABS, _NR),
    ]
    n_checks = len(denied) + 3  # x32, denied..., clone3, clone
    # after the checks: [0] allow, [1] eperm, [2] enosys, [3] load arg0, [4] jset, [5] allow, [6] eperm
    eperm_at, enosys_at, clone_at = n_checks + 1, n_checks + 2, n_checks + 3

    def jump(i: int, target: int) -> int:  # offset from check i (0-based within the checks) to target
        return target - i - 1

    i = 0
    if audit_arch == 0xC000003E:
        prog.append(_insn(_JGE_K, 0x40000000, jt=jump(i, eperm_at), jf=0))  # x32 ABI numbers
    else:
        prog.append(_insn(_JEQ_K, 0xFFFFFFFF, jt=jump(i, eperm_at), jf=0))  # placeholder: keeps layout
    i += 1
    for nr in denied:
        prog.append(_insn(_JEQ_K, nr, jt=jump(i, eperm_at), jf=0))
        i += 1
    prog.append(_insn(_JEQ_K, nrs["clone3"], jt=jump(i, enosys_at), jf=0))
    i += 1
    prog.append(_insn(_JEQ_K, nrs["clone"], jt=jump(i, clone_at), jf=0))
    i += 1
    prog += [
        _insn(_RET_K, _ALLOW),
        _insn(_RET_K, _ERRNO | errno.EPERM),
        _insn(_RET_K, _ERRNO | errno.ENOSYS),
        _insn(_LD_W_ABS, _ARG0_LO),
        _insn(_JSET_K, _CLONE_NEW, jt=1, jf=0),
        _insn(_RET_K, _ALLOW),
        _insn(_RET_K, _ERRNO | errno.EPERM),
    ]
    if max(jump(k, eperm_at) for k in range(n_checks)) > 255:  # BPF jump offsets are one byte
        raise AssertionError("seccomp filter too long for one-byte jumps")
    return b"".join(prog)
