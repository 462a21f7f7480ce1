"""One server per port (``lac.common.server``): gRPC's SO_REUSEPORT is off, and a port another server
listens on is refused in one line naming it, before gRPC tries to bind."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from lac.common.server import PortUnavailable, finish_server, new_server


def test_a_taken_port_is_refused_whoever_holds_it():
    async def main():
        first, port = finish_server(new_server(), ["lac.v1.Test"], "127.0.0.1", 0)
        await first.start()
        other = grpc.aio.server()  # gRPC's defaults: SO_REUSEPORT on
        other_port = other.add_insecure_port("127.0.0.1:0")
        await other.start()
        try:
            for taken in (port, other_port):
                with pytest.raises(PortUnavailable, match=rf"^port {taken} on 127\.0\.0\.1 is already in use"):
                    finish_server(new_server(), ["lac.v1.Test"], "127.0.0.1", taken)
                with pytest.raises(PortUnavailable, match=f"port {taken} on 0.0.0.0 is already in use"):
                    finish_server(new_server(), ["lac.v1.Test"], "0.0.0.0", taken)
        finally:
            await first.stop(0)
            await other.stop(0)
        again, same = finish_server(new_server(), ["lac.v1.Test"], "127.0.0.1", port)  # free again
        assert same == port
        await again.stop(0)

    asyncio.run(main())


def test_so_reuseport_is_off():
    """Without the pre-check, gRPC itself refuses to share the port with a server that would share it."""

    async def main():
        first = grpc.aio.server()  # gRPC's defaults: SO_REUSEPORT on
        port = first.add_insecure_port("127.0.0.1:0")
        await first.start()
        try:
            with pytest.raises(RuntimeError, match="Failed to bind"):
                new_server().add_insecure_port(f"127.0.0.1:{port}")
        finally:
            await first.stop(0)

    asyncio.run(main())
