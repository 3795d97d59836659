"""The runtime settings of a Containerfile (USER, ENTRYPOINT, CMD, EXPOSE, ENV), read the way
buildah reads them, so that scripts/images.sh (umoci, no container engine) gives an image the
same configuration a ``podman build`` of that Containerfile would. Standard library only: it
runs on a fresh machine before any venv exists.

    python3 scripts/containerfile.py umoci FILE   NUL-separated ``umoci config`` flags
    python3 scripts/containerfile.py json FILE    the settings as JSON

Only the exec (JSON array) form of ENTRYPOINT and CMD is accepted: the shell form would wrap
the command in ``/bin/sh -c`` and is a mistake in these images.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path


class ContainerfileError(ValueError):
    pass


@dataclass
class RuntimeConfig:
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    exposed: list[str] = field(default_factory=list)  # "8443/tcp"
    env: dict[str, str] = field(default_factory=dict)
    base: str = ""  # the last FROM (after ARG defaults are substituted)


def _instructions(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _exec_form(value: str, what: str, path: Path) -> list[str]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, list) or not all(isinstance(p, str) for p in parsed):
        raise ContainerfileError(f"{path}: {what} must be a JSON array (exec form): {value}")
    return parsed


def parse(path: Path) -> RuntimeConfig:
    config = RuntimeConfig()
    args: dict[str, str] = {}
    for word, rest in _instructions(path.read_text()):
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "FROM":
            base = rest.split()[0]
            for name, value in args.items():
                base = base.replace("${" + name + "}", value).replace("$" + name, value)
            config = RuntimeConfig(base=base)  # a new stage starts from nothing we know
        elif word == "USER":
            config.user = rest
        elif word == "ENTRYPOINT":
            config.entrypoint = _exec_form(rest, word, path)
            config.cmd = []  # as in Docker: a new ENTRYPOINT resets an inherited CMD
        elif word == "CMD":
            config.cmd = _exec_form(rest, word, path)
        elif word == "EXPOSE":
            config.exposed += [p if "/" in p else f"{p}/tcp" for p in rest.split()]
        elif word == "ENV":
            name, _, value = rest.partition("=")
            config.env[name] = value
    return config


def umoci_flags(config: RuntimeConfig) -> list[str]:
    flags = ["--clear=config.entrypoint", "--clear=config.cmd", "--clear=config.exposedports"]
    if config.user:
        flags.append(f"--config.user={config.user}")
    flags += [f"--config.entrypoint={a}" for a in config.entrypoint]
    flags += [f"--config.cmd={a}" for a in config.cmd]
    flags += [f"--config.exposedports={p}" for p in config.exposed]
    flags += [f"--config.env={k}={v}" for k, v in config.env.items()]
    return flags


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("umoci", "json"):
        print(__doc__, file=sys.stderr)
        return 2
    config = parse(Path(argv[2]))
    if argv[1] == "json":
        print(json.dumps(asdict(config), indent=2))
    else:
        sys.stdout.write("".join(f + "\0" for f in umoci_flags(config)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
