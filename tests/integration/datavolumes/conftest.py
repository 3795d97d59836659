"""Fixtures of the DataVolume tests (CRDs, images, image server, the product deployed from
deploy/ and its controller); the cluster and per-test namespace come from
``tests/integration/conftest.py``."""

from tests.integration.datavolumes.cdi_env import (  # noqa: F401
    cdi_crds,
    controller,
    copy_classes,
    image_server,
    images,
    other_namespace,
    product,
)
from tests.integration.datavolumes.populator_env import marker_disk, vm_boot  # noqa: F401
