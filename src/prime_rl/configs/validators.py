"""Values that name something outside the config (an address, a directory, a secret), checked at load time.

The checks read only local state and change nothing, so `--dry-run` runs them too:

- a host is an IP literal (IPv4, IPv6) or a syntactically valid host name. Names are not
  resolved here: that may need DNS (no network at config time). `rl` resolves the host when
  it binds the server's port, before it starts or deletes anything.
- an output directory must be creatable and writable: not an existing file, not below a file,
  not on /proc or /sys, its nearest existing folder writable. `rl` also creates it and
  writes a probe file before starting anything (which catches what access() cannot see:
  a full disk, root squashed on a network file system, immutable folders).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, SecretStr

from prime_rl.utils.disk import disk_state, nearest_existing

PSEUDO_FILE_SYSTEMS = (Path("/proc"), Path("/sys"))
"""Kernel file systems: writable-looking for root, but no run directory can live there."""

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_host(host: str) -> str:
    """An IP literal or a host name of dot-separated labels (letters, digits, '-'); all-numeric is IPv4 only."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    if all(label.isdigit() for label in labels):
        raise ValueError(f"{host!r} is not a valid IPv4 address")
    if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{host!r} is neither an IP address nor a valid host name")
    return host


def check_output_dir(path: Path) -> Path:
    """`path` can be (or already is) a directory this user can write into; see the module docstring."""
    absolute = Path(os.path.abspath(path))
    resolved = absolute.resolve()
    for pseudo in PSEUDO_FILE_SYSTEMS:
        if resolved == pseudo or pseudo in resolved.parents:
            raise ValueError(f"{path} is on the kernel file system {pseudo}, not a place for run outputs")
    existing = nearest_existing(absolute)
    if not existing.is_dir():
        what = "is a file" if existing == absolute else f"cannot be created: {existing} is a file"
        raise ValueError(f"output dir {path} {what}, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = disk_state(existing) == errno.EROFS
        why = f"read-only file system ({existing})" if read_only else f"no write permission on {existing}"
        raise ValueError(f"cannot write {path}: {why}")
    return path


Host = Annotated[str, AfterValidator(check_host)]
"""A bind or connect address: IP literal or host name (not resolved at load time)."""

OutputDir = Annotated[Path, AfterValidator(check_output_dir)]
"""A run directory that exists and is writable, or can be created (nothing is created at load time)."""


def check_api_key(key: SecretStr) -> SecretStr:
    """A key that a client can send and the server can match: non-empty printable ASCII, no space at either end.

    (The server reads the Authorization header as latin-1 and compares bytes, so any other key
    could never match; an empty one would silently mean no authentication.)"""
    value = key.get_secret_value()
    if not value:
        raise ValueError("the API key is empty (unset it for no authentication)")
    if not all(" " <= char <= "~" for char in value):
        raise ValueError("the API key must be printable ASCII (letters, digits, punctuation)")
    if value != value.strip():
        raise ValueError("the API key must not begin or end with a space")
    return key


ApiKey = Annotated[SecretStr, AfterValidator(check_api_key)]
"""A bearer token (see `check_api_key`); never printed."""
