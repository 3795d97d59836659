"""The filesystem clone's route made of C tools, for ``benchmarks.clone``'s ``fs.ref-tar-socat``.

CDI's host-assisted filesystem clone is ``tar -S`` on the source, the stream over mutual TLS,
``tar -x`` on the target. Built from C tools on this machine: GNU ``tar -cSf -`` (holes found
with ``SEEK_HOLE``) piped into ``socat`` (OpenSSL, client certificate, 256 KiB transfers), a
listening ``socat`` (verifying that certificate) piped into GNU ``tar -xSf -`` in the output
folder, then ``sync`` of the file. Its time and CPU show what the route costs without any
Python, next to ``cp --sparse=always`` (no TLS, one process) and ours: the gap between cp and
this row is the price of the TLS hop and of two processes on 2 cores, not of our code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from testkit.cluster import free_port


def tar_socat(src: Path, out: Path, certs: dict[str, str]) -> tuple[float, float, float]:
    """Copy ``src``'s ``disk.img`` into ``out`` the C-tools way: seconds (from the receiver
    listening to a durable file), the sender pipeline's and the receiver pipeline's CPU."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    port = free_port()
    # verify=1 on the listener: a client certificate from the CA is required (mutual TLS)
    listen = (f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,verify=1,cafile={certs['ca']},"
              f"cert={certs['srv.crt']},key={certs['srv.key']}")  # fmt: skip
    receive = f"socat -b 262144 {listen} STDOUT 2>/dev/null | tar -xSf - -C {out}"
    # no pipefail here: socat exits 1 when the sender's socat closes without a TLS
    # close_notify; tar's status (and the caller's byte-for-byte check) decide
    receiver = subprocess.Popen(["bash", "-c", receive])
    _wait_port(port, receiver)
    connect = (f"OPENSSL:127.0.0.1:{port},verify=1,cafile={certs['ca']},commonname=localhost,"
               f"cert={certs['cl.crt']},key={certs['cl.key']}")  # fmt: skip
    send = f"tar -cSf - -C {src} disk.img | socat -b 262144 STDIN {connect}"
    t0 = time.monotonic()
    sender = subprocess.Popen(["bash", "-o", "pipefail", "-c", send])
    _, sstatus, susage = os.wait4(sender.pid, 0)
    _, rstatus, rusage = os.wait4(receiver.pid, 0)
    subprocess.run(["sync", str(out / "disk.img")], check=True)
    seconds = time.monotonic() - t0
    if os.waitstatus_to_exitcode(sstatus) or os.waitstatus_to_exitcode(rstatus):
        raise RuntimeError(f"the tar | socat clone failed: {sstatus} {rstatus}")
    return (
        seconds,
        susage.ru_utime + susage.ru_stime,
        rusage.ru_utime + rusage.ru_stime,
    )


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait for the listener without connecting to it (socat without ``fork`` serves one
    connection: a probe would be it)."""
    needle = f":{port:04X} "
    for _ in range(500):
        if proc.poll() is not None:
            raise RuntimeError("the receiving socat exited before it listened")
        with open("/proc/net/tcp") as fh:
            if any(needle in line and line.split()[3] == "0A" for line in fh):
                return
        time.sleep(0.01)
    raise RuntimeError(f"nothing listens on {port}")
