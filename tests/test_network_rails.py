"""Network rails of web_fetch: the address policy, its resolver, and real
fetches from local aiohttp servers on loopback (refused unless allowed)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from coterie.runtime.config import NetworkSettings, RuntimeSettings, WebSettings
from coterie.runtime.context import TurnSettings
from coterie.runtime.errors import ToolError
from coterie.tools._netpolicy import NetworkPolicy, parse_ip
from coterie.tools._web import PolicyResolver
from coterie.tools.web import WebFetchArgs, network_policy, web_fetch
from tests.helpers import make_ctx

# ---------------------------------------------------------------- the policy (no network)

REFUSED = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "::1": "loopback",
    "169.254.169.254": "link-local",  # cloud metadata
    "fe80::1": "link-local",
    "fe80::1%eth0": "link-local",
    "10.0.0.1": "private",
    "10.255.255.254": "private",
    "172.16.0.1": "private",
    "172.31.255.1": "private",
    "192.168.1.1": "private",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
    "240.0.0.1": "reserved",
    "100.64.0.1": "not globally routable",  # carrier-grade NAT
    # IPv4-mapped IPv6 is judged as the IPv4 address behind it (Python 3.11's
    # ipaddress calls ::ffff:127.0.0.1 neither loopback nor private).
    "::ffff:127.0.0.1": "loopback",
    "::ffff:169.254.169.254": "link-local",
    "::ffff:10.1.2.3": "private",
    "::ffff:192.168.0.1": "private",
}


@pytest.mark.parametrize(("address", "reason"), sorted(REFUSED.items()))
def test_non_public_addresses_refused(address: str, reason: str) -> None:
    ip = parse_ip(address)
    assert ip is not None
    assert NetworkPolicy().refusal(ip) == reason


@pytest.mark.parametrize(
    "address",
    [
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    ],
)
def test_ipv6_carrying_a_refused_ipv4_is_refused(address: str) -> None:
    ip = parse_ip(address)
    assert ip is not None
    assert NetworkPolicy().refusal(ip) is not None


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700::1111", "::ffff:8.8.8.8"]
)
def test_public_addresses_allowed(address: str) -> None:
    ip = parse_ip(address)
    assert ip is not None
    assert NetworkPolicy().refusal(ip) is None


def test_cluster_addresses_refused_even_when_public() -> None:
    policy = NetworkPolicy.build(cluster_addresses=["8.8.8.8", "2606:4700::1111", "not-an-ip"])
    for address in ("8.8.8.8", "::ffff:8.8.8.8", "2606:4700::1111"):
        ip = parse_ip(address)
        assert ip is not None
        assert policy.refusal(ip) == "a node of the Ray cluster"
    assert policy.refusal(ipaddress.ip_address("8.8.4.4")) is None
    with pytest.raises(ToolError) as info:
        policy.check_literal("8.8.8.8", ipaddress.ip_address("8.8.8.8"))
    assert info.value.kind == "network_denied"
    assert "8.8.8.8" in info.value.detail and "cluster" in info.value.detail
    # Listed, a cluster node may be reached.
    allowed = NetworkPolicy.build(allow=["8.8.8.8"], cluster_addresses=["8.8.8.8"])
    assert allowed.refusal(ipaddress.ip_address("8.8.8.8")) is None


def test_allow_list_addresses_and_ranges() -> None:
    policy = NetworkPolicy.build(
        allow=[" 10.1.0.0/16 ", "127.0.0.1", "fc00::/7", "169.254.169.254", "::ffff:192.168.1.5"]
    )

    def ok(address: str) -> bool:
        ip = parse_ip(address)
        assert ip is not None
        return policy.refusal(ip) is None

    assert ok("10.1.2.3") and ok("10.1.255.255") and not ok("10.2.0.1")
    assert ok("127.0.0.1") and ok("::ffff:127.0.0.1") and not ok("127.0.0.2")
    assert ok("fd00::5") and ok("fc00::1") and not ok("fe80::1")
    assert ok("169.254.169.254") and not ok("169.254.0.1")
    assert ok("192.168.1.5") and not ok("192.168.1.6")
    # A CIDR range written with host bits set still means the range.
    loose = NetworkPolicy.build(allow=["10.9.8.7/8"])
    assert loose.refusal(ipaddress.ip_address("10.0.0.1")) is None


def test_host_names_in_the_allow_list() -> None:
    policy = NetworkPolicy.build(allow=["Intranet.Example.", "localhost"])
    assert policy.allows_host("intranet.example") and policy.allows_host("INTRANET.example.")
    assert policy.allows_host("localhost") and not policy.allows_host("other.example")
    # A listed name allows whatever it resolves to; other names are filtered.
    assert policy.filter_resolved("intranet.example", ["10.0.0.5", "127.0.0.1"]) == [
        "10.0.0.5",
        "127.0.0.1",
    ]
    assert policy.filter_resolved("mixed.example", ["10.0.0.5", "8.8.8.8"]) == ["8.8.8.8"]
    with pytest.raises(ToolError) as info:
        policy.filter_resolved("internal.example", ["10.0.0.5", "fd00::1"])
    err = info.value
    assert err.kind == "network_denied"
    assert "internal.example resolves to 10.0.0.5 (private), fd00::1 (private)" in err.detail
    assert "network: allow: [...]" in err.detail and "persona.yaml" in err.detail


def test_refusal_names_host_address_and_remedy() -> None:
    with pytest.raises(ToolError) as info:
        NetworkPolicy().check_literal("169.254.169.254", ipaddress.ip_address("169.254.169.254"))
    detail = info.value.detail
    assert info.value.kind == "network_denied"
    assert detail.startswith("169.254.169.254 is 169.254.169.254 (link-local)")
    assert '`network: {allow: ["169.254.169.254"]}`' in detail


def test_policy_from_the_turn_context() -> None:
    ctx = make_ctx(
        settings=TurnSettings(
            network=NetworkSettings(allow=["10.0.0.0/8", "db.internal"]),
            cluster_addresses=frozenset({"8.8.8.8"}),
        )
    )
    policy = network_policy(ctx)
    assert policy.refusal(ipaddress.ip_address("10.2.3.4")) is None
    assert policy.refusal(ipaddress.ip_address("8.8.8.8")) == "a node of the Ray cluster"
    assert policy.allows_host("db.internal")


# ---------------------------------------------------------------- the resolver


@dataclass
class StaticResolver(AbstractResolver):
    """Answers every name with fixed addresses (a DNS server we control)."""

    addresses: list[str]
    asked: list[str] = field(default_factory=list)
    closed: bool = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for a in self.addresses
        ]

    async def close(self) -> None:
        self.closed = True


async def test_resolver_keeps_only_allowed_addresses() -> None:
    inner = StaticResolver(["127.0.0.1", "93.184.215.14", "169.254.169.254", "2606:4700::1111"])
    resolver = PolicyResolver(NetworkPolicy(), inner)
    got = await resolver.resolve("rebind.example", 443)
    assert [r["host"] for r in got] == ["93.184.215.14", "2606:4700::1111"]
    assert inner.asked == ["rebind.example"]

    only_private = PolicyResolver(NetworkPolicy(), StaticResolver(["10.0.0.1", "::1"]))
    with pytest.raises(ToolError) as info:
        await only_private.resolve("rebind.example", 443)
    assert info.value.kind == "network_denied"
    assert "rebind.example resolves to 10.0.0.1 (private), ::1 (loopback)" in info.value.detail

    named = PolicyResolver(NetworkPolicy.build(allow=["rebind.example"]), StaticResolver(["::1"]))
    assert [r["host"] for r in await named.resolve("rebind.example", 80)] == ["::1"]
    await named.close()
    assert isinstance(named.inner, StaticResolver) and named.inner.closed


# ---------------------------------------------------------------- real fetches


@dataclass
class Server:
    port: int
    hits: list[str]

    def url(self, host: str, path: str = "/page") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    """One app on 127.0.0.1 and 127.0.0.2, same port (Linux routes all of 127/8
    to loopback), so a redirect between the two would succeed if followed."""
    hits: list[str] = []

    async def page(request: web.Request) -> web.Response:
        hits.append(f"{request.host}{request.path}")
        return web.Response(
            text="<html><body><p>hello rails</p></body></html>", content_type="text/html"
        )

    async def to(request: web.Request) -> web.Response:
        hits.append(f"{request.host}{request.path}")
        host = request.match_info["host"]
        raise web.HTTPFound(f"http://{host}:{request.url.port}/page")

    app = web.Application()
    app.router.add_get("/page", page)
    app.router.add_get("/to/{host}", to)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    first = web.TCPSite(runner, "127.0.0.1", 0)
    await first.start()
    port = runner.addresses[0][1]
    await web.TCPSite(runner, "127.0.0.2", port).start()
    try:
        yield Server(port, hits)
    finally:
        await runner.cleanup()


async def fetch(
    url: str, allow: list[str] | None = None, cluster_addresses: frozenset[str] = frozenset()
) -> str:
    ctx = make_ctx(
        settings=TurnSettings(
            runtime=RuntimeSettings(web=WebSettings(fetch_timeout=5, connect_timeout=2)),
            network=NetworkSettings(allow=allow or []),
            cluster_addresses=cluster_addresses,
        )
    )
    result = await web_fetch.fn(WebFetchArgs(url=url), ctx)
    assert isinstance(result, str)
    return result


async def fetch_error(
    url: str, allow: list[str] | None = None, cluster_addresses: frozenset[str] = frozenset()
) -> ToolError:
    with pytest.raises(ToolError) as info:
        await fetch(url, allow, cluster_addresses)
    return info.value


async def test_loopback_refused_by_default(server: Server) -> None:
    err = await fetch_error(server.url("127.0.0.1"))
    assert err.kind == "network_denied"
    assert "127.0.0.1 is 127.0.0.1 (loopback)" in err.detail
    assert "network: allow: [...]" in err.detail and "persona.yaml" in err.detail
    assert server.hits == []  # refused before connecting


@pytest.mark.parametrize(
    ("host", "allow"),
    [
        ("127.0.0.1", ["127.0.0.1"]),
        ("127.0.0.1", ["127.0.0.0/8"]),
        ("localhost", ["localhost"]),
        ("localhost", ["127.0.0.1"]),  # what the name resolves to is listed
    ],
)
async def test_allow_list_reaches_loopback(server: Server, host: str, allow: list[str]) -> None:
    out = await fetch(server.url(host), allow)
    assert "hello rails" in out
    assert server.hits == [f"{host}:{server.port}/page"]


async def test_host_name_resolving_to_loopback_refused(server: Server) -> None:
    err = await fetch_error(server.url("localhost"))
    assert err.kind == "network_denied"
    assert "localhost resolves to 127.0.0.1 (loopback)" in err.detail
    assert '["localhost"]' in err.detail
    assert server.hits == []
    # A listed name that is not this one does not help.
    err = await fetch_error(server.url("localhost"), ["example.org"])
    assert err.kind == "network_denied"


async def test_ipv4_mapped_literal_refused(server: Server) -> None:
    err = await fetch_error(server.url("[::ffff:127.0.0.1]"))
    assert err.kind == "network_denied" and "(loopback)" in err.detail
    assert server.hits == []


async def test_legacy_numeric_host_refused(server: Server) -> None:
    # 2130706433 is 127.0.0.1 to the C library; aiohttp would skip the resolver.
    err = await fetch_error(f"http://2130706433:{server.port}/page")
    assert err.kind in ("invalid_url", "network_denied")
    assert server.hits == []


async def test_redirect_to_refused_address_not_followed(server: Server) -> None:
    err = await fetch_error(server.url("127.0.0.1", "/to/127.0.0.2"), ["127.0.0.1"])
    assert err.kind == "network_denied" and "127.0.0.2 is 127.0.0.2 (loopback)" in err.detail
    assert server.hits == [f"127.0.0.1:{server.port}/to/127.0.0.2"]
    # The target is there: allowed, the same redirect is followed.
    server.hits.clear()
    out = await fetch(server.url("127.0.0.1", "/to/127.0.0.2"), ["127.0.0.0/8"])
    assert "hello rails" in out and f"Redirected from {server.url('127.0.0.1', '/to/')}" in out
    assert server.hits[-1] == f"127.0.0.2:{server.port}/page"


async def test_redirect_to_host_name_checked_when_it_resolves(server: Server) -> None:
    # Allowed 127.0.0.2 redirects to localhost, which resolves to 127.0.0.1.
    err = await fetch_error(server.url("127.0.0.2", "/to/localhost"), ["127.0.0.2"])
    assert err.kind == "network_denied"
    assert "localhost resolves to 127.0.0.1 (loopback)" in err.detail
    assert server.hits == [f"127.0.0.2:{server.port}/to/localhost"]


async def test_cloud_metadata_and_cluster_nodes_refused_without_connecting() -> None:
    # Literal addresses are refused before any connection: no network needed.
    err = await fetch_error("http://169.254.169.254/latest/meta-data/")
    assert err.kind == "network_denied" and "(link-local)" in err.detail
    err = await fetch_error("http://[fd00:ec2::254]/latest/meta-data/")
    assert err.kind == "network_denied" and "(private)" in err.detail
    err = await fetch_error("http://8.8.8.8/", cluster_addresses=frozenset({"8.8.8.8"}))
    assert err.kind == "network_denied" and "a node of the Ray cluster" in err.detail
