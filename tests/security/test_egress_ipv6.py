"""IPv6 addresses that embed an IPv4 address are judged by that IPv4 address.

An attacker who can name a webhook target or a lookup URL may write an internal IPv4
address in one of IPv6's embedding forms. Python's ``is_global`` calls several of them
global (``::127.0.0.1``, ``64:ff9b::7f00:1``, ``2002:7f00:1::`` on 3.11), so the egress
guard must unwrap them itself, at registration and at connect time.
"""

import ipaddress

import httpx
import pytest

from operations import hosts
from operations.dispatch.egress import AddressRefused, GuardedBackend, guarded_client
from operations.hosts import HostPolicy
from operations.models import WebhookEndpoint

ip = ipaddress.ip_address

# Each form written around 127.0.0.1, 10.0.0.1 and 169.254.169.254.
INTERNAL_EMBEDDINGS = [
    "::ffff:127.0.0.1",  # v4-mapped
    "::127.0.0.1",  # v4-compatible (deprecated)
    "::10.0.0.1",
    "::a9fe:a9fe",
    "64:ff9b::7f00:1",  # NAT64 well-known prefix
    "64:ff9b::a00:1",
    "64:ff9b::a9fe:a9fe",
    "2002:7f00:1::",  # 6to4
    "2002:a00:1::1",
    "2002:a9fe:a9fe::",
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
    "::ffff:0:7f00:1",  # v4-translated (SIIT)
    "::ffff:0:a9fe:a9fe",
    "64:ff9b:1::7f00:1",  # NAT64 local-use prefix: the embedding is not knowable
    "fec0::1",  # deprecated site-local, not an embedding but called global by Python 3.11
]

PUBLIC_EMBEDDINGS = [
    "::ffff:8.8.8.8",
    "::ffff:0:808:808",
    "64:ff9b::808:808",
    "2002:808:808::",
    # Teredo traffic is relayed to the client address, so a public client is public
    # (Python alone calls every Teredo address non-global).
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
]


@pytest.mark.parametrize("address", INTERNAL_EMBEDDINGS)
def test_an_embedded_internal_ipv4_address_is_not_public(address):
    public = HostPolicy.parse([], allow_public=True)
    assert not public.address_allowed("x.test", ip(address))


@pytest.mark.parametrize("address", PUBLIC_EMBEDDINGS)
def test_an_embedded_public_ipv4_address_stays_public(address):
    public = HostPolicy.parse([], allow_public=True)
    assert public.address_allowed("x.test", ip(address))


@pytest.mark.parametrize(
    ("entries", "address", "allowed"),
    [
        (["10.0.0.0/8"], "::ffff:10.0.0.1", True),
        (["10.0.0.0/8"], "64:ff9b::a00:1", True),
        (["10.0.0.0/8"], "2002:a00:1::", True),
        (["10.0.0.0/8"], "::10.0.0.1", True),
        (["10.0.0.0/8"], "64:ff9b::7f00:1", False),
        # A listed host name is trusted except for link-local addresses, in any form.
        (["runner.internal"], "64:ff9b::a9fe:a9fe", False),
        (["runner.internal"], "2002:a9fe:a9fe::", False),
        (["runner.internal"], "::169.254.169.254", False),
        (["runner.internal"], "64:ff9b::a00:1", True),
    ],
)
def test_listed_networks_and_names_see_the_embedded_address(entries, address, allowed):
    policy = HostPolicy.parse(entries, allow_public=False)
    assert policy.address_allowed("runner.internal", ip(address)) is allowed


def test_the_ipv6_loopback_and_unspecified_addresses_stay_refused():
    public = HostPolicy.parse([], allow_public=True)
    assert not public.address_allowed("x.test", ip("::1"))
    assert not public.address_allowed("x.test", ip("::"))


@pytest.mark.parametrize("address", INTERNAL_EMBEDDINGS)
def test_webhook_allow_list_check_refuses_embedded_internal_literals(address):
    allowed, why = HostPolicy.parse([], allow_public=True).url_allowed(f"https://[{address}]/hook")
    assert not allowed
    assert "not allowed" in why


@pytest.mark.parametrize("address", ["::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::"])
def test_webhook_endpoint_api_refuses_embedded_internal_literals(api, address):
    response = api.post(
        "/api/v1/webhook-endpoints", {"url": f"https://[{address}]/hook", "events": ["*"]}
    )
    assert response.status_code == 422
    assert response.json()["code"] == "url_not_allowed"
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize("address", INTERNAL_EMBEDDINGS)
def test_connect_time_check_refuses_a_name_resolving_to_an_embedded_internal_address(
    monkeypatch, address
):
    # DNS rebinding: the name resolved to a public address at registration and now
    # answers with an IPv6 form of an internal one.
    monkeypatch.setattr(hosts, "resolve", lambda host, port: [ip(address)])
    connected = []
    backend = GuardedBackend(HostPolicy.parse([], allow_public=True))
    monkeypatch.setattr(backend.plain, "connect_tcp", lambda *a, **k: connected.append(a))
    with pytest.raises(AddressRefused):
        backend.connect_tcp("hooks.example.com", 443)
    assert connected == []


@pytest.mark.parametrize("address", ["::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::"])
def test_guarded_client_never_connects_to_an_embedded_internal_literal(address):
    policy = HostPolicy.parse([], allow_public=True)
    with (
        guarded_client(policy, timeout=0.5) as client,
        pytest.raises(httpx.ConnectError, match="not allowed"),
    ):
        client.get(f"http://[{address}]:9/hook")
