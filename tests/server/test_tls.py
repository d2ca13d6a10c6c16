"""HTTPS: `gpupool up --tls-cert/--tls-key` on a private CA; the CLI verifies it (GPUPOOL_CA_BUNDLE),
refuses it untrusted in one sentence, and plain HTTP to it fails; the flags' mistakes are one sentence."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from upproc import UpProcess, cli

from gpupool.errors import InvalidInput
from gpupool.server.settings import Settings, is_loopback

x509 = pytest.importorskip("cryptography.x509", reason="the dev extra's cryptography makes the test CA")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_pki(folder: Path) -> Pki:
    """A private CA and a server certificate it signed, for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name("gpupool test CA")).issuer_name(_name("gpupool test CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, encipher_only=False,
                                     decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(ca=folder / "ca.pem", cert=folder / "server.pem", key=folder / "server.key")
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pki.key.chmod(0o600)
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def https_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[UpProcess]:
    server = UpProcess(tmp_path_factory.mktemp("tls") / "data",
                       ["--simulate", "1x2xH100", "--provider", "fake", "--tls-cert", str(pki.cert),
                        "--tls-key", str(pki.key)],
                       verify=ssl.create_default_context(cafile=str(pki.ca)))
    try:
        yield server.start()
    finally:
        server.stop()


def _env(server: UpProcess, **extra: str) -> dict[str, str]:
    return {"GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token(),
            "XDG_CONFIG_HOME": str(server.data_dir.parent / "no-config"), **extra}


def test_the_cli_works_over_https_with_the_private_ca(https_server: UpProcess, pki: Pki) -> None:
    env = _env(https_server, GPUPOOL_CA_BUNDLE=str(pki.ca))
    submitted = cli(["submit", "--", "true"], env)
    assert submitted.returncode == 0, submitted.stderr
    workload_id = submitted.stdout.strip()
    shown = cli(["show", workload_id, "--json"], env)
    assert shown.returncode == 0, shown.stderr
    assert workload_id in shown.stdout
    assert "gpupool is serving on https://127.0.0.1:" in https_server.log_text()


def test_the_ca_bundle_may_come_from_the_config_file(https_server: UpProcess, pki: Pki,
                                                     tmp_path: Path) -> None:
    config = tmp_path / "gpupool" / "config.toml"
    config.parent.mkdir()
    config.write_text(f'url = "{https_server.url}"\ntoken = "{https_server.token()}"\n'
                      f'ca_bundle = "{pki.ca}"\n')
    listed = cli(["ls"], {"XDG_CONFIG_HOME": str(tmp_path)})
    assert listed.returncode == 0, listed.stderr


@pytest.mark.parametrize("verb", [["ls"], ["submit", "--", "true"]])
def test_an_untrusted_certificate_is_one_sentence_naming_the_fix(https_server: UpProcess,
                                                                  verb: list[str]) -> None:
    refused = cli(verb, _env(https_server))
    assert refused.returncode == 4
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "does not trust" in lines[0] and "GPUPOOL_CA_BUNDLE" in lines[0]
    assert "Traceback" not in refused.stderr


def test_the_system_trust_follows_ssl_cert_file_though_its_context_is_built_once(
        https_server: UpProcess, pki: Pki) -> None:
    """The SDK builds httpx's default context once per SSL_CERT_FILE/SSL_CERT_DIR (client._verify):
    trusted with the private CA named there, refused again once it is not."""
    from gpupool.client import _verify

    assert isinstance(_verify("http://127.0.0.1:1"), ssl.SSLContext)
    assert _verify("http://127.0.0.1:1") is _verify("https://127.0.0.1:2")  # one context, not one a client
    trusted = cli(["ls"], _env(https_server, SSL_CERT_FILE=str(pki.ca)))
    assert trusted.returncode == 0, trusted.stderr
    refused = cli(["ls"], _env(https_server))
    assert refused.returncode == 4 and "does not trust" in refused.stderr, refused.stderr


def test_a_missing_ca_bundle_file_is_named(https_server: UpProcess, tmp_path: Path) -> None:
    refused = cli(["ls"], _env(https_server, GPUPOOL_CA_BUNDLE=str(tmp_path / "nope.pem")))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "nope.pem" in refused.stderr


def test_plain_http_to_the_https_server_fails(https_server: UpProcess) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{https_server.port}/api/v1/health", timeout=10)
    refused = cli(["ls"], _env(https_server, GPUPOOL_URL=f"http://127.0.0.1:{https_server.port}"))
    assert refused.returncode == 4
    assert refused.stderr.count("\n") == 1 and "https://" in refused.stderr, refused.stderr


def test_tls_flags_go_together(tmp_path: Path, pki: Pki) -> None:
    alone = cli(["up", "--data-dir", str(tmp_path / "d"), "--tls-cert", str(pki.cert)], {})
    assert alone.returncode == 2
    assert alone.stderr.strip() == (
        "Error: --tls-cert and --tls-key go together; give both (HTTPS) or neither (HTTP).")


def test_an_unreadable_tls_file_is_named(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(InvalidInput, match=r"--tls-key file .*missing\.key"):
        Settings(tls_cert=pki.cert, tls_key=tmp_path / "missing.key")
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not a key\n")
    mismatched = cli(["up", "--data-dir", str(tmp_path / "d"), "--tls-cert", str(pki.cert),
                      "--tls-key", str(wrong)], {})
    assert mismatched.returncode == 2
    assert mismatched.stderr.count("\n") == 1 and "wrong.key" in mismatched.stderr


def test_a_non_loopback_host_without_tls_warns_that_tokens_travel_in_clear(tmp_path: Path, pki: Pki) -> None:
    # 192.0.2.1 (TEST-NET-1) is never this machine's: the warning comes first, then binding fails.
    clear = cli(["up", "--data-dir", str(tmp_path / "d"), "--host", "192.0.2.1"], {})
    warnings = [line for line in clear.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "tokens travel in clear" in warnings[0]
    assert clear.returncode == 2 and "Cannot listen on 192.0.2.1" in clear.stderr
    secured = cli(["up", "--data-dir", str(tmp_path / "d"), "--host", "192.0.2.1",
                   "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)], {})
    assert "Warning:" not in secured.stderr and secured.returncode == 2


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.0.2.1", "pool.example"))
