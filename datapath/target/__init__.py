"""The target: where decoded bytes land. Split by concept: ``spec`` (what to fill, opening and
sizing), ``zeros`` (zero-page detection), ``directio`` (O_DIRECT writes in flight) and
``writer`` (the sparse ``RawWriter``); ``handle`` owns the open descriptor between phases.
"""

from datapath.target.handle import TargetHandle, preallocate_tree
from datapath.target.spec import TargetSpec, block_device_size, open_target, usable_space
from datapath.target.writer import RawWriter
from datapath.target.zeros import page_segments

__all__ = [
    "RawWriter",
    "TargetHandle",
    "TargetSpec",
    "block_device_size",
    "open_target",
    "page_segments",
    "preallocate_tree",
    "usable_space",
]
