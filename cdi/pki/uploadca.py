"""Staged rotation of the upload servers' two CAs: the decisions, pure (time is a parameter).

``cdi.pki.upload.ProxyCredentials.ensure`` carries them out, one step per check of the leading
controller (``cdi.controller.proxycreds``), with each ``CAState`` kept in its CA's Secret
(``to_secret_data``/``from_secret_data``); ``tests/unit/test_upload_ca_rotation.py`` walks
whole rotations (``docs/controller.md``, "The upload CAs' rotation").

Each CA is a ``CAState``: the ``signer`` (signs every certificate issued now), a ``staged``
CA (trusted, signs nothing yet) and a ``previous`` one (signed certificates that may still be
presented, so still trusted until ``previous_until``). What a verifier must trust is
``CAState.trust``: all three. Steps (``Step``), one per check, as ``cdi.pki.certs``:

- ``STAGE``: the signer is due (``certConfig.ca`` renewBefore before its end, or it lives
  longer than ``certConfig.ca.duration`` asks) and none is staged yet: a new CA is staged,
  even while a previous CA is still trusted (a signer of minutes may be due long before its
  year-long predecessor may leave; at the next switch both previous CAs stay, until the
  later of their times). Server CA: the proxy's bundle (``cdi-uploadserver-signer-bundle``)
  holds both from now. Client CA: every upload pod created from now trusts both.
- ``SWITCH``: the staged CA becomes the signer. Server CA: a *stage* (half of renewBefore,
  ``cdi.pki.certs.stage_of``) after staging, so every proxy replica re-read the bundle
  (the proxy must re-read it at least once a stage) before any pod presents a certificate of
  the new CA. Client CA: a stage after staging *and* only once every live upload pod trusts
  the staged CA (``live_trust``: the fingerprints of the CAs in each live pod's ``ca.crt``
  as it was mounted at its creation, ``fingerprints``). Pods made before staging trust only
  the old CA and are not re-issued their trust (a mounted file the upload server reads once),
  so the switch waits for them to go; they go by their deadline, which ``server_deadline``
  puts ``last_call`` (half a stage) before the end of the latest-ending client CA they trust.
  So a forced switch when the old signer is ``last_call`` from its end (its certificates end
  with it anyway) never strands a live pod; the proxy must re-read its client certificate
  more often than ``last_call``.
- ``DROP``: the previous CA leaves the trust at ``previous_until``, set at the switch to the
  latest end of anything it signed that can still be presented. Server CA: the switch time
  plus the longest upload server certificate lifetime (``certConfig.server.duration``; no
  certificate it signed ends later, and every leaf ends with its CA at the latest), decided by
  time rather than by listing pods because the end of every certificate the old CA signed is
  bounded once it signs no more. Client CA: the switch time plus a stage (every proxy replica
  reloaded its client certificate, re-issued by the new CA at the switch) or plus the client
  certificate lifetime (clone source pods present client certificates too), whichever is
  later, and never after the old CA's own end.
- ``CREATE``: no CA yet, an unreadable one, or one already expired: nothing to overlap with.

The CA keys stay in the controller: the proxy gets only certificates (N5, ``docs/security.md``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from cdi.api.cdiresource import Lifetime
from cdi.pki.certs import (
    ISSUED_EARLY,
    KeyPair,
    _ca_due,
    _issued_by,
    issue_serving,
    new_ca,
    stage_of,
)


class Step(StrEnum):
    KEEP = "Keep"
    CREATE = "Create"
    STAGE = "Stage"
    SWITCH = "Switch"
    DROP = "Drop"


@dataclass(frozen=True)
class CAState:
    """One upload CA under rotation (what its Secret is to hold)."""

    signer: KeyPair
    staged: KeyPair | None = None
    staged_at: dt.datetime | None = None
    previous_pem: bytes = b""
    previous_until: dt.datetime | None = None

    @property
    def trust(self) -> bytes:
        """Every CA a verifier must trust now: signer, staged, previous (PEM, concatenated)."""
        staged = self.staged.cert_pem if self.staged is not None else b""
        return self.signer.cert_pem + staged + self.previous_pem


def _end(pem_or_pair: KeyPair) -> dt.datetime:
    return pem_or_pair.cert.not_valid_after_utc


def _certs(bundle: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return []


def fingerprints(bundle: bytes) -> tuple[str, ...]:
    """SHA-256 of each certificate in ``bundle`` (DER), hex: how an upload pod's annotation
    names the client CAs it trusts."""
    return tuple(c.fingerprint(hashes.SHA256()).hex() for c in _certs(bundle))


def fingerprint(ca: KeyPair) -> str:
    """``ca``'s certificate as ``fingerprints`` names it."""
    return ca.cert.fingerprint(hashes.SHA256()).hex()


