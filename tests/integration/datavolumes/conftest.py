"""Fixtures of the DataVolume tests (CRDs, images, image server, the product deployed from
deploy/ and its controller); the cluster and per-test namespace come from
``tests/integration/conftest.py``."""

from pathlib import Path

import pytest

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run ``test_ca_rotation.py`` after every other integration test: it leaves the installed
    product (shared by the session) with 10-minute CAs that the product then replaces over the
    next minutes (the lifted ``certConfig.ca``'s staged rotation, ``cdi.pki.uploadca``), and
    tests that check a certificate's exact lifetime (``certConfig.server``'s) would see those
    CAs' ends instead."""
    integration = Path(__file__).parent.parent
    rotation = [i for i in items if i.path.name == "test_ca_rotation.py"]
    rest = [i for i in items if i.path.name != "test_ca_rotation.py"]
    others = [n for n, i in enumerate(rest) if integration in i.path.parents]
    if rotation and others:  # alone (or with no other integration test) it stays in place
        items[:] = rest[: others[-1] + 1] + rotation + rest[others[-1] + 1 :]
