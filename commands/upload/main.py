"""``cdi upload dv|pvc NAME``: ``virtctl image-upload``'s interface, with a progress bar,
resume after a cut connection and token refresh.

The process edge of the upload client: flags, ``--kubeconfig``/``KUBECONFIG`` and the terminal
are read here, once, into ``UploadOptions`` and an injected ``Kube``; ``target`` does the
Kubernetes half (virtctl's flow and messages), ``commands.upload.client`` moves the bytes. Every
failure ends the command with the typed reason and virtctl's message on stderr and a non-zero
status (2 for a wrong command line), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cdi.api.errors import WorkerError
from commands.upload.options import (
    ProcessingFailed,
    UploadOptions,
    UsageError,
    options_from_args,
)
from commands.upload.progress import ProgressBar

if TYPE_CHECKING:  # the Kubernetes client costs ~0.5 s to import: only `cdi upload` pays it
    from cdi.kube.client import Kube
    from cdi.kube.errors import KubeError
    from commands.upload.target import UploadTarget

TokenProvider = Callable[[], str]
ProgressCallback = Callable[[int, int], None]


class Transfer(Protocol):
    """Moves the file to the proxy; the transfer client (``commands.upload.client``) is one."""

    async def __call__(
        self,
        url: str,
        path: Path,
        token: TokenProvider,
        refresh: TokenProvider,
        progress: ProgressCallback,
    ) -> tuple[str, ...]:
        """Send the file; lines worth telling the user (a resume, a restart)."""
        ...


def add_upload_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "upload",
        help="upload a local disk image to a DataVolume or PVC (virtctl image-upload)",
        description="cdi upload dv|pvc NAME --image-path=FILE|--archive-path=FILE [--size=10Gi]",
    )
    p.add_argument("args", nargs="*", metavar="dv|pvc NAME")
    p.add_argument("--image-path", default="", help="local disk image")
    p.add_argument("--archive-path", default="", help="local tar archive (contentType archive)")
    p.add_argument("--size", default="", help="size of the DataVolume/PVC to create (10Gi)")
    p.add_argument("--storage-class", default="", help="storage class of the new volume")
    p.add_argument("--access-mode", default="", help="access mode of the new volume")
    p.add_argument("--volume-mode", default="", help="block or filesystem")
    p.add_argument("--uploadproxy-url", default="", help="upload proxy (default: CDIConfig)")
    p.add_argument("--insecure", action="store_true", help="skip TLS verification")
    p.add_argument("--wait-secs", type=float, default=300, help="wait for the upload pod")
    p.add_argument("--retry", type=int, default=5, help="attempts to send the bytes")
    p.add_argument("--no-create", action="store_true", help="use an existing DV/PVC only")
    p.add_argument("--force-bind", action="store_true", help="bind even on WaitForFirstConsumer")
    p.add_argument(
        "--datasource", action="store_true", help="create or update DataSource NAME for it"
    )
    p.add_argument("--default-instancetype", default="", help="the VM's default instance type")
    p.add_argument("--default-instancetype-kind", default="", help="its kind")
    p.add_argument("--default-preference", default="", help="the VM's default preference")
    p.add_argument("--default-preference-kind", default="", help="its kind")
    p.add_argument("--pvc-name", default="", help=argparse.SUPPRESS)  # deprecated
    p.add_argument("--pvc-size", default="", help=argparse.SUPPRESS)  # deprecated: --size
    p.add_argument("--block-volume", action="store_true", help=argparse.SUPPRESS)  # deprecated
    p.add_argument("--kubeconfig", default="", help="kubeconfig (default: $KUBECONFIG)")
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument("-n", "--namespace", default="", help="namespace (default: the context's)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_upload)


def open_image(path: str) -> int:
    """virtctl opens the file before anything else: a typo costs no cluster object."""
    try:
        with open(path, "rb") as fh:
            return os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise UsageError(f"open {path}: {(exc.strerror or str(exc)).lower()}") from exc


def kube_from_args(a: argparse.Namespace) -> tuple[Kube, str]:
    """The user's kubeconfig: ``--kubeconfig``, else ``$KUBECONFIG``, else ~/.kube/config."""
    from cdi.kube.client import Kube, load_user_client

    path = a.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    api, namespace = load_user_client(path, a.context)
    return Kube(api), a.namespace or namespace


def run_upload(target: UploadTarget, transfer: Transfer | None, size: int, bar: ProgressBar) -> str:
    """virtctl's flow after the command line: prepare, wait, token, bytes, processing."""
    o, say = target.opts, target.say
    target.prepare()
    target.wait_ready()
    url = target.proxy_url()
    say(f"Uploading data to {url}")
    first = target.request_token()
    send = transfer or default_transfer(o, target.proxy_ca)
    with bar.shown(size):
        notes = asyncio.run(
            send(url, Path(o.path), lambda: first, target.request_token, bar.update)
        )
    for note in notes:
        say(note)
    return finish(target)


def finish(target: UploadTarget) -> str:
    """After the bytes: wait for the upload pod's processing, then the volume's phase."""
    from commands.upload.target import WaitTimedOut

    o, say = target.opts, target.say
    say(
        "Uploading data completed successfully, waiting for processing to complete, "
        "you can hit ctrl-c without interrupting the progress"
    )
    try:
        target.wait_processed()
    except WaitTimedOut:
        say(
            "Timed out waiting for post upload processing to complete, "
            "please check upload pod status for progress"
        )
        raise
    phase = target.final_phase()
    say(f"{o.kind} {target.namespace}/{o.name} phase: {phase}")
    if phase != "Succeeded":
        raise ProcessingFailed(f"{o.kind} {target.namespace}/{o.name} ended in phase {phase}")
    say(f"Uploading {o.path} completed successfully")
    if o.datasource:
        target.ensure_datasource()
    return phase


def _fail(exc: WorkerError | KubeError) -> int:
    print(f"cdi upload: {exc.reason}: {exc.message.strip()}", file=sys.stderr)
    return 2 if isinstance(exc, UsageError) else 1


def cmd_upload(a: argparse.Namespace, transfer: Transfer | None = None) -> int:
    from cdi.kube.errors import KubeError
    from commands.upload.target import UploadTarget

    try:
        opts: UploadOptions = options_from_args(a)
        size = open_image(opts.path)
        kube, namespace = kube_from_args(a)
        target = UploadTarget(kube, namespace, opts, say=lambda line: print(line, flush=True))
        bar = ProgressBar(enabled=not a.quiet and sys.stdout.isatty())
        run_upload(target, transfer, size, bar)
    except (WorkerError, KubeError) as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        print(
            "cdi upload: Interrupted: stopped by the user; what the cluster already has stays",
            file=sys.stderr,
        )
        return 130
    return 0


def default_transfer(opts: UploadOptions, ca_pem: str | None) -> Transfer:
    from commands.upload.transfer import ClientTransfer

    return ClientTransfer(insecure=opts.insecure, attempts=opts.retry, ca_pem=ca_pem)
