"""Certificates and keys for an authenticated Flower deployment (recipes/flower_deploy.sh; Flower's guides
"Enable TLS connections" and "Authenticate SuperNodes").

- ``certs FOLDER --host H ...``: a self-signed certificate authority (``ca.pem``) and the SuperLink's
  certificate signed by it for the hosts and IP addresses the nodes dial (``server.pem``, ``server.key``).
  The SuperLink serves TLS with them (``--ssl-ca-certfile ca.pem --ssl-certfile server.pem --ssl-keyfile
  server.key``); SuperNodes and ``flwr`` trust ``ca.pem`` (``--root-certificates``, ``root-certificates``).
  The authority's own key is not kept: nothing else can be signed with it.
- ``keys FOLDER NAME ...``: one P-384 key pair per SuperNode (``NAME.key``, OpenSSH private key, for
  ``flower-supernode --auth-supernode-private-key``; ``NAME.pub`` for ``flwr supernode register``, which
  a SuperLink started with ``--enable-supernode-auth`` needs before that node may connect). A name is a
  plain file name: letters, digits, ``-``, ``_`` and ``.``, not starting with ``.``.

Nothing is replaced unless asked: where a file either command would write exists already (a live
deployment's CA, server key or node key), it refuses, naming the file, before writing anything; ``--force``
replaces them. Each file is written atomically (:func:`fpsfl.base.files.atomic_write`): a crash leaves the
old file or the new one, never half a key. Private keys are created readable by their owner only.
Self-signed certificates suit a lab's own machines; across organisations, use certificates from an
authority the parties already trust.

Usage: ``python -m federated.flower.tls certs FOLDER --host 127.0.0.1`` and
``python -m federated.flower.tls keys FOLDER node-0 node-1``.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from pathlib import Path

from fpsfl.base.cli import Parser, UsageError, run_main
from fpsfl.base.files import atomic_write

DAYS = 30  # validity of the certificates made here (a deployment's lifetime, not a CA's)
# At most a century: a deployment's certificates outliving it by decades are keys nobody rotates, and far
# beyond that the end date overflows (datetime stops at year 9999, about 2.9 million days from now).
MAX_DAYS = 36500
NODE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # a file name in FOLDER, never a path out of it
MAX_NODE_NAME = 200  # NAME.key's temporary name (.NAME.key.tmpPID, atomic_write) must fit 255 bytes
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")  # a DNS label (RFC 1123), IDNs in their xn-- form


def check_host(host: str) -> str:
    """``host`` if it is an IP address or a DNS name a certificate can hold; ValueError (one line) if not."""
    if not host.strip():
        raise ValueError("a host must not be empty")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if getattr(address, "scope_id", None):
            raise ValueError(f"an IPv6 address with a zone cannot be in a certificate, got {host!r}")
        return host
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise ValueError(f"expected a DNS name (letters, digits and hyphens in dot-separated labels; IDNs in "
                         f"their xn-- form; no port) or an IP address, got {host!r}")
    return host


def check_days(days: int) -> int:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ValueError(f"validity must be 1 to {MAX_DAYS} days, got {days!r}")
    return days


def check_node_name(name: str) -> str:
    """``name`` if it is a plain file name (:data:`NODE_NAME`); ValueError (one line) if not: a name with a
    path separator or ``..`` would write its keys outside the folder."""
    if not NODE_NAME.fullmatch(name) or len(name) > MAX_NODE_NAME:
        raise ValueError(f"a node name is letters, digits, '-', '_' and '.', not starting with '.', at most "
                         f"{MAX_NODE_NAME} characters, got {name!r}")
    return name


def write_certificates(folder: Path, hosts: list[str], days: int = DAYS, force: bool = False) -> None:
    """``ca.pem``, ``server.pem`` and ``server.key`` in ``folder`` for a SuperLink reached at ``hosts``.
    FileExistsError, before anything is written, where one exists and not ``force``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if not hosts:
        raise ValueError("at least one host is needed")
    hosts, days = [check_host(host) for host in hosts], check_days(days)
    paths = [folder / "ca.pem", folder / "server.pem", folder / "server.key"]
    _refuse_existing(paths, force)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fpsfl deployment CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names = [_san(host) for host in hosts]
    common = hosts[0] if len(hosts[0]) <= 64 else "fpsfl SuperLink"  # X.509 caps it; the names are the SAN
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    _write(paths[0], ca.public_bytes(ser.Encoding.PEM))
    _write(paths[1], server.public_bytes(ser.Encoding.PEM))
    _write(paths[2], key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.TraditionalOpenSSL,
                                       ser.NoEncryption()), private=True)


