"""Offers: the instance types a cloud sells, with their prices, and choosing one for a Spec.

The catalogues ship as data with skyward (``providers/catalogue/<provider>.json``), each with
the date its prices were taken (``as_of``): selection never needs credentials or network.
``sky.offers(...)`` queries them; ``select`` turns a Spec into the cheapest viable offer, or
raises NoOfferError naming the closest offers and what kept them out.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from .errors import ConfigError, NoOfferError

if TYPE_CHECKING:
    from .accelerators import Accelerator
    from .spec import Spec

PROVIDERS = ("aws", "gcp")
Market = Literal["spot", "on-demand"]
_DIR = Path(__file__).resolve().parent / "providers" / "catalogue"


@dataclass(frozen=True, slots=True)
class Offer:
    """One instance type in one region, with its hourly prices (USD per node)."""

    provider: str
    instance_type: str
    region: str
    vcpus: float
    memory_gb: float
    architecture: str
    accelerator: str | None = None
    accelerator_count: float = 0
    accelerator_memory_gb: float | None = None
    on_demand: float | None = None
    spot: float | None = None
    as_of: str = ""
    # Provider specifics the stack program needs (GCP: machine_type, accelerator_type, attach).
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def market(self, allocation: str) -> Market | None:
        """Spot or on-demand under this allocation strategy (None: the offer cannot serve it)."""
        if allocation == "spot":
            return "spot" if self.spot is not None else None
        if allocation == "on-demand":
            return "on-demand" if self.on_demand is not None else None
        if allocation == "cheapest":
            if self.spot is not None and (self.on_demand is None or self.spot <= self.on_demand):
                return "spot"
            return "on-demand" if self.on_demand is not None else None
        # spot-if-available: spot is tried first, on-demand if no spot capacity.
        return "spot" if self.spot is not None else ("on-demand" if self.on_demand is not None else None)

    def price(self, allocation: str = "cheapest") -> float | None:
        market = self.market(allocation)
        return None if market is None else (self.spot if market == "spot" else self.on_demand)

    def __str__(self) -> str:
        parts = [f"{self.provider} {self.instance_type} ({self.region})"]
        if self.accelerator:
            memory = f" {_num(self.accelerator_memory_gb)}GB" if self.accelerator_memory_gb else ""
            parts.append(f"{_num(self.accelerator_count)}x {self.accelerator}{memory}")
        parts.append(f"{_num(self.vcpus)} vCPU, {_num(self.memory_gb)} GB, {self.architecture}")
        prices = []
        if self.spot is not None:
            prices.append(f"${self.spot:.4g}/h spot")
        if self.on_demand is not None:
            prices.append(f"${self.on_demand:.4g}/h on-demand")
        parts.append(" / ".join(prices) + (f" (prices as of {self.as_of})" if self.as_of else ""))
        return ": ".join(parts[:1]) + ": " + ", ".join(parts[1:])


# The reference API's name for one rentable machine type with its prices.
InstanceType: TypeAlias = Offer


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@functools.cache
def load(provider: str) -> tuple[Offer, ...]:
    """Every offer of a provider's shipped catalogue (one per instance type and region)."""
    if provider not in PROVIDERS:
        raise ConfigError(f"provider={provider!r} has no offer catalogue: use one of {', '.join(PROVIDERS)}.")
    data = json.loads((_DIR / f"{provider}.json").read_text())
    offers = []
    for row in data["types"]:
        acc = row.get("accelerator") or {}
        extra = {k: v for k, v in row.items()
                 if k not in ("name", "vcpus", "memory_gb", "architecture", "accelerator", "prices", "as_of")}
        sold_as = row.get("sold_as")
        for region, (on_demand, spot) in row["prices"].items():
            if sold_as is not None and "on-demand" not in sold_as:
                # Listed with its price, but not sold on demand (GCP A3 Ultra, A4...): no such offer.
                on_demand = None
            offers.append(Offer(
                provider=provider, instance_type=row["name"], region=region, vcpus=row["vcpus"],
                memory_gb=row["memory_gb"], architecture=row["architecture"],
                accelerator=acc.get("name"), accelerator_count=acc.get("count", 0),
                accelerator_memory_gb=acc.get("memory_gb"), on_demand=on_demand, spot=spot,
                as_of=row.get("as_of", data["as_of"]), extra=extra,  # rows added later carry their own date
            ))
    return tuple(offers)


