"""What one run of the data path is asked to do: a frozen plan each worker builds at its edge.

The processor never sees a worker's configuration (environment variables, HTTP options, CLI
flags): the importer, the upload server and the cloner each turn theirs into a ``ProcessPlan``
and hand it over with a ``Source``. Everything the phase machine decides is a function of the
plan and of what the source says about itself (``SourceInfo``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cdi.api.checksum import Checksum
from cdi.api.constants import ContentType
from datapath.checkpoint import INTERVAL
from datapath.target.spec import TargetSpec

SPILL_MEMORY_LIMIT = 64 * 1024 * 1024  # bytes held in memory for data ahead of its table


@dataclass(frozen=True)
class CheckpointPlan:
    """Where progress is persisted so a killed worker can resume (raw images only).

    ``source_id`` is an opaque string the worker chooses to identify its source (the importer
    uses the URL or file path); a checkpoint left by a different source is ignored.

    The checkpoint file lives beside the target, so whoever can write the volume can plant one
    (``datapath.checkpoint``). ``attested`` is the (offset, BLAKE3 of the prefix) a resume may
    start from, known from outside the volume; with ``require_attested`` a checkpoint the file
    alone vouches for is not resumed (a worker in a tenant's volume); without it (``cdi
    import`` on the user's own disk) the file's digest, recomputed over the prefix, suffices.
    """

    path: str
    source_id: str
    interval: int = INTERVAL
    attested: tuple[int, str] | None = None
    require_attested: bool = False


@dataclass(frozen=True)
class ProcessPlan:
    target: TargetSpec
    content_type: ContentType = ContentType.KUBEVIRT
    checksum: Checksum | None = None  # of the source bytes as they arrive
    blank: bool = False  # no source: an empty disk of the target's size
    scratch_dir: str | None = None  # None: a folder beside a file target
    spill_limit: int = SPILL_MEMORY_LIMIT  # in-memory bound for out-of-order image data
    checkpoint: CheckpointPlan | None = None
    tar_member: str | None = None  # registry layers: decode the one file under this prefix
    labels: Mapping[str, str] = field(default_factory=dict)  # echoed in the result
    verify: bool = False  # read the target back once durable and compare (datapath.verify)
