"""The data path as a library: bytes in -> checksum and progress taps -> sniff -> decompress ->
decode (qcow2, vmdk, vdi; vhd/vhdx through qemu-img) -> sparse write into a file or block volume.

This is the public face the workers (importer, uploader, cloner) use: each builds a frozen
``ProcessPlan`` and a ``Source`` at its own edge and runs a ``Processor``. The package imports
only ``cdi.api`` from the control plane, and nothing from the workers, aiohttp's server or
``kubernetes`` (import-linter contracts in pyproject.toml).
"""

from datapath.plan import CheckpointPlan, ProcessPlan
from datapath.processor import Phase, Processor
from datapath.sources import Source, SourceConsumed, SourceInfo
from datapath.sources.file import BlockSource, FileSource
from datapath.sources.stream import StreamSource
from datapath.taps import Progress, parse_checksum
from datapath.target import TargetSpec

__all__ = [
    "BlockSource",
    "CheckpointPlan",
    "FileSource",
    "Phase",
    "ProcessPlan",
    "Processor",
    "Progress",
    "Source",
    "SourceConsumed",
    "SourceInfo",
    "StreamSource",
    "TargetSpec",
    "parse_checksum",
]
