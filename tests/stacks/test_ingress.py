"""Who may reach a cloud pool's SSH port: not the whole internet, and not a
large slice of it either. The rule is checked where the value is given (sky.AWS / sky.GCP) and
again where a stack is planned or previewed (stacks.network.check_cidrs)."""

from __future__ import annotations

import pytest

import skyward as sky
from skyward.errors import ConfigError
from skyward.stacks.network import check_cidrs

WHERE = "sky.AWS(allow_ssh_from=...)"


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1", "64.0.0.0/2", "8.0.0.0/7",
                                  "10.0.0.0/7",  # 10/8 and 11/8: half of it is public
                                  "::/0", "2000::/3", "2001::/16", "2001:db8::/31"])
def test_public_prefixes_wider_than_the_rule_are_refused(cidr: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_cidrs([cidr], WHERE)
    message = str(info.value)
    assert cidr in message and WHERE in message, message  # the value, where it was given
    assert "/8" in message and "/32" in message, message  # the rule
    assert "allow_ssh_from" in message and "e.g." in message, message  # what to write instead


@pytest.mark.parametrize("cidr", ["203.0.113.7/32", "198.51.100.0/24", "44.0.0.0/8", "10.0.0.0/8",
                                  "172.16.0.0/12", "2001:db8::/32", "2001:db8:1::/48", "fc00::/7"])
def test_narrower_or_private_prefixes_are_allowed(cidr: str) -> None:
    assert check_cidrs([cidr], WHERE) == (cidr,)


@pytest.mark.parametrize("provider", [sky.AWS, sky.GCP])
def test_the_provider_refuses_a_wide_prefix_where_it_is_given(provider: type) -> None:
    with pytest.raises(ConfigError, match="allow_ssh_from"):
        provider(allow_ssh_from=["0.0.0.0/1"])
    assert provider(allow_ssh_from=["198.51.100.0/24"]).allow_ssh_from == ("198.51.100.0/24",)
