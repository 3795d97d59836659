"""Which flavour fills a DataVolume, by the member of ``spec.source``: the one table.

Every ``SourceKind`` has an entry, so a source is never silently dropped: it is imported
(``flavours/import_.py``), uploaded (``flavours/upload.py``) or cloned from a PVC or a snapshot
(``flavours/clone/``; a ``sourceRef`` DataSource goes the way of its PVC entry), or it maps
to ``Unsupported`` with the reason, which the reconciler logs and otherwise leaves alone (no
status is written, as for a DataVolume another controller owns).

imageio and vddk stay unsupported: the importer has no such source, and an importer pod for
them would only fail. A DataVolume with no source whose claim names a ``dataSourceRef`` is
externally populated (``flavours/external.py``).
"""

from __future__ import annotations

from cdi.api.constants import SourceKind
from cdi.controller.flavours import EXTERNAL, Flavour, FlavourDeps, FlavourTable, Unsupported
from cdi.controller.flavours.clone import CloneFlavour
from cdi.controller.flavours.clone.sizing import SizeSettings
from cdi.controller.flavours.external import ExternalFlavour
from cdi.controller.flavours.import_ import ImportFlavour, ImportSettings
from cdi.controller.flavours.upload import UploadFlavour, UploadSettings

NOT_YET = "not supported yet"


def standard_flavours(
    deps: FlavourDeps,
    import_settings: ImportSettings,
    upload_settings: UploadSettings | None = None,
    requester_key: bytes | None = None,
) -> FlavourTable:
    importer: Flavour = ImportFlavour(deps, import_settings)
    sizing = SizeSettings(import_settings.image, import_settings.pull_policy)  # importer image
    cloner: Flavour = CloneFlavour(deps, requester_key, upload_settings, sizing=sizing)
    return {
        SourceKind.HTTP: importer,
        SourceKind.S3: importer,
        SourceKind.GCS: importer,
        SourceKind.REGISTRY: importer,
        SourceKind.BLANK: importer,
        SourceKind.UPLOAD: UploadFlavour(deps, upload_settings or UploadSettings()),
        SourceKind.PVC: cloner,  # and sourceRef DataSource (select_flavour)
        SourceKind.SNAPSHOT: cloner,  # restored from the VolumeSnapshot (clone/snapshot.py)
        SourceKind.IMAGEIO: Unsupported(SourceKind.IMAGEIO, f"imageio import is {NOT_YET}"),
        SourceKind.VDDK: Unsupported(SourceKind.VDDK, f"vddk import is {NOT_YET}"),
        EXTERNAL: ExternalFlavour(deps),  # no source: a claim dataSourceRef (external.py)
    }