def as_of(provider: str) -> str:
    """The newest price date of a provider's catalogue (rows may be dated apart)."""
    return max(o.as_of for o in load(provider))


@dataclass(frozen=True, slots=True)
class Want:
    """The parts of a Spec (or of an offers() query) that decide which offers fit."""

    accelerator: Accelerator | None = None
    vcpus: float | None = None
    memory_gb: float | None = None
    architecture: str | None = None
    region: str | None = None
    allocation: str = "cheapest"
    max_hourly_cost: float | None = None
    instance_type: str | None = None

    @classmethod
    def of(cls, spec: Spec, *, region: str | None, instance_type: str | None = None) -> Want:
        return cls(
            accelerator=spec.accelerator if not isinstance(spec.accelerator, str) else None,
            vcpus=spec.vcpus, memory_gb=spec.memory_gb, architecture=spec.architecture,
            region=region, allocation=spec.allocation, max_hourly_cost=spec.max_hourly_cost,
            instance_type=instance_type,
        )

    def misfit(self, offer: Offer) -> str | None:
        """Why the offer does not fit (None when it does)."""
        if self.instance_type is not None and offer.instance_type != self.instance_type:
            return f"not {self.instance_type}"
        if self.region is not None and offer.region != self.region:
            return f"not in {self.region}"
        acc = self.accelerator
        if acc is None and offer.accelerator is not None and self.instance_type is None:
            return "has accelerators and none was asked for"
        if acc is not None:
            if offer.accelerator != acc.name:
                return f"has no {acc.name}"
            if offer.accelerator_count < math.ceil(acc.count):
                return f"has {_num(offer.accelerator_count)} {acc.name}, fewer than {_num(acc.count)}"
            wanted = acc.memory_gb
            if wanted is not None and (offer.accelerator_memory_gb or 0) < wanted:
                return f"its {acc.name} has {_num(offer.accelerator_memory_gb)}GB, less than {_num(wanted)}GB"
        if self.vcpus is not None and offer.vcpus < self.vcpus:
            return f"{_num(offer.vcpus)} vCPUs < {_num(self.vcpus)}"
        if self.memory_gb is not None and offer.memory_gb < self.memory_gb:
            return f"{_num(offer.memory_gb)} GB memory < {_num(self.memory_gb)}"
        if self.architecture is not None and offer.architecture != self.architecture:
            return f"is {offer.architecture}, not {self.architecture}"
        price = offer.price(self.allocation)
        if price is None:
            return f"has no {self.allocation} price"
        if self.max_hourly_cost is not None and price > self.max_hourly_cost:
            return f"${price:.4g}/h is over max_hourly_cost=${self.max_hourly_cost:g}"
        return None


def _sorted(offers: Iterable[Offer], allocation: str) -> list[Offer]:
    return sorted(offers, key=lambda o: (o.price(allocation) or math.inf, o.vcpus, o.instance_type, o.region))


def matching(provider: str, want: Want) -> list[Offer]:
    """The provider's offers that fit, cheapest first."""
    return _sorted((o for o in load(provider) if want.misfit(o) is None), want.allocation)


# What to give up, in this order, to find the offers closest to a spec that nothing fits.
_RELAX: tuple[tuple[str, dict[str, Any]], ...] = (
    ("max_hourly_cost", {"max_hourly_cost": None}),
    ("region", {"max_hourly_cost": None, "region": None}),
    ("architecture", {"max_hourly_cost": None, "region": None, "architecture": None}),
    ("vcpus and memory_gb", {"max_hourly_cost": None, "region": None, "architecture": None,
                             "vcpus": None, "memory_gb": None}),
    # allocation="spot" for machines sold on-demand only (the biggest GPUs, trn2).
    ("allocation", {"max_hourly_cost": None, "region": None, "architecture": None,
                    "vcpus": None, "memory_gb": None, "allocation": "cheapest"}),
)


def closest(provider: str, want: Want, n: int = 3) -> tuple[str, list[Offer]]:
    """The offers nearest to ``want`` and the constraint that had to be dropped to find them."""
    for dropped, changes in _RELAX:
        found = matching(provider, replace(want, **changes))
        if found:
            return dropped, found[:n]
    if want.accelerator is not None and want.accelerator.count > 1:
        # The accelerator is rented, only not this many per node: show the counts there are.
        one = replace(want.accelerator, count=1)
        found = matching(provider, replace(want, **_RELAX[-1][1], accelerator=one))
        if found:
            return "accelerator count", sorted(found, key=lambda o: -o.accelerator_count)[:n]
    return "", []


