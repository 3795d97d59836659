"""Streaming qcow2 -> raw conversion without scratch space (issue 4).

``Qcow2StreamDecoder`` is sans-I/O: the pipeline feeds it the qcow2 file front to back and
writes the ``(virtual_offset, bytes)`` pairs it returns into a target that reads as zeros
where nothing is written. ``SpillLimitExceeded`` tells the pipeline to fall back to scratch
space + ``qemu-img convert``.
"""

from .decoder import Qcow2StreamDecoder, SpillLimitExceeded
from .header import Qcow2Header, parse_header

__all__ = ["Qcow2Header", "Qcow2StreamDecoder", "SpillLimitExceeded", "parse_header"]
