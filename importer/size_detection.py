"""CDI's size detection: the virtual size of the image in a filesystem claim (``disk.img``).

A host-assisted clone without a size, of a filesystem source holding a ``kubevirt`` image, is
sized from that image (CDI ``detectCloneSize``): the controller runs a pod of the importer image
with the source claim mounted read-only and ``IMPORTER_SIZE_DETECTION_PATH=/data/disk.img``
(CDI runs ``cdi-image-size-detection -image-path /data/disk.img``). This module is that pod's
work: open the file without following a link (the tenant wrote the volume), sniff its format
from its header (never let qemu-img probe), ask ``qemu-img info`` for it (its own process,
address-space and CPU limits, a timeout: ``datapath.qemu``), and end with the usual typed
termination message, ``virtual_size`` holding the answer (CDI writes the bare number). A
missing or unreadable file, or one qemu-img cannot read, is a typed permanent error.
"""

from __future__ import annotations

import asyncio
import os
import stat

from cdi.api.errors import InvalidImage, SourceNotFound
from cdi.api.termination import REASON_COMPLETED, TerminationMessage
from datapath import qemu
from datapath.formats import SNIFF_BYTES, ImageFormat, sniff

MESSAGE = "Size detection complete"
# What qemu-img is told the file is: an image format by its header, anything else raw (a raw
# disk's first bytes may look like anything: a tar header, text, zeros).
_IMAGES = frozenset(
    {ImageFormat.QCOW2, ImageFormat.VMDK, ImageFormat.VDI, ImageFormat.VHD, ImageFormat.VHDX}
)


def _head(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        raise SourceNotFound(f"{path} does not exist in the source volume") from exc
    except OSError as exc:
        raise InvalidImage(f"{path} cannot be opened: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidImage(f"{path} is not a regular file")
        return os.pread(fd, SNIFF_BYTES, 0)
    finally:
        os.close(fd)


async def detect_size(path: str) -> TerminationMessage:
    """Measure the image at ``path``; raises a ``WorkerError`` when it cannot."""
    sniffed = sniff(await asyncio.to_thread(_head, path))
    fmt = sniffed if sniffed in _IMAGES else ImageFormat.RAW
    info = await qemu.info(path, fmt)
    return TerminationMessage(
        reason=REASON_COMPLETED,
        message=MESSAGE,
        virtual_size=info.virtual_size,
        format_chain=(fmt.value,),
    )