def select(provider: str, want: Want) -> Offer:
    """The cheapest offer that fits; NoOfferError with the closest ones when none does."""
    found = matching(provider, want)
    if found:
        return found[0]
    raise NoOfferError(no_offer_message(provider, want))


_LABELS = {"aws": "AWS", "gcp": "GCP"}


def renters(accelerator: str) -> list[str]:
    """The providers whose shipped catalogue rents ``accelerator`` (a canonical name)."""
    return [p for p in PROVIDERS if any(o.accelerator == accelerator for o in load(p))]


def _elsewhere(accelerator: Accelerator) -> str:
    # Who rents what AWS and GCP do not: said by family, since those markets change weekly.
    name, maker = accelerator.name, accelerator.manufacturer
    if maker == "NVIDIA" and name.startswith(("RTX", "GTX", "Titan", "Quadro")):
        return "GPU marketplaces (RunPod, Vast.ai and the like)"
    if maker == "AMD":
        return "Azure, Oracle Cloud and GPU clouds"
    if maker == "Intel":
        return "Intel's Tiber cloud"
    return "GPU clouds and marketplaces"


# Accelerators the clouds do rent, but only in machines this catalogue does not list (rack-scale
# systems, chips announced after the catalogue's date): "not by AWS or GCP" would be false.
_UNLISTED = {
    "Trainium3": "AWS (Trn3 machines)",
    "GB200": "AWS (P6e-GB200 UltraServers) and GCP (A4X)",
}


def rented_by(accelerator: Accelerator, provider: str) -> str:
    """One sentence: which providers rent this accelerator, when ``provider`` rents none."""
    others = [_LABELS[p] for p in renters(accelerator.name) if p != provider]
    label = _LABELS.get(provider, provider)
    if others:
        hint = " or ".join(f"sky.{p}()" for p in others)
        return f"{accelerator.name} is rented by {' and '.join(others)}, not by {label}: use provider={hint}."
    clouds = " or ".join(_LABELS[p] for p in PROVIDERS)
    if accelerator.name in _UNLISTED:
        return (
            f"{accelerator.name} is rented by {_UNLISTED[accelerator.name]} only in machines skyward's "
            f"catalogue does not list yet: pick an accelerator the catalogue has (sky.offers() lists "
            f"them), or run on such machines with sky.SSH(hosts=[...])."
        )
    return (
        f"{accelerator.name} is rented by {_elsewhere(accelerator)}, not by {clouds}: run on such "
        f"machines with sky.SSH(hosts=[...]), or pick an accelerator {clouds} rent "
        f"(sky.offers() lists them)."
    )


_SOLD_AS = {"reservation": "reservations", "flex-start": "Flex-start (Dynamic Workload Scheduler)",
            "spot": "Spot", "capacity-block": "Capacity Blocks for ML"}


def _how_to_buy(provider: str, name: str, ways: tuple[str, ...]) -> str:
    """How a machine that is not sold on demand is bought and used, by the way it is sold."""
    if provider == "aws" and ways == ("capacity-block",):
        # EC2 Capacity Blocks: bought ahead for 1-182 days, delivered as a targeted Capacity
        # Reservation in one zone; an instance must be launched into that reservation.
        return (f"buy a Capacity Block for it (`aws ec2 describe-capacity-block-offerings --instance-type {name} "
                f"--instance-count N --capacity-duration-hours H`, then `aws ec2 purchase-capacity-block`), "
                f"launch the reserved instances into it and run on them with sky.SSH(hosts=[...]); "
                f"or pick another instance type (sky.offers() lists what AWS sells on demand or spot).")
    return (f"reserve it with {_LABELS[provider]} and run on the reserved machines with sky.SSH(hosts=[...]), "
            f"or pick a machine sold on demand.")


def not_on_demand(provider: str, want: Want) -> str:
    """A sentence for machines with the asked accelerator (or the asked instance type) that the
    cloud does not sell on demand (catalogue rows with ``sold_as``), or ""."""
    if want.accelerator is None and want.instance_type is None:
        return ""
    rows = sorted({(o.instance_type, o.accelerator or "", tuple(o.extra.get("sold_as") or ())) for o in load(provider)
                   if (o.instance_type == want.instance_type if want.instance_type is not None
                       else want.accelerator is not None and o.accelerator == want.accelerator.name)
                   and o.on_demand is None and o.spot is None and o.extra.get("sold_as")})
    return "".join(
        f" {name} ({accelerator}) is sold through {', '.join(_SOLD_AS.get(w, w) for w in ways)}, "
        f"not on demand, and skyward cannot buy it that way yet: {_how_to_buy(provider, name, ways)}"
        for name, accelerator, ways in rows)


