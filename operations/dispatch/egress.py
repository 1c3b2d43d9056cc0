"""Outbound HTTP that cannot be pointed at internal addresses.

Reconciliation lookups and webhook deliveries go to URLs that runners supply, so a
runner token must not be able to make Effectgate call its own admin, a cloud metadata
service or anything else on its private network. The check runs on the address that is
actually connected to, after DNS resolution, inside the connection itself: a name that
resolves to a public address when registered and to 127.0.0.1 when called (DNS
rebinding) is refused at connect time. Redirects are never followed.
"""

import ssl

import certifi
import httpcore
import httpx

from .. import hosts
from ..hosts import HostPolicy


class AddressRefused(httpcore.ConnectError):
    """The destination resolved only to addresses the policy refuses."""


class GuardedBackend(httpcore.NetworkBackend):
    """Resolves the host itself and connects only to an address the policy admits."""

    def __init__(self, policy: HostPolicy) -> None:
        self.policy = policy
        self.plain = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = hosts.resolve(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"{host} does not resolve: {exc}") from exc
        allowed = [a for a in addresses if self.policy.address_allowed(host, a)]
        if not allowed:
            raise AddressRefused(f"{host} resolves only to addresses that are not allowed")
        last_error: Exception | None = None
        for address in allowed:
            try:
                return self.plain.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                last_error = exc
        raise httpcore.ConnectError(str(last_error))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise AddressRefused("unix sockets are not allowed")

    def sleep(self, seconds: float) -> None:
        self.plain.sleep(seconds)


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, policy: HostPolicy) -> None:
        super().__init__()
        # TLS still verifies the certificate against the URL's host name: httpcore
        # passes it as server_hostname although the socket was opened to an address.
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl.create_default_context(cafile=certifi.where()),
            max_connections=10,
            network_backend=GuardedBackend(policy),
        )


def guarded_client(policy: HostPolicy, *, timeout: float) -> httpx.Client:
    return httpx.Client(
        transport=GuardedTransport(policy),
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        trust_env=False,
        headers={"User-Agent": "Effectgate"},
    )
