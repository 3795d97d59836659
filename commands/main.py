"""The ``cdi`` command: ``cdi import SOURCE TARGET`` and ``cdi demo``.

The command line is a process edge, like the pod's environment: it builds an ``ImportConfig``
once (with ``importer.config``'s builders) and hands it to the same runner the import pod uses;
it imports only the importer's public modules and ``datapath``'s public names. Exit status is
0 only on success; failures print the typed reason and message and exit 1 (2 for bad usage).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
from urllib.parse import urlsplit

from cdi.api.errors import InvalidConfig, WorkerError
from cdi.api.netpolicy import PRIVATE, NetPolicy
from commands.output import print_result, with_progress
from datapath import TargetSpec, parse_checksum
from importer.config import (
    CHECKPOINT_SUFFIX,
    BlankOptions,
    FileOptions,
    HttpOptions,
    ImportConfig,
    ProxyConfig,
    SourceOptions,
    TargetExists,
    WorkerEdges,
    build_plan,
    content_type,
    mounted_files,
    parse_bandwidth,
    parse_size,
    read_file,
    split_header,
)
from importer.runner import tune_process_memory


def _tempdir() -> str:
    import tempfile  # 4 ms of start-up for a flag few imports need

    return tempfile.gettempdir()


def _add_import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="http(s):// URL, local file path, or 'blank:' for an empty disk")
    p.add_argument(
        "target",
        help="disk image file to write (e.g. vol/disk.img), a block "
        "device, or a directory for --content-type archive",
    )
    p.add_argument("--size", help="target size (10Gi, 512Mi, bytes); the image must fit")
    p.add_argument("--checksum", help="md5|sha1|sha256|sha512:<hex> of the source bytes")
    p.add_argument("--content-type", choices=["kubevirt", "archive"], default="kubevirt")
    p.add_argument(
        "--ca",
        action="append",
        default=[],
        help="CA bundle file or directory of CA files (repeatable)",
    )
    p.add_argument("--insecure", action="store_true", help="skip TLS verification")
    p.add_argument("-H", "--header", action="append", default=[], help="'Name: value'")
    p.add_argument(
        "--header-file",
        action="append",
        default=[],
        help="file holding a secret 'Name: value' header",
    )
    p.add_argument("--username-file", help="file with the basic-auth user (accessKeyId)")
    p.add_argument("--password-file", help="file with the basic-auth password (secretKey)")
    p.add_argument(
        "--allow-source-cidr",
        action="append",
        default=[],
        metavar="CIDR",
        help="restricted range the import may reach (repeatable; replaces the default of "
        "loopback and private ranges; 'none' allows only public addresses); metadata and "
        "link-local addresses are always refused",
    )
    p.add_argument("--proxy", help="HTTP(S) proxy URL (default: none)")
    p.add_argument("--no-proxy", default="", help="comma-separated hosts that bypass the proxy")
    p.add_argument("--preallocate", action="store_true", help="allocate the whole file")
    p.add_argument(
        "--bandwidth-limit",
        metavar="RATE",
        help="read the network source at most this many bytes per second (50Mi, 10M)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="read the disk back from the device once written and compare (fails on a mismatch)",
    )
    p.add_argument(
        "--filesystem-overhead",
        type=float,
        default=0.0,
        help="fraction of --size kept free for the filesystem (CDI default 0.055)",
    )
    p.add_argument(
        "--target-is-zero",
        action="store_true",
        help="block device already reads zeros: skip zeroing unwritten ranges",
    )
    p.add_argument("--scratch-dir", help="where images needing qemu-img are staged")
    p.add_argument("--termination-message", help="also write the JSON result to this path")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--owner-uid", default="", help="ownerUID label of the metrics")
    p.add_argument("--overwrite", action="store_true", help="replace an existing target file")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def cli_policy(allowed: list[str]) -> NetPolicy:
    """The CLI runs for the user on their own machine: loopback and private ranges are
    allowed unless ``--allow-source-cidr`` says otherwise; metadata/link-local never are."""
    cidrs = [c for c in allowed if c.strip().lower() != "none"] if allowed else list(PRIVATE)
    try:
        return NetPolicy.parse(cidrs)
    except ValueError as exc:
        raise InvalidConfig(f"--allow-source-cidr: {exc}") from exc


def _refuse_overwrite(a: argparse.Namespace, block: bool, checkpoint: str | None) -> None:
    """An existing disk file is replaced only with --overwrite (or when resuming it)."""
    if (
        not (checkpoint and os.path.exists(checkpoint))  # an interrupted import resumes
        and not block
        and a.content_type == "kubevirt"
        and os.path.exists(a.target)
        and os.path.getsize(a.target) > 0
        and not a.overwrite
    ):
        raise TargetExists(f"{a.target} exists; pass --overwrite to replace it")


def _source_from_args(a: argparse.Namespace) -> SourceOptions:
    if a.source == "blank:":
        return BlankOptions()
    if urlsplit(a.source).scheme not in ("http", "https"):
        return FileOptions(a.source)
    cas: tuple[str, ...] = ()
    for ca in a.ca:
        cas += mounted_files(ca) if os.path.isdir(ca) else (ca,)
    headers = [split_header(h, "-H header") for h in a.header]
    secret_headers = [split_header(read_file(f) or "", f"header file {f}") for f in a.header_file]
    return HttpOptions(
        url=a.source,
        headers=tuple(headers),
        secret_headers=tuple(secret_headers),
        username=read_file(a.username_file),
        password=read_file(a.password_file),
        ca_files=cas,
        insecure=a.insecure,
        proxy=ProxyConfig(
            http=a.proxy, https=a.proxy, no_proxy=tuple(filter(None, a.no_proxy.split(",")))
        ),
        policy=cli_policy(a.allow_source_cidr),
    )


def config_from_args(a: argparse.Namespace) -> ImportConfig:
    block = os.path.exists(a.target) and stat.S_ISBLK(os.stat(a.target).st_mode)
    checkpoint = None if block else f"{a.target}{CHECKPOINT_SUFFIX}"
    _refuse_overwrite(a, block, checkpoint)
    target = TargetSpec(
        path=a.target,
        block=block,
        size=parse_size(a.size) if a.size else None,
        filesystem_overhead=a.filesystem_overhead,
        preallocate=a.preallocate,
        zeroed=a.target_is_zero,
    )
    source = _source_from_args(a)
    plan = build_plan(
        source,
        target,
        content_type=content_type(a.content_type),
        checksum=parse_checksum(a.checksum) if a.checksum else None,
        scratch_dir=a.scratch_dir or (_tempdir() if block else None),
        checkpoint_path=checkpoint,
        verify=a.verify,
    )
    edges = WorkerEdges(
        termination_path=a.termination_message,
        metrics_port=a.metrics_port,
        metrics_addr="127.0.0.1",
        owner_uid=a.owner_uid,
    )
    bandwidth = parse_bandwidth(a.bandwidth_limit)
    return ImportConfig(plan=plan, source=source, edges=edges, bandwidth_limit=bandwidth)


def cmd_import(a: argparse.Namespace) -> int:
    tune_process_memory()
    try:
        config = config_from_args(a)
    except WorkerError as exc:
        print(f"cdi import: {exc.reason}: {exc.message}", file=sys.stderr)
        return 2
    show = not a.quiet and not a.json and sys.stderr.isatty()
    message = asyncio.run(with_progress(config, show))
    print_result(message, a.json)
    if not message.succeeded and not a.json:
        print(f"cdi import: {message.reason}: {message.message}", file=sys.stderr)
    return 0 if message.succeeded else 1


def cmd_demo(a: argparse.Namespace) -> int:
    from commands.demo import run_demo

    return run_demo(a.workdir, a.size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdi", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="import a disk image into a file or block device")
    _add_import_args(imp)
    imp.set_defaults(func=cmd_import)
    demo = sub.add_parser("demo", help="serve a generated qcow2 on loopback and import it")
    demo.add_argument("--workdir", default="_work/demo")
    demo.add_argument("--size", default="1Gi", help="virtual size of the generated image")
    demo.set_defaults(func=cmd_demo)
    from commands.control import add_control_commands

    add_control_commands(sub)
    from commands.upload.main import add_upload_parser

    add_upload_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
