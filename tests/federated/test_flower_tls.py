"""``python -m federated.flower.tls`` (issue 42): it never silently replaces a live deployment's keys, never
writes outside its folder, never leaves half a key, and bad input is one line with exit code 2. The keys it
makes serve a real deployment in the slow loopback tests (tests/federated/test_flower_deploy.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="Flower is not installed (pip install -e '.[flower]')")

from cryptography import x509  # noqa: E402

from federated.flower import tls  # noqa: E402
from fpsfl.base.files import CRASH_ENV, LOG_ENV  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CERTS = ("ca.pem", "server.pem", "server.key")


def _cli(args, capsys):
    code = tls.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.err


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_certs_run_again_refuses_naming_the_file_and_force_replaces_them(tmp_path, capsys):
    folder = tmp_path / "tls"
    assert _cli(["certs", folder, "--host", "127.0.0.1"], capsys) == (0, "")
    before = _contents(folder)
    assert sorted(before) == sorted(CERTS) and _private(folder / "server.key")
    code, err = _cli(["certs", folder, "--host", "127.0.0.1"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{folder / 'ca.pem'} exists already" in err and "--force" in err
    assert _contents(folder) == before  # the live deployment's CA and server key are untouched
    (folder / "ca.pem").unlink()  # any one of the three is refused
    code, err = _cli(["certs", folder, "--host", "127.0.0.1"], capsys)
    assert code == 2 and f"{folder / 'server.pem'} exists already" in err, err
    assert not (folder / "ca.pem").exists()
    assert _cli(["certs", folder, "--host", "127.0.0.1", "--force"], capsys) == (0, "")
    after = _contents(folder)
    assert sorted(after) == sorted(CERTS) and all(after[n] != before[n] for n in CERTS[1:])
    assert _private(folder / "server.key")


def test_keys_run_again_refuse_before_writing_any_and_force_replaces_them(tmp_path, capsys):
    folder = tmp_path / "keys"
    assert _cli(["keys", folder, "node-0"], capsys) == (0, "")
    before = _contents(folder)
    assert sorted(before) == ["node-0.key", "node-0.pub"] and _private(folder / "node-0.key")
    code, err = _cli(["keys", folder, "node-1", "node-0"], capsys)
    assert code == 2 and err.count("\n") == 1 and f"{folder / 'node-0.key'} exists already" in err, err
    assert _contents(folder) == before  # node-1's pair was not written either: all or nothing is checked
    (folder / "node-0.key").unlink()
    (folder / "node-0.pub").unlink()
    (folder / "node-0.pub").symlink_to(tmp_path / "nowhere")  # a broken link is something there too
    code, err = _cli(["keys", folder, "node-0"], capsys)
    assert code == 2 and f"{folder / 'node-0.pub'} exists already" in err, err
    assert _cli(["keys", folder, "node-0", "node-1", "--force"], capsys) == (0, "")
    after = _contents(folder)
    assert sorted(after) == ["node-0.key", "node-0.pub", "node-1.key", "node-1.pub"]
    assert not (folder / "node-0.pub").is_symlink() and not (tmp_path / "nowhere").exists()
    assert _private(folder / "node-0.key") and _private(folder / "node-1.key")
    assert after["node-0.pub"].startswith(b"ecdsa-sha2-nistp384 ")


def test_a_crash_while_forcing_leaves_the_old_key_or_the_new_one_never_half(tmp_path, capsys):
    """Killed (the files hook, FPSFL_TEST_CRASH) once the new server.key is written in full but before it
    is renamed: server.key is still the old one, and the new one lay in a temporary file readable by its
    owner only."""
    folder = tmp_path / "tls"
    assert _cli(["certs", folder, "--host", "localhost"], capsys) == (0, "")
    old = _contents(folder)
    log = tmp_path / "io.jsonl"
    env = {**os.environ, CRASH_ENV: "tmp:3", LOG_ENV: str(log), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "federated.flower.tls", "certs", str(folder), "--host",
                           "localhost", "--force"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -9, done.stderr[-2000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events == [["tmp", str(folder / "ca.pem")], ["replace", str(folder / "ca.pem")],
                      ["tmp", str(folder / "server.pem")], ["replace", str(folder / "server.pem")],
                      ["tmp", str(folder / "server.key")]], events
    assert (folder / "server.key").read_bytes() == old["server.key"] and _private(folder / "server.key")
    [left] = folder.glob(".server.key.tmp*")  # what fpsfl.base.files.clean_stale removes
    assert _private(left) and left.read_bytes() != old["server.key"]


@pytest.mark.parametrize("name", ["../escaped", "sub/node", "/abs/node", "..", ".hidden", "", "a\\b",
                                  "nodé", "x" * 201])
def test_a_node_name_is_a_plain_file_name(tmp_path, capsys, name):
    folder = tmp_path / "keys"
    code, err = _cli(["keys", folder, "node-0", name], capsys)
    assert code == 2 and err.count("\n") == 1 and "a node name is letters, digits" in err, err
    assert not list(tmp_path.iterdir())  # nothing written, in the folder or beside it
    with pytest.raises(ValueError, match="a node name"):
        tls.write_node_keys(folder, [name])
    assert not folder.exists()


def test_plain_node_names_are_taken_and_a_name_given_twice_is_refused(tmp_path, capsys):
    folder = tmp_path / "keys"
    names = ["node-0", "Node_1", "n.2", "3", "-dash", "y" * 200]
    assert _cli(["keys", folder, "--", *names], capsys) == (0, "")
    made = sorted(p.name for p in folder.iterdir())
    assert made == sorted(f"{n}.{ext}" for n in names for ext in ("key", "pub"))
    code, err = _cli(["keys", tmp_path / "twice", "a", "b", "a"], capsys)
    assert code == 2 and err.count("\n") == 1 and "'a' given twice" in err, err
    assert not (tmp_path / "twice").exists()


@pytest.mark.parametrize("args, message", [
    (["--host", ""], "a host must not be empty"),
    (["--host", " "], "a host must not be empty"),
    (["--host", "a", "--host", ""], "a host must not be empty"),
    (["--host", "a:9093"], "expected a DNS name"),
    (["--host", "1.2.3.400"], "expected a DNS name"),
    (["--host=-a.example"], "expected a DNS name"),
    (["--host", "a-.example"], "expected a DNS name"),
    (["--host", "1.2.3.4.5"], "expected a DNS name"),
    (["--host", "a..b"], "expected a DNS name"),
    (["--host", "x" * 64], "expected a DNS name"),
    (["--host", "under_score.example"], "expected a DNS name"),
    (["--host", "héllo.example"], "expected a DNS name"),
    (["--host", "fe80::1%eth0"], "zone"),
    (["--host", "a", "--days", "100000000"], "validity must be 1 to 36500 days, got 100000000"),
    (["--host", "a", "--days", "36501"], "validity must be 1 to 36500 days"),
    (["--host", "a", "--days", "0"], "validity must be 1 to 36500 days"),
    (["--host", "a", "--days", "-5"], "validity must be 1 to 36500 days"),
    (["--host", "a", "--days", "1e3"], "expected an integer"),
    ([], "--host"),
])
def test_bad_certs_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    code, err = _cli(["certs", tmp_path / "tls", *args], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "tls").exists()


def test_bad_input_to_the_functions_is_refused_before_any_file(tmp_path):
    with pytest.raises(ValueError, match="must not be empty"):
        tls.write_certificates(tmp_path / "a", [""])
    with pytest.raises(ValueError, match="36500"):
        tls.write_certificates(tmp_path / "a", ["localhost"], days=100_000_000)
    assert not (tmp_path / "a").exists()


def test_the_certificate_holds_every_host_for_the_days_asked(tmp_path, capsys):
    long = "a" * 60 + ".example.org"  # a valid DNS name too long for X.509's common name (64)
    hosts = [long, "127.0.0.1", "::1", "localhost", "node.example."]
    args = [a for h in hosts for a in ("--host", h)]
    assert _cli(["certs", tmp_path, *args, "--days", "36500"], capsys) == (0, "")
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [long, "localhost", "node.example."]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert (server.not_valid_after_utc - server.not_valid_before_utc).days == 36500


@pytest.mark.parametrize("what, explained", [
    ("certs", ["folder where", "--host HOST a DNS name or IP address", "--days DAYS validity in days, 1 to",
               "1 to 36500 (default 30)", "--force replace ca.pem, server.pem and server.key",
               "by default it refuses", "live deployment's"]),
    ("keys", ["NAME one name per SuperNode: letters, digits", "folder where", "--force replace NAME.key",
              "by default it refuses", "live node's key"]),
])
def test_help_explains_every_flag(capsys, what, explained):
    with pytest.raises(SystemExit):
        tls.main([what, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in explained:
        assert words in text, words
