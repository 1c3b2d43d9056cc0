"""Which hosts a URL a runner supplies may reach: one policy for reconciliation lookups
and webhook deliveries.

Services check a URL against it when a runner registers one (without DNS where the name
may resolve only where workers run); the guarded transport (``dispatch.egress``) checks
the address actually connected to, after DNS resolution, inside the connection itself.
"""

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import httpx
from django.conf import settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_V4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # SIIT, RFC 2765
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Never public although Python 3.11 calls them global: RFC 8215's local-use NAT64
# prefix, where each network chooses where the IPv4 address sits (RFC 6052 allows six
# prefix lengths), so what it stands for cannot be known here; and the deprecated
# site-local fec0::/10, which some networks still route internally.
_NOT_PUBLIC = (ipaddress.IPv6Network("64:ff9b:1::/48"), ipaddress.IPv6Network("fec0::/10"))


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address that an IPv6 address stands for, if it embeds one.

    Packets to these forms reach (or can be made to reach) the IPv4 host: v4-mapped
    ``::ffff:a.b.c.d``, v4-compatible ``::a.b.c.d``, v4-translated
    ``::ffff:0:a.b.c.d``, NAT64 ``64:ff9b::a.b.c.d``, 6to4 ``2002:AABB:CCDD::`` and
    Teredo (the client address). ``::`` and ``::1`` are the unspecified and loopback
    addresses, not embeddings.
    """
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    in_low_32_bits = address in _NAT64 or address in _V4_TRANSLATED
    if in_low_32_bits or (address in _V4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


@dataclass(frozen=True)
class HostPolicy:
    """Which destinations outbound calls may connect to.

    ``names`` are host names trusted whatever they resolve to, except link-local
    addresses (cloud metadata services live there), which only a listed CIDR range
    admits. ``networks`` admit any host whose address falls inside them. With
    ``allow_public``, globally routable addresses are admitted too.
    """

    names: frozenset[str]
    networks: tuple[Network, ...]
    allow_public: bool

    @classmethod
    def parse(cls, entries: Iterable[str], *, allow_public: bool) -> "HostPolicy":
        names, networks = set(), []
        for entry in entries:
            entry = entry.strip().lower()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(entry.rstrip("."))
        return cls(frozenset(names), tuple(networks), allow_public)

    def address_allowed(self, host: str, address: Address) -> bool:
        # An IPv6 form of an IPv4 address is judged as that IPv4 address: Python calls
        # several such forms global (``::127.0.0.1``, ``64:ff9b::7f00:1``), so a runner
        # could otherwise reach loopback or a metadata service by writing it in IPv6.
        if isinstance(address, ipaddress.IPv6Address):
            address = embedded_ipv4(address) or address
        if any(address in network for network in self.networks):
            return True
        if address.is_link_local or address.is_multicast or address.is_unspecified:
            return False
        if host.lower().rstrip(".") in self.names:
            return True
        public = address.is_global and not any(address in net for net in _NOT_PUBLIC)
        return self.allow_public and public

    def host_possible(self, host: str) -> bool:
        """Whether some connection to ``host`` could be admitted, known without DNS.

        An address is judged as it would be at connect time. A name is possible when it
        is listed, or when it may resolve to an address the policy admits by itself (one
        in a listed range, or any public one with ``allow_public``): only the lookup
        itself can tell. Otherwise no answer DNS could give is admitted.
        """
        host = host.lower().rstrip(".")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names or bool(self.networks) or self.allow_public
        return self.address_allowed(host, address)

    def url_allowed(self, url: str) -> tuple[bool, str]:
        """A registration-time check (the connect-time check still applies later)."""
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            return False, f"not a URL: {exc}"
        if parsed.scheme not in {"http", "https"} or not parsed.host:
            return False, "must be an http(s) URL"
        try:
            addresses = resolve(parsed.host, parsed.port or 443)
        except OSError:
            return False, f"{parsed.host} does not resolve"
        refused = [str(a) for a in addresses if not self.address_allowed(parsed.host, a)]
        if refused:
            return False, f"{parsed.host} resolves to an address that is not allowed ({refused[0]})"
        return True, ""


def lookup_policy() -> HostPolicy:
    """Where reconciliation lookups may connect: ``RECONCILE_ALLOWED_HOSTS`` only, public
    addresses included only when listed (lookups go to the runner's private network)."""
    return HostPolicy.parse(settings.RECONCILE_ALLOWED_HOSTS, allow_public=False)


def resolve(host: str, port: int) -> list[Address]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # An IPv4 or IPv6 result's address is a str (typeshed also allows other families' int).
    return [ipaddress.ip_address(cast(str, info[4][0]).split("%")[0]) for info in infos]


def webhook_policy() -> HostPolicy:
    """Where webhook deliveries may connect: ``WEBHOOK_ALLOWED_HOSTS``, and any public
    address (runners' endpoints are usually on the internet)."""
    return HostPolicy.parse(settings.WEBHOOK_ALLOWED_HOSTS, allow_public=True)
