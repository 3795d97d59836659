"""The upload CAs' staged rotation (``cdi.pki.uploadca``), walked on a simulated clock with real
certificates: at every step every live upload pod's serving certificate is trusted by the
bundle the proxy holds, and the proxy's client certificate by every live pod."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest

from cdi.api.cdiresource import Lifetime
from cdi.pki.certs import KeyPair, issue_client, new_ca, stage_of
from cdi.pki.upload import _due
from cdi.pki.uploadca import (
    CAState,
    Step,
    fingerprints,
    from_secret_data,
    issue_upload_server,
    last_call,
    next_check,
    plan_client_ca,
    plan_server_ca,
    rotate_client_ca,
    rotate_server_ca,
    server_deadline,
    to_secret_data,
    trusts,
    verifies,
)

T0 = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
CA = Lifetime(10 * MIN, 2 * MIN)  # the integration test's certConfig.ca
SERVER = Lifetime(24 * 60 * MIN, 24 * 60 * MIN * 0.2)  # certConfig.server's default
CLIENT = Lifetime(5 * MIN, 1 * MIN)
NAMES = ("cdi-upload-x", "cdi-upload-x.ns.svc")


@dataclass
class Pod:
    name: str
    created: dt.datetime
    serving: KeyPair
    trust: bytes  # its ca.crt: the client CAs it verifies the proxy with
    deadline: dt.datetime


@dataclass
class World:
    server: CAState
    client: CAState
    published_bundle: bytes  # cdi-uploadserver-signer-bundle
    published_client: KeyPair  # cdi-uploadserver-client-cert
    proxy_bundle: bytes  # what the proxy loaded
    proxy_client: KeyPair
    pods: list[Pod]
    steps: list[tuple[dt.datetime, str, Step]]


SHORT_SERVER = Lifetime(3 * MIN, dt.timedelta(seconds=30))


def _pod(
    world: World, name: str, now: dt.datetime, server: Lifetime = SERVER, ca: Lifetime = CA
) -> Pod:
    serving = issue_upload_server(world.server, NAMES, now, server)
    trust = world.client.trust
    return Pod(name, now, serving, trust, server_deadline(serving, world.client, server, ca))


def _start(now: dt.datetime, ca: Lifetime = CA) -> World:
    server = rotate_server_ca(None, now, ca, SERVER)
    client = rotate_client_ca(None, now, ca, [], CLIENT)
    assert server is not None and client is not None
    proxy_client = issue_client(client.signer, "client.upload-server.cdi.kubevirt.io", now, 5 * MIN)
    return World(server, client, server.trust, proxy_client, server.trust, proxy_client, [], [])


def _controller(
    world: World,
    now: dt.datetime,
    client_life: Lifetime = CLIENT,
    ca: Lifetime = CA,
    server: Lifetime = SERVER,
) -> None:
    """One check of the controller: both CAs, the published bundle, the proxy's certificate."""
    live = [fingerprints(p.trust) for p in world.pods]
    step = plan_server_ca(world.server, now, ca)
    new = rotate_server_ca(world.server, now, ca, server)
    if new is not None:
        world.steps.append((now, "server", step))
        world.server = new
    world.published_bundle = world.server.trust
    step = plan_client_ca(world.client, now, ca, live)
    new = rotate_client_ca(world.client, now, ca, live, client_life)
    if new is not None:
        world.steps.append((now, "client", step))
        world.client = new
    if _due(world.published_client.cert_pem, world.client.signer, now, client_life):
        world.published_client = issue_client(
            world.client.signer, "client.upload-server.cdi.kubevirt.io", now, client_life.duration
        )


def _invariant(world: World, now: dt.datetime) -> None:
    for pod in world.pods:
        assert verifies(world.proxy_bundle, pod.serving.cert_pem, now), (now, pod.name)
        assert verifies(pod.trust, world.proxy_client.cert_pem, now), (now, pod.name)