def no_offer_message(provider: str, want: Want) -> str:
    asked = describe(want)
    if want.accelerator is not None and provider not in renters(want.accelerator.name):
        return f"no {provider} offer has {asked}. {rented_by(want.accelerator, provider)}"
    how = not_on_demand(provider, want)
    dropped, near = closest(provider, want)
    if how and not near:
        return f"no {provider} offer has {asked} (catalogue prices as of {as_of(provider)}).{how}"
    text = f"no {provider} offer has {asked} (catalogue prices as of {as_of(provider)})."
    if near:
        text += f" Closest, without the {dropped} limit:\n" + "\n".join(f"      {o}" for o in near)
        text += f"\n    Change {dropped} (or the accelerator), or try another provider."
        if dropped == "accelerator count" and want.accelerator is not None and want.accelerator.manufacturer == "Google":
            text += (" TPU slices larger than one host (v4-64, v3-32...) are not supported yet: "
                     "a node is one single-host TPU VM; ask for more nodes instead.")
    else:
        text += " Nothing close either: pick another accelerator, or see sky.offers() for what exists."
    if how:  # other machines fit once a limit goes; these ones are bought another way
        text += f"\n   {how}"
    return text


def describe(want: Want) -> str:
    parts = [str(want.accelerator) if want.accelerator is not None else "no accelerator"]
    if want.vcpus:
        parts.append(f">= {_num(want.vcpus)} vCPUs")
    if want.memory_gb:
        parts.append(f">= {_num(want.memory_gb)} GB")
    if want.architecture:
        parts.append(want.architecture)
    parts.append(f"allocation={want.allocation!r}")
    if want.max_hourly_cost is not None:
        parts.append(f"at most ${want.max_hourly_cost:g}/h")
    if want.region:
        parts.append(f"in {want.region}")
    if want.instance_type:
        parts.append(f"instance type {want.instance_type}")
    return ", ".join(parts)


def offers(
    accelerator: Accelerator | str | None = None,
    *,
    provider: Any = None,
    vcpus: float | None = None,
    memory_gb: float | None = None,
    architecture: str | None = None,
    region: str | None = None,
    allocation: str = "cheapest",
    max_hourly_cost: float | None = None,
) -> list[InstanceType]:
    """What the shipped catalogues sell that fits, cheapest first (price under ``allocation``).

    ``provider``: ``"aws"``, ``"gcp"``, a provider config (``sky.AWS()``) or None for all;
    ``sky.Slurm(...)`` lists its cluster's partitions as ``sinfo`` shows them now.
    ``accelerator``: an accelerator or its string form (``"H100:8"``); None lists CPU-only
    types. Prices are per node-hour in USD, as of each catalogue's ``as_of`` date.
    """
    from .accelerators import parse
    from .spec import _ALLOCATIONS

    if allocation not in _ALLOCATIONS:
        raise ConfigError(f"allocation={allocation!r} is not valid: use one of {', '.join(map(repr, _ALLOCATIONS))}.")
    live = getattr(provider, "live_offers", None)
    if callable(live):  # a provider that asks its cluster what it has (sky.Slurm: sinfo on the login node)
        want = Want(accelerator=parse(accelerator) if accelerator is not None else None, vcpus=vcpus,
                    memory_gb=memory_gb, architecture=architecture, region=region, allocation=allocation)
        return list(live(want))
    kinds = PROVIDERS if provider is None else (getattr(provider, "kind", provider),)
    for kind in kinds:
        if kind not in PROVIDERS:
            raise ConfigError(
                f"provider={provider!r} has no offer catalogue: use {', '.join(map(repr, PROVIDERS))}, "
                f"sky.AWS(), sky.GCP() or None for all."
            )
    want = Want(
        accelerator=parse(accelerator) if accelerator is not None else None, vcpus=vcpus,
        memory_gb=memory_gb, architecture=architecture, region=region, allocation=allocation,
        max_hourly_cost=max_hourly_cost,
    )
    return _sorted((o for kind in kinds for o in matching(kind, want)), allocation)


__all__ = ["InstanceType", "Offer", "offers"]