def trusts(bundle: bytes, ca: KeyPair) -> bool:
    """``bundle`` (PEM certificates) holds ``ca``'s certificate."""
    cert = ca.cert
    return any(c == cert for c in _certs(bundle))


def verifies(bundle: bytes, leaf_pem: bytes, now: dt.datetime) -> bool:
    """A verifier trusting ``bundle`` accepts ``leaf_pem`` at ``now``: signed by a CA in it,
    both valid at ``now``."""
    leaf = x509.load_pem_x509_certificate(leaf_pem)
    if not leaf.not_valid_before_utc <= now < leaf.not_valid_after_utc:
        return False
    return any(
        c.not_valid_before_utc <= now < c.not_valid_after_utc and _issued_by(leaf, c)
        for c in _certs(bundle)
    )


def _broken(state: CAState | None, now: dt.datetime) -> bool:
    if state is None:
        return True
    try:
        return now >= _end(state.signer)
    except ValueError:
        return True


def _common(
    state: CAState | None, now: dt.datetime, ca_life: Lifetime
) -> tuple[Step | None, CAState | None]:
    """Steps both CAs share: CREATE, DROP, STAGE; None when the caller decides the switch."""
    if _broken(state, now):
        return Step.CREATE, None
    assert state is not None
    if state.previous_pem and state.previous_until is not None and now >= state.previous_until:
        return Step.DROP, state
    # Staged even while a previous CA is still trusted: a short signer (a certConfig.ca of
    # minutes) may be due long before its year-long predecessor may leave, and a signer that
    # runs out without a successor is re-created with no overlap.
    if state.staged is None and _ca_due(state.signer.cert, ca_life, now):
        return Step.STAGE, state
    return None, state


def last_call(ca_life: Lifetime) -> dt.timedelta:
    """How long before its end a signer is switched whatever waits (half a stage: the proxy
    must re-read its credentials more often than that), and how long before the end of the
    last client CA it trusts an upload pod stops taking uploads."""
    return stage_of(ca_life) / 2


def _last_call_of(ca_life: Lifetime, end: dt.datetime, since: dt.datetime) -> dt.timedelta:
    """``last_call``, or less for a CA with less life left when its wait began (``since``: its
    staging, or a pod's creation): half of that life. A short CA left by a lifted
    ``certConfig`` (the default ``last_call`` is weeks) would otherwise be switched at the
    next check, before any proxy replica re-read the bundle it was staged in; a proxy re-reads
    at least every quarter of what is left of the CAs it trusts (``cdi.upload.serve``)."""
    return min(last_call(ca_life), max(dt.timedelta(0), end - since) / 2)


def _forced(state: CAState, now: dt.datetime, ca_life: Lifetime) -> bool:
    """The signer is within its last call of its end: switch whatever else waits."""
    end = _end(state.signer)
    since = state.staged_at or now
    return now >= end - _last_call_of(ca_life, end, since)


