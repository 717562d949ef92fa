"""Address pinning keeps TLS verification on the real host name.

The download connects to the address it checked, not to the name, so this
proves with a real TLS server that such a connection still verifies the
certificate against the name from the URL (and fails for any other name).
Full downloads over https cannot run here: the server is on loopback, which
the policy refuses for https by design.
"""
from __future__ import annotations

import datetime
import ssl

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from app.download import pinned_request


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA and a server certificate for files.test signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("test ca")).issuer_name(_name("test ca"))
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("files.test")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("files.test")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory = tmp_path_factory.mktemp("pki")
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    trust = ssl.create_default_context(cadata=ca.public_bytes(serialization.Encoding.PEM).decode())
    return {"cert": str(directory / "cert.pem"), "key": str(directory / "key.pem"), "trust": trust}


async def _echo_host(request):
    return PlainTextResponse(request.headers.get("host", ""))


@pytest.fixture
async def tls_server(serve_app, pki):
    app = Starlette(routes=[Route("/host", _echo_host)])
    return await serve_app(app, ssl_certfile=pki["cert"], ssl_keyfile=pki["key"])


async def test_pinned_connection_verifies_the_certificate_against_the_url_host(tls_server, pki):
    async with httpx.AsyncClient(verify=pki["trust"], trust_env=False) as client:
        url = httpx.URL(f"https://files.test:{tls_server.port}/host")
        response = await client.send(pinned_request(client, url, "127.0.0.1"))
    assert response.status_code == 200
    assert response.text == f"files.test:{tls_server.port}"


async def test_pinned_connection_fails_for_a_name_the_certificate_does_not_cover(tls_server, pki):
    async with httpx.AsyncClient(verify=pki["trust"], trust_env=False) as client:
        url = httpx.URL(f"https://other.test:{tls_server.port}/host")
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            await client.send(pinned_request(client, url, "127.0.0.1"))
    assert tls_server.requests == 0
