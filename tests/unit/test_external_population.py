"""Which DataVolumes are externally populated, and the claim they get (``flavours.external``)."""

from __future__ import annotations

from typing import Any

from cdi.api.types import DataVolume
from cdi.controller.flavours import EXTERNAL, Unsupported, select_flavour
from cdi.controller.flavours.external import is_external, with_reference

REF = {"apiGroup": "populators.example.io", "kind": "Payload", "name": "golden"}


def dv(spec: dict[str, Any]) -> DataVolume:
    meta = {"name": "d", "namespace": "n"}
    return DataVolume.from_dict({"kind": "DataVolume", "metadata": meta, "spec": spec})


def test_no_source_and_a_reference_is_external_and_gets_the_external_flavour() -> None:
    external = dv({"storage": {"dataSourceRef": REF}})
    marker = object()
    assert is_external(external)
    assert select_flavour(external, {EXTERNAL: marker}) is marker  # type: ignore[dict-item]
    legacy = dv({"pvc": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"}}})
    assert is_external(legacy)


def test_a_source_or_no_reference_is_not_external() -> None:
    assert not is_external(dv({"source": {"blank": {}}, "storage": {"dataSourceRef": REF}}))
    plain = dv({"storage": {}})
    assert not is_external(plain)
    assert isinstance(select_flavour(plain, {}), Unsupported)


def test_the_claim_carries_the_reference_in_both_fields() -> None:
    claim = with_reference(
        {"spec": {"storageClassName": "c"}}, dv({"storage": {"dataSourceRef": REF}})
    )
    assert claim["spec"]["dataSourceRef"] == REF == claim["spec"]["dataSource"]
    core = with_reference({"spec": {}}, dv({"pvc": {"dataSource": {"kind": "PersistentVolumeClaim",
                                                                    "name": "x"}}}))  # fmt: skip
    assert core["spec"]["dataSourceRef"] == {"kind": "PersistentVolumeClaim", "name": "x"}
