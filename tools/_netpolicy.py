"""Which network addresses a persona's web tools may reach.

Public addresses only, by default: loopback, link-local (cloud metadata at
169.254.169.254 included), private, shared, multicast, reserved and other
non-global ranges are refused, and so are the Ray cluster's own node
addresses even where they look public. The persona's ``network: allow:``
list (:class:`runtime.config.NetworkSettings`) lifts the refusal for IP
addresses, CIDR ranges and host names; a listed host name allows whatever it
resolves to.

Pure :mod:`ipaddress` work, no I/O: :mod:`tools._web` asks it about every
literal IP it is about to connect to and about every address a host name
resolves to (see its resolver), so the address checked is the address used.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coterie.runtime.errors import ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# NAT64 (RFC 6052): the low 32 bits are an IPv4 address a gateway connects to.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHOWN = 4  # refused addresses named in one message
ALLOW_HINT = "network: allow: [...]"


def parse_ip(text: str) -> IPAddress | None:
    """``text`` as an IP address (brackets and an IPv6 zone allowed), else None."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address behind an IPv4-mapped IPv6 one (``::ffff:a.b.c.d``),
    without an IPv6 zone; any other address as it is."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id is not None:
            return ipaddress.IPv6Address(str(address).split("%", 1)[0])
    return address


def _embedded(address: IPAddress) -> list[IPAddress]:
    """IPv4 addresses an IPv6 address carries to a gateway (6to4, NAT64)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    inner: list[IPAddress] = []
    if address.sixtofour is not None:
        inner.append(address.sixtofour)
    if address in _NAT64:
        inner.append(ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF))
    return inner


def non_public_reason(address: IPAddress) -> str | None:
    """Why ``address`` (already unwrapped) is not a public address, or None."""
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "site-local"
    if address.is_reserved:  # before private: Python files 240.0.0.0/4 under both
        return "reserved"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "not globally routable"
    return None


def _host_key(host: str) -> str:
    """A host name as compared with the allow list: lower case, no final dot,
    international names in their ASCII (IDNA) form as URLs carry them."""
    name = host.strip().rstrip(".").lower()
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        return name


@dataclass(frozen=True)
class Denied:
    """One address refused, and why."""

    address: str
    reason: str


@dataclass(frozen=True)
class NetworkPolicy:
    """What a persona's web tools may connect to (see the module docstring).

    Build one with :meth:`build` from ``ctx.settings.network.allow`` and
    ``ctx.settings.cluster_addresses``.
    """

    allow_networks: tuple[IPNetwork, ...] = ()
    allow_hosts: frozenset[str] = frozenset()
    cluster: frozenset[IPAddress] = frozenset()

    @classmethod
    def build(
        cls, *, allow: Iterable[str] = (), cluster_addresses: Iterable[str] = ()
    ) -> NetworkPolicy:
        """Entries of ``allow`` that parse as an address or a CIDR range
        allow those addresses; any other entry is a host name. Cluster
        addresses that are not IP addresses are ignored."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for raw in allow:
            entry = raw.strip()
            if not entry:
                continue
            single = parse_ip(entry)
            if single is not None:
                networks.append(ipaddress.ip_network(unwrap(single)))
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(_host_key(entry))
        cluster = {unwrap(a) for a in map(parse_ip, cluster_addresses) if a is not None}
        return cls(tuple(networks), frozenset(hosts), frozenset(cluster))

    def allows_host(self, host: str) -> bool:
        """Whether ``host`` is a host name the allow list names."""
        return _host_key(host) in self.allow_hosts

    def _listed(self, address: IPAddress) -> bool:
        return any(
            a.version == net.version and a in net
            for net in self.allow_networks
            for a in (address, unwrap(address))
        )

    def refusal(self, address: IPAddress) -> str | None:
        """Why ``address`` may not be reached, or None when it may. The allow
        list's addresses and ranges are checked here; its host names are the
        caller's business (see :meth:`allows_host`)."""
        if self._listed(address):
            return None
        plain = unwrap(address)
        if plain in self.cluster:
            return "a node of the Ray cluster"
        reason = non_public_reason(plain)
        if reason is not None:
            return reason
        for inner in _embedded(plain):
            reason = non_public_reason(inner)
            if reason is not None or inner in self.cluster:
                return f"carries the {reason or 'cluster'} address {inner}"
        return None

    def check_literal(self, host: str, address: IPAddress) -> None:
        """Raise ``network_denied`` unless the URL host ``host``, the IP
        address ``address``, may be reached."""
        reason = self.refusal(address)
        if reason is not None:
            raise denied(host, [Denied(str(address), reason)])

    def filter_resolved(self, host: str, addresses: Sequence[str]) -> list[str]:
        """The addresses ``host`` resolved to that may be reached, in order;
        ``network_denied`` when none may. All of them when the allow list
        names ``host``. Unparsable addresses are dropped."""
        if self.allows_host(host):
            return list(addresses)
        kept: list[str] = []
        refused: list[Denied] = []
        for text in addresses:
            address = parse_ip(text)
            if address is None:
                refused.append(Denied(text, "not an IP address"))
                continue
            reason = self.refusal(address)
            if reason is None:
                kept.append(text)
            else:
                refused.append(Denied(text, reason))
        if not kept:
            raise denied(host, refused)
        return kept


def denied(host: str, refused: Sequence[Denied]) -> ToolError:
    """The ``network_denied`` error naming ``host``, what it came to and how to allow it."""
    shown = ", ".join(f"{d.address} ({d.reason})" for d in refused[:_SHOWN])
    if len(refused) > _SHOWN:
        shown += f" and {len(refused) - _SHOWN} more"
    if not refused:
        shown = "no address"
    literal = parse_ip(host) is not None
    what = f"{host} is {shown}" if literal else f"{host} resolves to {shown}"
    entry = refused[0].address if refused and literal else host
    return ToolError(
        "network_denied",
        f"{what}: this persona may reach public addresses only (not loopback, private, "
        f"link-local or the cluster's nodes). To allow it, list it under "
        f'`{ALLOW_HINT}` in persona.yaml, e.g. `network: {{allow: ["{entry}"]}}` '
        "(an IP address, a CIDR range or a host name).",
    )


__all__ = [
    "ALLOW_HINT",
    "Denied",
    "IPAddress",
    "NetworkPolicy",
    "denied",
    "non_public_reason",
    "parse_ip",
    "unwrap",
]
