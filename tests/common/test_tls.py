"""TLS and mTLS on real gRPC servers with material from `lac keys tls`."""

import asyncio

import grpc
import pytest

from lac.common import health, tls
from lac.common.cli import main as lac_main
from lac.common.server import finish_server, new_server


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    with pytest.raises(SystemExit) as exc:
        lac_main(["keys", "tls", "--dir", str(d), "--name", "server", "--name", "alice"])
    assert exc.value.code == 0
    other = tmp_path_factory.mktemp("other-ca")
    tls.make_ca(other)
    tls.issue(other, "mallory", ["localhost", "127.0.0.1"])
    return d, other


def check(port, client: tls.ClientTls | None) -> bool:
    return health.check(f"localhost:{port}", client, timeout=5)


def serve(server_tls, body):
    async def run():
        server, port = finish_server(new_server(), [], "127.0.0.1", 0, server_tls)
        await server.start()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, body, port)
        finally:
            await server.stop(None)

    return asyncio.run(run())


def test_tls_server_verified_by_ca(material):
    d, other = material
    server_tls = tls.server_tls(str(d / "server.pem"), str(d / "server.key"))

    def body(port):
        assert check(port, tls.client_tls(str(d / "ca.pem")))
        for wrong in (tls.client_tls(str(other / "ca.pem")), None):  # untrusted CA; plaintext
            with pytest.raises(grpc.RpcError) as exc:
                check(port, wrong)
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE

    serve(server_tls, body)


def test_mutual_tls_requires_a_client_certificate_from_our_ca(material):
    d, other = material
    server_tls = tls.server_tls(str(d / "server.pem"), str(d / "server.key"), client_ca=str(d / "ca.pem"))

    def body(port):
        ca = str(d / "ca.pem")
        assert check(port, tls.client_tls(ca, str(d / "alice.pem"), str(d / "alice.key")))
        for client in (tls.client_tls(ca), tls.client_tls(ca, str(other / "mallory.pem"), str(other / "mallory.key"))):
            with pytest.raises(grpc.RpcError) as exc:
                check(port, client)
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE

    serve(server_tls, body)


def test_insecure_needs_an_explicit_flag(material, caplog):
    d, _ = material
    with pytest.raises(ValueError, match="lac keys tls"):
        tls.server_tls("", "")
    with pytest.raises(ValueError, match="choose one"):
        tls.server_tls(str(d / "server.pem"), str(d / "server.key"), insecure=True)
    with pytest.raises(ValueError, match="CA"):
        tls.client_tls("")
    with pytest.raises(ValueError, match="both"):
        tls.client_tls(str(d / "ca.pem"), cert=str(d / "alice.pem"))
    assert tls.server_tls("", "", insecure=True) is None
    assert "INSECURE MODE" in caplog.text