def _walk(
    minutes: int, server: Lifetime = SERVER
) -> tuple[World, list[tuple[dt.datetime, str, Step]], set[bytes], set[bytes]]:
    """Walk ``minutes`` in 10 s steps: the controller checks every step, the proxy reloads its
    bundle every 50 s and its client certificate every 20 s, an upload pod is created every
    20 s and one, made at the start, lives until its own deadline."""
    step = dt.timedelta(seconds=10)
    now = T0
    world = _start(now)
    world.pods.append(_pod(world, "before-rotation", now, server))
    servers, clients = {world.server.signer.cert_pem}, {world.client.signer.cert_pem}
    n = 0
    while now < T0 + minutes * MIN:
        _controller(world, now)
        servers.add(world.server.signer.cert_pem)
        clients.add(world.client.signer.cert_pem)
        # pods past their deadline stop taking uploads and are re-created
        world.pods = [p for p in world.pods if now < p.deadline]
        if n % 2 == 0:
            world.pods.append(_pod(world, f"pod-{n}", now, server))
        # the proxy re-reads the bundle under a stage (60 s) and its client certificate under
        # ``last_call`` (30 s) apart: the latest each may be, out of phase with each other
        if n % 5 == 4:
            world.proxy_bundle = world.published_bundle
        if n % 2 == 1:
            world.proxy_client = world.published_client
        _invariant(world, now)
        now += step
        n += 1
    return world, world.steps, servers, clients


@pytest.mark.parametrize("server", [SERVER, SHORT_SERVER], ids=["server-24h", "server-3m"])
def test_a_whole_rotation_of_both_cas_never_breaks_trust_either_way(server: Lifetime) -> None:
    # server-3m: pods made just before the client CA is staged (trusting only the old one)
    # outlive the stage, so the client switch must wait for them
    _, steps, servers, clients = _walk(35, server=server)
    kinds = [(who, s) for _, who, s in steps]
    # both CAs went round at least three times, each step in order
    for who in ("server", "client"):
        mine = [s for w, s in kinds if w == who]
        # created at the start (``_start``), then staged, switched and dropped in turn:
        # never created again (a CA replaced at once would break the overlap)
        assert mine[:6] == [Step.STAGE, Step.SWITCH, Step.DROP] * 2, (who, mine)
        assert Step.CREATE not in mine
        assert mine.count(Step.SWITCH) >= 3
    assert len(servers) >= 4 and len(clients) >= 4


def test_the_new_server_ca_is_published_a_stage_before_it_signs() -> None:
    _, steps, _, _ = _walk(12)
    staged = next(t for t, who, s in steps if who == "server" and s == Step.STAGE)
    switched = next(t for t, who, s in steps if who == "server" and s == Step.SWITCH)
    assert switched - staged >= stage_of(CA)


def test_the_client_switch_waits_for_a_live_pod_that_trusts_only_the_old_ca() -> None:
    now = T0
    world = _start(now)
    old = _pod(world, "old", now, Lifetime(60 * MIN, 1 * MIN))
    later = now + 8 * MIN + dt.timedelta(seconds=10)  # due at 8 min: staged
    staged = rotate_client_ca(world.client, later, CA, [fingerprints(old.trust)], CLIENT)
    assert staged is not None and staged.staged is not None
    after_stage = later + stage_of(CA) + dt.timedelta(seconds=1)
    assert plan_client_ca(staged, after_stage, CA, [fingerprints(old.trust)]) == Step.KEEP
    fresh = CAState(staged.signer).trust + staged.staged.cert_pem
    assert plan_client_ca(staged, after_stage, CA, [fingerprints(fresh)]) == Step.SWITCH
    # had it switched, the pod would refuse the proxy's re-issued certificate
    switched = rotate_client_ca(staged, after_stage, CA, [], CLIENT)
    assert switched is not None
    cert = issue_client(switched.signer, "client", after_stage, CLIENT.duration)
    assert not verifies(old.trust, cert.cert_pem, after_stage)
    # and the pod itself stops taking uploads by the forced switch, a stage before the old end
    forced = staged.signer.cert.not_valid_after_utc - last_call(CA)
    assert old.deadline <= forced
    assert (
        plan_client_ca(staged, forced - dt.timedelta(seconds=1), CA, [fingerprints(old.trust)])
        == Step.KEEP
    )
    assert plan_client_ca(staged, forced, CA, [fingerprints(old.trust)]) == Step.SWITCH


def test_the_old_server_ca_stays_until_nothing_it_signed_is_valid() -> None:
    now = T0
    world = _start(now)
    short = Lifetime(3 * MIN, 1 * MIN)
    stage_at = now + 8 * MIN
    staged = rotate_server_ca(world.server, stage_at, CA, short)
    assert staged is not None and staged.staged is not None
    switch_at = stage_at + stage_of(CA)
    pod = issue_upload_server(staged, NAMES, switch_at - dt.timedelta(seconds=1), short)
    switched = rotate_server_ca(staged, switch_at, CA, short)
    assert switched is not None and switched.previous_until is not None
    assert trusts(switched.trust, staged.signer) and trusts(switched.trust, staged.staged)
    assert switched.previous_until >= pod.cert.not_valid_after_utc
    assert plan_server_ca(switched, switched.previous_until - dt.timedelta(seconds=1), CA) == (
        Step.KEEP
    )
    assert plan_server_ca(switched, switched.previous_until, CA) == Step.DROP
    dropped = rotate_server_ca(switched, switched.previous_until, CA, short)
    assert dropped is not None and not trusts(dropped.trust, staged.signer)


