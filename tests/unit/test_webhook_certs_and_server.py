"""Webhook certificates (generation, rotation plan, CA overlap) and AdmissionReview handling,
without a cluster: the server's app runs on aiohttp's test server with a static lookup."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from cdi.api.cdiresource import Lifetime
from cdi.pki.certs import Bundle, Rotation, plan_rotation, rotate, service_names
from cdi.pki.store import CALife
from cdi.webhooks.server import make_app
from cdi.webhooks.validation import StaticLookup

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NAMES = service_names("cdi-webhook", "cdi", ("127.0.0.1",))


def fresh() -> Bundle:
    bundle = rotate(None, NAMES, NOW)
    assert bundle is not None
    return bundle


def test_first_bundle_is_a_ca_and_a_serving_cert_it_signed_for_the_service_names() -> None:
    bundle = fresh()
    ca, serving = bundle.ca.cert, bundle.serving.cert
    assert serving.issuer == ca.subject
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    assert serving.signature_hash_algorithm is not None
    key.verify(
        serving.signature, serving.tbs_certificate_bytes, ec.ECDSA(serving.signature_hash_algorithm)
    )  # raises if the CA did not sign
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "cdi-webhook.cdi.svc" in san.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert bundle.ca_bundle == bundle.ca.cert_pem


def test_rotation_plan_keeps_renews_serving_or_stages_a_new_ca() -> None:
    bundle = fresh()
    assert plan_rotation(bundle, NAMES, NOW + dt.timedelta(days=1)) == Rotation.KEEP
    assert rotate(bundle, NAMES, NOW + dt.timedelta(days=1)) is None
    assert plan_rotation(bundle, NAMES, NOW + dt.timedelta(days=25)) == Rotation.SERVING
    assert plan_rotation(bundle, (*NAMES, "new.example"), NOW) == Rotation.SERVING
    # the CA is due (73 days before its end): a new one is staged, never issued at once
    renewed = rotate(bundle, NAMES, NOW + dt.timedelta(days=295))  # the serving one first
    assert renewed is not None and renewed.ca == bundle.ca
    assert plan_rotation(renewed, NAMES, NOW + dt.timedelta(days=300)) == Rotation.STAGE
    assert plan_rotation(bundle, NAMES, NOW + dt.timedelta(days=366)) == Rotation.CA  # expired


def test_serving_renewal_keeps_the_ca() -> None:
    bundle = fresh()
    renewed = rotate(bundle, NAMES, NOW + dt.timedelta(days=25))
    assert renewed is not None
    assert renewed.ca == bundle.ca and renewed.serving != bundle.serving


def test_a_new_ca_is_in_the_bundle_before_it_signs_and_the_old_one_leaves_after() -> None:
    """certConfig.ca: 4 minutes, renewed 2 minutes before its end; the stage is 1 minute."""
    life = Lifetime(dt.timedelta(minutes=4), dt.timedelta(minutes=2))
    old = fresh()  # a year-long CA: longer than asked, so a rotation starts at once
    t = NOW + dt.timedelta(days=1)
    staged = rotate(old, NAMES, t, ca_life=life)
    assert staged is not None and staged.ca != old.ca
    assert staged.serving == old.serving  # the new CA signs nothing yet
    assert staged.ca_bundle == staged.ca.cert_pem + old.ca.cert_pem  # both trusted
    assert staged.ca.cert.not_valid_after_utc - t == dt.timedelta(minutes=4)
    assert rotate(staged, NAMES, t + dt.timedelta(seconds=50), ca_life=life) is None
    switched = rotate(staged, NAMES, t + dt.timedelta(seconds=61), ca_life=life)
    assert switched is not None and switched.ca == staged.ca
    switched.serving.cert.verify_directly_issued_by(staged.ca.cert)  # the new CA signs it
    aki = switched.serving.cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    ski = staged.ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert aki.value.key_identifier == ski.value.digest  # a verifier tells the two CAs apart
    assert switched.ca_bundle == staged.ca_bundle  # the old CA still trusted
    u = t + dt.timedelta(seconds=61)
    assert rotate(switched, NAMES, u + dt.timedelta(seconds=50), ca_life=life) is None
    dropped = rotate(switched, NAMES, u + dt.timedelta(seconds=61), ca_life=life)
    assert dropped is not None and dropped.ca_bundle == staged.ca.cert_pem
    assert dropped.serving == switched.serving
    # and the new CA, due 2 minutes before its end, starts the next rotation the same way
    again = rotate(dropped, NAMES, t + dt.timedelta(minutes=2, seconds=1), ca_life=life)
    assert again is not None and again.serving == dropped.serving
    assert again.ca_bundle == again.ca.cert_pem + staged.ca.cert_pem


def test_a_ca_due_on_its_own_is_staged_and_gone_from_the_bundle_by_its_end() -> None:
    life = Lifetime(dt.timedelta(minutes=10), dt.timedelta(minutes=4))
    old = rotate(None, NAMES, NOW, ca_life=life)
    assert old is not None
    assert rotate(old, NAMES, NOW + dt.timedelta(minutes=5), ca_life=life) is None
    staged = rotate(old, NAMES, NOW + dt.timedelta(minutes=6, seconds=1), ca_life=life)
    assert staged is not None and staged.previous_ca_pem == old.ca.cert_pem
    assert staged.serving == old.serving
    bundle, t = staged, NOW + dt.timedelta(minutes=6, seconds=1)
    while t < NOW + dt.timedelta(minutes=10, seconds=1):  # checked every 15 s
        t += dt.timedelta(seconds=15)
        bundle = rotate(bundle, NAMES, t, ca_life=life) or bundle
    assert bundle.ca == staged.ca and bundle.ca_bundle == staged.ca.cert_pem
    bundle.serving.cert.verify_directly_issued_by(staged.ca.cert)


def review(op: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "operation": op,
            "namespace": "ns",
            "object": obj,
            "oldObject": old,
            "userInfo": {"username": "alice", "groups": ["g"]},
        },
    }


def dv(**spec: Any) -> dict[str, Any]:
    base = {
        "source": {"http": {"url": "http://example.com/d.img"}},
        "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {**base, **spec},
    }


async def run_blocking(fn: Any, *args: Any) -> Any:
    return fn(*args)


async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with TestClient(TestServer(make_app(StaticLookup(), run_blocking))) as client:
        resp = await client.post(path, json=body)
        assert resp.status == 200
        return dict(await resp.json())


async def test_validate_rejects_with_cdi_message_and_status_causes() -> None:
    out = await post(
        "/datavolume-validate", review("CREATE", dv(source={"http": {"url": "x"}, "blank": {}}))
    )
    resp = out["response"]
    assert resp["uid"] == "u-1" and resp["allowed"] is False
    assert resp["status"]["code"] == 422
    assert resp["status"]["message"] == "Multiple Data volume sources"
    assert resp["status"]["details"]["causes"][0]["message"] == "Multiple Data volume sources"


async def test_validate_admits_a_valid_datavolume_and_deletes() -> None:
    assert (await post("/datavolume-validate", review("CREATE", dv())))["response"]["allowed"]
    assert (await post("/datavolume-validate", review("DELETE", {})))["response"]["allowed"]


async def test_mutate_returns_a_json_patch_recording_the_requester() -> None:
    resp = (await post("/datavolume-mutate", review("CREATE", dv())))["response"]
    assert resp["allowed"] and resp["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(resp["patch"]))
    values = {op["path"]: op.get("value") for op in patch}
    assert values["/metadata/annotations/cdi.kubevirt.io~1storage.requester.username"] == "alice"
    assert values["/spec/contentType"] == "kubevirt"


async def test_not_an_admission_review_is_a_bad_request() -> None:
    async with TestClient(TestServer(make_app(StaticLookup(), run_blocking))) as client:
        assert (await client.post("/datavolume-validate", data=b"nope")).status == 400
        assert (await client.post("/datavolume-validate", json={"x": 1})).status == 400
        assert (await client.get("/healthz")).status == 200


def test_a_short_lived_ca_left_by_a_lifted_cert_config_never_lets_its_certificate_expire() -> None:
    """``certConfig.ca: {duration: 10m}`` then lifted: the 10-minute CA is due at once under the
    default lifetime, so a year-long CA is staged beside it with a stage of weeks, while the
    serving certificate the short CA signed ends with it. The checks ``check_every`` schedules
    (the hourly interval otherwise) must re-issue it before it ends: at no moment between two
    checks is an expired certificate served (the CI run of stop 34: an hour of 'certificate
    has expired' from the upload proxy)."""
    short = Lifetime(dt.timedelta(minutes=10), dt.timedelta(minutes=2))
    bundle = rotate(None, NAMES, NOW, ca_life=short)
    assert bundle is not None
    life, t = CALife(), NOW + dt.timedelta(minutes=1)  # lifted: the default lifetime
    end = t + dt.timedelta(days=2)
    while t < end:
        bundle = rotate(bundle, NAMES, t, ca_life=life()) or bundle
        assert t < bundle.serving.cert.not_valid_after_utc, t
        nxt = t + dt.timedelta(seconds=life.check_every(bundle, 3600.0, now=t))
        assert nxt < bundle.serving.cert.not_valid_after_utc, (t, nxt)  # served until then
        t = nxt
    assert bundle.serving.cert.not_valid_after_utc - t > dt.timedelta(days=20)