def plan_server_ca(state: CAState | None, now: dt.datetime, ca_life: Lifetime) -> Step:
    """The one step to take now on the upload server CA."""
    step, state = _common(state, now, ca_life)
    if step is not None:
        return step
    assert state is not None
    if state.staged is not None and state.staged_at is not None:
        if now - state.staged_at >= stage_of(ca_life) or _forced(state, now, ca_life):
            return Step.SWITCH
    return Step.KEEP


def plan_client_ca(
    state: CAState | None,
    now: dt.datetime,
    ca_life: Lifetime,
    live_trust: Iterable[Collection[str]],
) -> Step:
    """The one step to take now on the upload client CA; ``live_trust``: for every live upload
    pod, the fingerprints of the CAs in its ``ca.crt`` (what it verifies the proxy's client
    certificate with). Iterated only when the switch waits on it."""
    step, state = _common(state, now, ca_life)
    if step is not None:
        return step
    assert state is not None
    staged = state.staged
    if staged is not None and state.staged_at is not None:
        if _forced(state, now, ca_life):
            return Step.SWITCH
        if now - state.staged_at >= stage_of(ca_life) and all(
            fingerprint(staged) in names for names in live_trust
        ):
            return Step.SWITCH
    return Step.KEEP


def _take(
    step: Step,
    state: CAState | None,
    now: dt.datetime,
    name: str,
    ca_life: Lifetime,
    keep_previous: dt.timedelta,
) -> CAState:
    if step == Step.CREATE or state is None:
        return CAState(new_ca(name, now, ca_life.duration))
    if step == Step.STAGE:
        return replace(state, staged=new_ca(name, now, ca_life.duration), staged_at=now)
    if step == Step.DROP:
        return replace(state, previous_pem=b"", previous_until=None)
    if step == Step.SWITCH and state.staged is not None:
        until = min(now + keep_previous, _end(state.signer))
        previous = state.signer.cert_pem
        if state.previous_pem and state.previous_until is not None:
            # the one before is still trusted: both stay until the later of their times
            previous += state.previous_pem
            until = max(until, state.previous_until)
        return CAState(state.staged, None, None, previous, until)
    return state


def rotate_server_ca(
    state: CAState | None,
    now: dt.datetime,
    ca_life: Lifetime,
    server_life: Lifetime,
    name: str = "cdi-uploadserver-ca",
) -> CAState | None:
    """The server CA's state after this check's step; None when nothing changes.
    ``server_life``: ``certConfig.server``, the longest an upload server certificate lives."""
    step = plan_server_ca(state, now, ca_life)
    if step == Step.KEEP:
        return None
    return _take(step, state, now, name, ca_life, server_life.duration)


def rotate_client_ca(
    state: CAState | None,
    now: dt.datetime,
    ca_life: Lifetime,
    live_trust: Iterable[Collection[str]],
    client_life: Lifetime,
    name: str = "cdi-uploadserver-client-ca",
) -> CAState | None:
    """The client CA's state after this check's step; None when nothing changes.
    ``client_life``: ``certConfig.client``, the longest a client certificate lives."""
    step = plan_client_ca(state, now, ca_life, live_trust)
    if step == Step.KEEP:
        return None
    keep = max(stage_of(ca_life), client_life.duration)
    return _take(step, state, now, name, ca_life, keep)


def server_deadline(
    serving: KeyPair, client: CAState, server_life: Lifetime, ca_life: Lifetime
) -> dt.datetime:
    """When an upload pod stops taking uploads: ``certConfig.server`` renewBefore before its
    certificate's end, or at half its life when its CA's end cut it short
    (``Lifetime.renew_at``), and the last call before the end of the latest-ending client CA
    that may sign the proxy's certificate while the pod lives: the signer, or the staged CA
    that will succeed it (the client CA's forced switch happens then, and the proxy's client
    certificate is not trusted by this pod after it). A previous CA in its trust does not
    count: it never signs again, however long it lives."""
    cert = serving.cert
    end = cert.not_valid_after_utc
    start = cert.not_valid_before_utc + ISSUED_EARLY
    signing = [client.signer] + ([client.staged] if client.staged is not None else [])
    try:
        trust_end = max(_end(ca) for ca in signing)
    except ValueError:
        trust_end = end
    return min(
        server_life.renew_at(start, end),
        trust_end - _last_call_of(ca_life, trust_end, start),
    )