def test_a_missing_unreadable_or_expired_ca_is_created_at_once() -> None:
    assert plan_server_ca(None, T0, CA) == Step.CREATE
    broken = CAState(KeyPair(b"junk", b"junk"))
    assert plan_client_ca(broken, T0, CA, []) == Step.CREATE
    old = CAState(new_ca("x", T0 - 20 * MIN, 10 * MIN))
    assert plan_server_ca(old, T0, CA) == Step.CREATE


def test_default_lifetimes_keep_a_year_long_ca() -> None:
    default = Lifetime(dt.timedelta(days=365), dt.timedelta(days=73))
    state = rotate_server_ca(None, T0, default, SERVER)
    assert state is not None
    assert plan_server_ca(state, T0 + dt.timedelta(days=200), default) == Step.KEEP
    assert plan_server_ca(state, T0 + dt.timedelta(days=300), default) == Step.STAGE


def test_a_ca_state_round_trips_through_its_secret_and_an_old_secret_reads_as_a_signer() -> None:
    world = _start(T0)
    staged = rotate_server_ca(world.server, T0 + 8 * MIN, CA, SERVER)
    assert staged is not None
    switched = rotate_server_ca(staged, T0 + 9 * MIN, CA, SERVER)
    assert switched is not None and switched.previous_pem
    for state in (world.server, staged, switched):
        assert from_secret_data(to_secret_data(state)) == state
    # a Secret from before rotation: tls.crt/tls.key only
    signer = world.client.signer
    assert from_secret_data({"tls.crt": signer.cert_pem, "tls.key": signer.key_pem}) == (
        CAState(signer)
    )
    assert from_secret_data({}) is None
    # a torn staged part is dropped (staged again), never half-read
    data = to_secret_data(staged)
    data["staged-at"] = b"yesterday"
    read = from_secret_data(data)
    assert read is not None and read.staged is None
    assert plan_server_ca(read, T0 + 8 * MIN + dt.timedelta(seconds=10), CA) == Step.STAGE
    # a previous CA whose drop time is lost stays trusted until its own end
    data = to_secret_data(switched)
    del data["previous-until"]
    read = from_secret_data(data)
    assert read is not None and read.previous_pem == switched.previous_pem
    assert read.previous_until == staged.signer.cert.not_valid_after_utc


DEFAULT = Lifetime(dt.timedelta(days=365), dt.timedelta(days=73))  # certConfig.ca lifted


def test_a_short_ca_left_by_a_lifted_cert_config_is_switched_halfway_not_at_the_next_check() -> (
    None
):
    """Under the default lifetime the last call is weeks: a 10-minute CA staged for its
    year-long successor would switch at the next check, before any proxy re-read the bundle.
    It switches halfway between its staging and its end instead, and a pod that trusts it
    alone stops taking uploads before that."""
    state = rotate_server_ca(None, T0, CA, SERVER)  # made under certConfig.ca 10m
    assert state is not None
    staged_at = T0 + 3 * MIN
    assert plan_server_ca(state, staged_at, DEFAULT) == Step.STAGE
    staged = rotate_server_ca(state, staged_at, DEFAULT, SERVER)
    assert staged is not None and staged.staged is not None
    end = state.signer.cert.not_valid_after_utc
    halfway = staged_at + (end - staged_at) / 2
    assert plan_server_ca(staged, staged_at + dt.timedelta(seconds=10), DEFAULT) == Step.KEEP
    assert plan_server_ca(staged, halfway - dt.timedelta(seconds=1), DEFAULT) == Step.KEEP
    assert plan_server_ca(staged, halfway, DEFAULT) == Step.SWITCH
    client = rotate_client_ca(None, T0, CA, [], CLIENT)
    assert client is not None
    pod = issue_upload_server(state, NAMES, staged_at - MIN, SERVER)
    deadline = server_deadline(pod, client, SERVER, DEFAULT)
    assert staged_at - MIN < deadline < staged_at + (end - staged_at) / 2  # gone by the switch


