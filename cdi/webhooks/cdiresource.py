"""Admission of the CDI resource: ``uninstallStrategy: BlockUninstallIfWorkloadsExist``.

CDI's ``cdi-validate`` webhook (``pkg/apiserver/webhooks/cdi-validate.go``): deleting the CDI
resource is refused, with CDI's message, while any DataVolume exists in the cluster and the
resource says ``BlockUninstallIfWorkloadsExist``; a resource never deployed (no phase) or in
``Error`` may always go, as may every other operation. Deleting the resource does not uninstall
anything here (``deploy/`` is the install), but HyperConverged and users drive an uninstall
through it, and the refusal is what they rely on to keep DataVolumes' data.

Pure: ``datavolumes_exist`` is the cluster lookup (``cdi.admission``: a list with ``limit=1``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cdi.api.cdiresource import PHASE_ERROR, UNINSTALL_BLOCK, UNINSTALL_REFUSED


def uninstall_refusal(
    request: Mapping[str, Any], datavolumes_exist: Callable[[], bool]
) -> str | None:
    """CDI's message when the review deletes a resource that blocks its uninstall while
    DataVolumes exist; None when the request may go ahead."""
    if request.get("operation") != "DELETE":
        return None
    old = request.get("oldObject") or {}
    phase = (old.get("status") or {}).get("phase")
    if not phase or phase == PHASE_ERROR:
        return None
    if (old.get("spec") or {}).get("uninstallStrategy") != UNINSTALL_BLOCK:
        return None
    return UNINSTALL_REFUSED if datavolumes_exist() else None
