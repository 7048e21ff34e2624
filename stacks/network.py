"""Who may reach a cloud pool's port 22: this machine's public address, plus what the user adds."""

from __future__ import annotations

import ipaddress
import urllib.request
from collections.abc import Iterable

from skyward.errors import ConfigError, ProviderError

_ECHO = ("https://checkip.amazonaws.com", "https://api.ipify.org")
# The widest public prefix that may reach a pool's SSH port, per family. An IPv4 /8 is 16 M
# addresses, more than any one organisation's egress; an IPv6 /32 is what a registry gives one
# ISP or company. Anything wider opens the port to a large slice of the internet, and a prefix
# written too short by mistake (/1 for /31) is exactly that.
WIDEST = {4: 8, 6: 32}


def check_cidrs(cidrs: Iterable[str], where: str) -> tuple[str, ...]:
    """Validated CIDRs. The whole internet is refused, and so is any public prefix wider than
    ``WIDEST`` (an IPv4 /8, an IPv6 /32); a wider one that is private throughout (fc00::/7) is fine:
    the pool's SSH port stays reachable from named networks only."""
    out = []
    for cidr in cidrs:
        try:
            net = ipaddress.ip_network(str(cidr).strip(), strict=False)
        except ValueError:
            raise ConfigError(
                f"{where}: {cidr!r} is not an address or CIDR; write e.g. '203.0.113.7/32'."
            ) from None
        widest = WIDEST[net.version]
        if net.prefixlen < widest and not net.is_private:
            reach = "the whole internet" if net.prefixlen == 0 else f"{net.num_addresses:,} public addresses"
            raise ConfigError(
                f"{where}: {cidr!r} would open the pool's SSH port to {reach}; a public prefix may be "
                f"no wider than /{WIDEST[4]} (IPv4) or /{WIDEST[6]} (IPv6). List in allow_ssh_from the "
                f"networks that need it instead (e.g. your CI's egress range, '203.0.113.0/24')."
            )
        out.append(str(net))
    return tuple(out)


def public_address(timeout: float = 5.0) -> str:
    """This machine's address as the internet sees it (asked of an echo service)."""
    errors = []
    for url in _ECHO:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return str(ipaddress.ip_address(response.read().decode().strip()))
        except (OSError, ValueError) as exc:
            errors.append(f"{url}: {exc}")
    raise ProviderError(
        "could not find this machine's public address to open the pool's SSH port to it ("
        + "; ".join(errors) + "). Give it yourself: allow_ssh_from=['<your address>/32'] and "
        "detect_address=False on the provider."
    )


def client_cidrs(extra: Iterable[str], detect: bool, where: str) -> tuple[str, ...]:
    """The client's own /32 (or /128) when ``detect``, then ``extra``, without duplicates."""
    cidrs = list(check_cidrs(extra, where))
    if detect:
        address = ipaddress.ip_address(public_address())
        # One host, checked by the same rule as what the user adds (a detected address is input too).
        cidrs.insert(0, *check_cidrs([f"{address}/{address.max_prefixlen}"], where))
    if not cidrs:
        raise ConfigError(
            f"{where}: detect_address=False and allow_ssh_from is empty, so nothing could reach the "
            f"nodes; list the client's address in allow_ssh_from."
        )
    return tuple(dict.fromkeys(cidrs))