def test_the_controller_checks_again_before_the_next_step_can_fall_due() -> None:
    interval = dt.timedelta(minutes=10)
    year = rotate_server_ca(None, T0, DEFAULT, SERVER)
    assert year is not None
    assert next_check([year], T0, DEFAULT, interval) == interval
    staged = rotate_server_ca(rotate_server_ca(None, T0, CA, SERVER), T0 + 8 * MIN, CA, SERVER)
    assert staged is not None and staged.staged is not None
    assert next_check([staged], T0 + 8 * MIN, CA, interval) <= dt.timedelta(seconds=15)
    short = rotate_server_ca(None, T0, CA, SERVER)  # 10 minutes under the default: a quarter
    assert short is not None
    assert next_check([short], T0 + 2 * MIN, DEFAULT, interval) <= 2 * MIN
    at = T0 + 9 * MIN + dt.timedelta(seconds=1)
    switched = rotate_server_ca(staged, at, CA, SHORT_SERVER)
    assert switched is not None and switched.previous_until is not None
    assert next_check([switched], at, CA, interval) <= switched.previous_until - at


def test_a_pod_trusting_a_short_signer_and_a_long_previous_ca_leaves_before_the_switch() -> None:
    """After a rotation under a short ``certConfig.ca`` the previous client CA (the year-long
    one) may outlive the signer. It never signs again, so it must not stretch a pod's deadline:
    the forced switch comes at the short signer's last call, and the proxy's certificate after
    it is from neither."""
    year = rotate_client_ca(None, T0 - MIN, DEFAULT, [], CLIENT)
    assert year is not None
    staged = rotate_client_ca(year, T0, CA, [], CLIENT)  # 10m asked: due at once
    assert staged is not None and staged.staged is not None
    switched = rotate_client_ca(staged, T0 + MIN, CA, [], CLIENT)
    assert switched is not None and switched.previous_pem == year.signer.cert_pem
    created = T0 + 3 * MIN
    pod = issue_upload_server(
        rotate_server_ca(None, T0, CA, SERVER) or year, NAMES, created, SERVER
    )
    deadline = server_deadline(pod, switched, SERVER, DEFAULT)  # certConfig lifted meanwhile
    state, now = switched, created
    while now < T0 + 10 * MIN:  # its last day: the previous CA dropped, a year-long one staged
        now += dt.timedelta(seconds=10)
        step = plan_client_ca(state, now, DEFAULT, [pod_trust := fingerprints(switched.trust)])
        state = rotate_client_ca(state, now, DEFAULT, [pod_trust], CLIENT) or state
        if step == Step.SWITCH:
            assert deadline <= now, (deadline, now)
            return
    raise AssertionError("the short signer was never switched")


def test_a_short_cert_config_ca_set_on_year_long_cas_then_lifted_never_breaks_trust() -> None:
    """The integration test's path, with the product's defaults elsewhere: year-long CAs (an
    install), then ``certConfig.ca`` 10m/2m, lifted 4 minutes later. The first switch leaves
    the year-long CA as the previous one for as long as a certificate it signed may be
    presented (a day for upload servers, 30 days for the proxy's client certificate), far past
    the 10-minute signer's own end: the signer's successor must be staged anyway, or the CA
    runs out and is re-created with no overlap. Every 10 s: every live pod's certificate
    verifies against the bundle the proxy last read, and the proxy's client certificate
    against every live pod's trust; no CA is ever re-created."""
    month = Lifetime(30 * 24 * 60 * MIN, 6 * 24 * 60 * MIN)  # the proxy's certificate's default
    now = T0 - MIN
    world = _start(now, DEFAULT)
    lifted = T0 + 4 * MIN
    n = 0
    while now < T0 + 40 * MIN:
        ca = CA if T0 <= now < lifted else DEFAULT
        _controller(world, now, month, ca)
        world.pods = [p for p in world.pods if now < p.deadline]
        if n % 2 == 0:
            world.pods.append(_pod(world, f"pod-{n}", now, SERVER, ca))
        if n % 5 == 4:
            world.proxy_bundle = world.published_bundle
        if n % 2 == 1:
            world.proxy_client = world.published_client
        _invariant(world, now)
        now += dt.timedelta(seconds=10)
        n += 1
    assert not [s for s in world.steps if s[2] == Step.CREATE], world.steps
    ends = [
        world.server.signer.cert.not_valid_after_utc,
        world.client.signer.cert.not_valid_after_utc,
    ]
    assert all(end > T0 + 300 * 24 * 60 * MIN for end in ends), world.steps  # year-long again
