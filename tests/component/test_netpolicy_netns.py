"""The import network policy against real sockets, without ever sending a packet to a real
metadata, link-local or private address: each test runs its imports in a fresh network and
mount namespace (``unshare --net --mount``, root) where those addresses live on the namespace's
own loopback, each with a canary listener (``netns_child`` says how). A refused import must end
``SourceForbidden`` and the canaries must have accepted nothing. A control run that allows
10.0.0.0/8 proves the canaries do see connections, so the assertions can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

PORT = 8081  # the canaries listen here and on 80
REPO = Path(__file__).resolve().parents[2]
LOOPBACK = ["127.0.0.0/8"]

DIRECT = [
    "http://169.254.169.254:{port}/latest/meta-data/",
    "http://169.254.169.254/latest/meta-data/",  # port 80
    "https://169.254.169.254:{port}/",
    "http://2852039166:{port}/",  # decimal
    "http://0251.0376.0251.0376:{port}/",  # octal
    "http://0xa9fea9fe:{port}/",  # hex
    "http://169.254.43518:{port}/",  # short form
    "http://[::ffff:169.254.169.254]:{port}/",  # IPv4-mapped
    "http://[fd00:ec2::254]:{port}/",
    "http://100.100.100.200:{port}/",
    "http://10.0.0.1:{port}/",
    "http://192.168.1.1:{port}/",
    "http://metadata.test:{port}/",  # names (private /etc/hosts)
    "http://internal.test:{port}/",
    "http://imds6.test:{port}/",
    "http://mixed.test:{port}/",  # 127.0.0.1 and 10.0.0.1: refused whole
]


def _via_redirect(url: str) -> str:
    return "{redirect}/to?u=" + quote(url, safe="{}")


def run_in_netns(tmp_path: Path, urls: list[str], allowed: list[str]) -> dict[str, Any]:
    """Run ``netns_child`` in a new network and mount namespace; its JSON report."""
    unshare = shutil.which("unshare")
    assert unshare and os.geteuid() == 0, "network-policy tests need root and util-linux unshare"
    spec = {
        "parent_netns": os.stat("/proc/self/ns/net").st_ino,
        "workdir": str(tmp_path),
        "allowed": allowed,
        "port": PORT,
        "urls": urls,
    }
    cmd = [unshare, "--net", "--mount", "--", sys.executable, "-m", "tests.component.netns_child"]
    proc = subprocess.run(
        cmd, input=json.dumps(spec), capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_refused_addresses_in_every_spelling_get_no_packet(tmp_path: Path) -> None:
    report = run_in_netns(tmp_path, DIRECT, LOOPBACK)
    assert [r["reason"] for r in report["results"]] == ["SourceForbidden"] * len(DIRECT), report
    assert all("not allowed by the import policy" in r["message"] for r in report["results"])
    assert report["canary"] == dict.fromkeys(report["canary"], 0)


def test_redirects_from_an_allowed_server_to_refused_addresses_get_no_packet(
    tmp_path: Path,
) -> None:
    targets = [
        "http://169.254.169.254:{port}/",
        "http://0xa9fea9fe:{port}/",
        "http://[fd00:ec2::254]:{port}/",
        "http://10.0.0.1:{port}/",
        "http://metadata.test:{port}/",
        "http://user:pw@internal.test:{port}/",
    ]
    urls = [_via_redirect(t) for t in targets]
    urls.append(_via_redirect(_via_redirect("http://169.254.169.254/")))  # two hops
    urls.append("{redirect}/cut?u=" + quote("http://169.254.169.254:{port}/", safe="{}"))  # resume
    report = run_in_netns(tmp_path, urls, LOOPBACK)
    assert [r["reason"] for r in report["results"]] == ["SourceForbidden"] * len(urls), report
    assert report["canary"] == dict.fromkeys(report["canary"], 0)
    assert not any("pw" in r["message"] for r in report["results"])


def test_allowed_loopback_still_imports_inside_the_namespace(tmp_path: Path) -> None:
    """The same paths as above, to an allowed target, complete: the refusals above are the
    policy's doing, and the cut body really is resumed through the redirect."""
    resumed = "{redirect}/cut?u=" + quote("{redirect}/image", safe="{}")
    urls = ["{redirect}/image", _via_redirect("{redirect}/image"), resumed]
    report = run_in_netns(tmp_path, urls, LOOPBACK)
    assert [r["reason"] for r in report["results"]] == ["Completed"] * 3, report


def test_control_allowing_a_private_range_reaches_the_canary(tmp_path: Path) -> None:
    """Proves the canaries count: the same imports, once allowed, do connect."""
    urls = ["http://10.0.0.1:{port}/", "http://internal.test/", "http://169.254.169.254:{port}/"]
    report = run_in_netns(tmp_path, urls, [*LOOPBACK, "10.0.0.0/8", "0.0.0.0/0"])
    reasons = [r["reason"] for r in report["results"]]
    assert reasons[:2] == ["SourceUnavailable", "SourceUnavailable"], report
    assert reasons[2] == "SourceForbidden"  # no CIDR opens metadata
    assert report["canary"]["10.0.0.1"] >= 2
    assert report["canary"]["169.254.169.254"] == 0


def test_refusal_does_not_tell_an_open_port_from_a_closed_one(tmp_path: Path) -> None:
    urls = ["http://10.0.0.1:{port}/", f"http://10.0.0.1:{PORT + 1}/"]
    report = run_in_netns(tmp_path, urls, LOOPBACK)
    open_, closed = (r["message"] for r in report["results"])
    assert open_.replace(str(PORT), "P") == closed.replace(str(PORT + 1), "P")
    assert report["canary"]["10.0.0.1"] == 0
