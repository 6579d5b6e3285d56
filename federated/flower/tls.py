"""Certificates and keys for an authenticated Flower deployment (recipes/flower_deploy.sh; Flower's guides
"Enable TLS connections" and "Authenticate SuperNodes").

- ``certs FOLDER --host H ...``: a self-signed certificate authority (``ca.pem``) and the SuperLink's
  certificate signed by it for the hosts and IP addresses the nodes dial (``server.pem``, ``server.key``).
  The SuperLink serves TLS with them (``--ssl-ca-certfile ca.pem --ssl-certfile server.pem --ssl-keyfile
  server.key``); SuperNodes and ``flwr`` trust ``ca.pem`` (``--root-certificates``, ``root-certificates``).
  The authority's own key is not kept: nothing else can be signed with it.
- ``keys FOLDER NAME ...``: one P-384 key pair per SuperNode (``NAME.key``, OpenSSH private key, for
  ``flower-supernode --auth-supernode-private-key``; ``NAME.pub`` for ``flwr supernode register``, which
  a SuperLink started with ``--enable-supernode-auth`` needs before that node may connect).

Private keys are written readable by their owner only. Self-signed certificates suit a lab's own machines;
across organisations, use certificates from an authority the parties already trust.

Usage: ``python -m federated.flower.tls certs FOLDER --host 127.0.0.1`` and
``python -m federated.flower.tls keys FOLDER node-0 node-1``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys
from pathlib import Path

from fpsfl.base.cli import Parser, UsageError, run_main

DAYS = 30  # validity of the certificates made here (a deployment's lifetime, not a CA's)


def write_certificates(folder: Path, hosts: list[str], days: int = DAYS) -> None:
    """``ca.pem``, ``server.pem`` and ``server.key`` in ``folder`` for a SuperLink reached at ``hosts``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fpsfl deployment CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names = [_san(host) for host in hosts]
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(ser.Encoding.PEM))
    (folder / "server.pem").write_bytes(server.public_bytes(ser.Encoding.PEM))
    _private(folder / "server.key", key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.TraditionalOpenSSL,
                                                       ser.NoEncryption()))


def write_node_keys(folder: Path, names: list[str]) -> None:
    """``NAME.key`` (OpenSSH private key) and ``NAME.pub`` (OpenSSH public key) per name, P-384."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        key = ec.generate_private_key(ec.SECP384R1())
        _private(folder / f"{name}.key", key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                                             ser.NoEncryption()))
        (folder / f"{name}.pub").write_bytes(key.public_key().public_bytes(ser.Encoding.OpenSSH,
                                                                           ser.PublicFormat.OpenSSH) + b"\n")


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only (created so: never world-readable, even briefly)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m federated.flower.tls", description="Certificates and SuperNode keys for "
                                                                        "an authenticated Flower deployment.")
    sub = parser.add_subparsers(dest="what", required=True)
    certs = sub.add_parser("certs", help="a CA and the SuperLink's certificate (ca.pem, server.pem, .key)")
    certs.add_argument("folder", type=Path, help="where they are written")
    certs.add_argument("--host", action="append", required=True,
                       help="a host name or IP address the nodes reach the SuperLink at (repeatable)")
    certs.add_argument("--days", type=int, default=DAYS, help=f"validity in days (default {DAYS})")
    keys = sub.add_parser("keys", help="one SuperNode key pair per name: NAME.key, NAME.pub")
    keys.add_argument("folder", type=Path, help="where they are written")
    keys.add_argument("names", nargs="+", help="one name per SuperNode")

    def run(args) -> int:
        if args.folder.exists() and not args.folder.is_dir():
            raise UsageError(f"{args.folder} is a file, not a folder")
        if args.what == "certs":
            if args.days < 1:
                raise UsageError(f"--days must be at least 1, got {args.days}")
            write_certificates(args.folder, args.host, args.days)
        else:
            write_node_keys(args.folder, args.names)
        return 0

    parser.set_defaults(run=run)
    return run_main("python -m federated.flower.tls", parser, argv, (UsageError, OSError))


if __name__ == "__main__":
    sys.exit(main())