def write_node_keys(folder: Path, names: list[str], force: bool = False) -> None:
    """``NAME.key`` (OpenSSH private key) and ``NAME.pub`` (OpenSSH public key) per name, P-384.
    FileExistsError, before anything is written, where one exists and not ``force``."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    names = [check_node_name(name) for name in names]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"node name {twice[0]!r} given twice: its second key pair would replace the first")
    _refuse_existing([folder / f"{name}.{ext}" for name in names for ext in ("key", "pub")], force)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        key = ec.generate_private_key(ec.SECP384R1())
        _write(folder / f"{name}.key", key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                                          ser.NoEncryption()), private=True)
        _write(folder / f"{name}.pub", key.public_key().public_bytes(ser.Encoding.OpenSSH,
                                                                     ser.PublicFormat.OpenSSH) + b"\n")


def _refuse_existing(paths: list[Path], force: bool) -> None:
    if force:
        return
    for path in paths:
        if os.path.lexists(path):  # a link, even a broken one, is something there already
            raise FileExistsError(f"{path} exists already (a live deployment's?); give --force to replace it")


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write ``path`` atomically; a private key is readable by its owner only, from its creation on (its
    temporary file is created so: never world-readable, even briefly)."""
    def write(tmp: Path) -> None:
        tmp.unlink(missing_ok=True)  # a killed writer's, with this PID
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    atomic_write(path, write)


def _argument(check):
    """An argparse type from a ``check_*`` function: its ValueError becomes argparse's one-line error."""
    def parse(text: str):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = check.__name__.removeprefix("check_")
    return parse


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None
    return check_days(days)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m federated.flower.tls", description="Certificates and SuperNode keys for "
                    "an authenticated Flower deployment. Files that exist already are never replaced "
                    "without --force.")
    sub = parser.add_subparsers(dest="what", required=True)
    certs = sub.add_parser(
        "certs", help="a CA and the SuperLink's certificate: ca.pem, server.pem, server.key",
        description="A self-signed CA (ca.pem; its key is not kept) and the SuperLink's certificate and "
                    "private key signed by it (server.pem, server.key).")
    certs.add_argument("folder", type=Path, help="where they are written (made if missing)")
    certs.add_argument("--host", action="append", required=True, type=_argument(check_host),
                       help="a DNS name or IP address the nodes reach the SuperLink at, without a port "
                            "(repeatable: the certificate holds them all)")
    certs.add_argument("--days", type=_argument(_days), default=DAYS,
                       help=f"validity in days, 1 to {MAX_DAYS} (default {DAYS})")
    certs.add_argument("--force", action="store_true",
                       help="replace ca.pem, server.pem and server.key where they exist (by default it "
                            "refuses, naming the file): a live deployment's CA and server key are "
                            "replaced, and its SuperLink, SuperNodes and flwr must all move to the new files")
    keys = sub.add_parser(
        "keys", help="one SuperNode key pair per name: NAME.key, NAME.pub",
        description="One P-384 key pair per SuperNode: NAME.key (OpenSSH private key, for flower-supernode "
                    "--auth-supernode-private-key) and NAME.pub (for flwr supernode register).")
    keys.add_argument("folder", type=Path, help="where they are written (made if missing)")
    keys.add_argument("names", nargs="+", metavar="NAME", type=_argument(check_node_name),
                      help="one name per SuperNode: letters, digits, '-', '_' and '.', not starting with '.'")
    keys.add_argument("--force", action="store_true",
                      help="replace NAME.key and NAME.pub where they exist (by default it refuses, naming "
                           "the file): a live node's key is replaced, and the node cannot connect until "
                           "the new NAME.pub is registered")

    def run(args) -> int:
        if args.folder.exists() and not args.folder.is_dir():
            raise UsageError(f"{args.folder} is a file, not a folder")
        if args.what == "certs":
            write_certificates(args.folder, args.host, args.days, args.force)
        else:
            twice = sorted({name for name in args.names if args.names.count(name) > 1})
            if twice:
                raise UsageError(f"node name {twice[0]!r} given twice: its second key pair would replace the "
                                 f"first")
            write_node_keys(args.folder, args.names, args.force)
        return 0

    parser.set_defaults(run=run)
    return run_main("python -m federated.flower.tls", parser, argv, (UsageError, OSError))


if __name__ == "__main__":
    sys.exit(main())