def next_check(
    states: Iterable[CAState], now: dt.datetime, ca_life: Lifetime, interval: dt.timedelta
) -> dt.timedelta:
    """How soon the controller checks again: ``interval`` (its usual period), a quarter of the
    stage, and no later than the next moment a step may fall due (a staged CA's stage over,
    a signer's last call, a previous CA's drop), never sooner than a second."""
    stage = stage_of(ca_life)
    moments: list[dt.datetime] = []
    for state in states:
        try:
            end = _end(state.signer)
        except ValueError:
            return dt.timedelta(seconds=1)
        moments.append(end - _last_call_of(ca_life, end, state.staged_at or now))
        if state.staged_at is not None:
            moments.append(state.staged_at + stage)
        if state.previous_until is not None:
            moments.append(state.previous_until)
        moments.append(now + (end - now) / 4)
    waits = [m - now for m in moments if m > now]
    return max(dt.timedelta(seconds=1), min([interval, stage / 4, *waits]))


def issue_upload_server(
    server: CAState, names: tuple[str, ...], now: dt.datetime, server_life: Lifetime
) -> KeyPair:
    """A new upload pod's serving certificate: always from the signer (never a staged CA)."""
    return issue_serving(server.signer, names, now, server_life.duration)


# What a CA's Secret holds beside ``tls.crt``/``tls.key`` (the signer, as today's Secrets do, so
# a Secret written before rotation reads as a signer alone).
STAGED_CRT, STAGED_KEY, STAGED_AT = "staged.crt", "staged.key", "staged-at"
PREVIOUS_CRT, PREVIOUS_UNTIL = "previous.crt", "previous-until"


def to_secret_data(state: CAState) -> dict[str, bytes]:
    """``state`` as a Secret's data (raw bytes; the caller base64-encodes)."""
    data = {"tls.crt": state.signer.cert_pem, "tls.key": state.signer.key_pem}
    if state.staged is not None and state.staged_at is not None:
        data[STAGED_CRT], data[STAGED_KEY] = state.staged.cert_pem, state.staged.key_pem
        data[STAGED_AT] = state.staged_at.isoformat().encode()
    if state.previous_pem and state.previous_until is not None:
        data[PREVIOUS_CRT] = state.previous_pem
        data[PREVIOUS_UNTIL] = state.previous_until.isoformat().encode()
    return data


def _when(raw: bytes) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return when if when.tzinfo is not None else None


def from_secret_data(data: dict[str, bytes]) -> CAState | None:
    """The state a Secret's data holds; None without a signer (``plan_*`` then create one). A
    staged or previous part that does not read whole is left out: an unreadable staged CA is
    staged again (it signed nothing yet); a previous CA without a readable ``previous-until``
    stays until its own end; an unreadable one cannot be trusted anyway."""
    if not data.get("tls.crt") or not data.get("tls.key"):
        return None
    state = CAState(KeyPair(data["tls.crt"], data["tls.key"]))
    staged_at = _when(data.get(STAGED_AT, b""))
    if data.get(STAGED_CRT) and data.get(STAGED_KEY) and staged_at is not None:
        state = replace(state, staged=KeyPair(data[STAGED_CRT], data[STAGED_KEY]))
        state = replace(state, staged_at=staged_at)
    previous = _certs(data.get(PREVIOUS_CRT, b""))
    if previous:  # kept until its own end when the Secret lost when to drop it
        until = _when(data.get(PREVIOUS_UNTIL, b"")) or previous[0].not_valid_after_utc
        state = replace(state, previous_pem=data[PREVIOUS_CRT], previous_until=until)
    return state
