"""The accelerator catalogue: what GPU/TPU/NPU a node should carry.

Each catalogue entry has a keyword-only factory of the same name::

    sky.accelerators.A100()                  # 80GB, one per node
    sky.accelerators.A100(memory="40GB")     # the 40GB variant
    sky.accelerators.H100(count=8, form_factor="SXM")
    sky.accelerators.T4(count=0.5)           # half of a shared GPU
    sky.accelerators.Custom("MyGPU", memory="48GB")   # anything not listed

Naming. The factory name is a Python identifier (``RTX_4090``). The *canonical*
name stored in ``Accelerator.name`` is the factory name with ``_`` turned into a
space for the GeForce/RTX/Quadro/Titan families (``"RTX 4090"``, ``"GTX 1080 Ti"``,
``"RTX 6000 Ada"``), the vendor's spelling where it differs (``"Radeon Pro V520"``),
and identical to the factory name for everything else (``"A100"``, ``"TPUv5e"``,
``"Trainium1"``). Providers match on the canonical name; ``names()`` lists them. A few
factories are second names for the same entry (``Trainium`` is ``Trainium1``,
``Instinct_MI25`` is ``MI25``).

TPUs. ``count`` is the number in Google's accelerator type: TensorCores for v2, v3, v4
and v5p (``v4-64``), chips for v5e and v6e (``v5litepod-8``); memory is per unit of
that count. The slice factories are shorthands: ``TPUv5e_4()`` is ``TPUv5e(count=4)``,
``TPUv4_64(count=2)`` is ``TPUv4(count=128)``. Google's own names parse too
(``"v5litepod-8"``, ``"v4-64"``, ``"TPUv5p-8:2"``).

String form (skyward.toml, the CLI, ``parse``)::

    NAME[-MEMORY][:COUNT]

* NAME is matched case-insensitively and with ``_``, ``-`` and spaces ignored, so
  ``"RTX_4090"``, ``"rtx-4090"``, ``"RTX4090"`` and ``"RTX 4090"`` are one name.
  A few aliases are accepted too (``"trn1"`` for Trainium1, ``"inf2"`` for Inferentia2,
  ``"dl1"`` for Gaudi). A TPU name may end in a slice size (``"TPUv5e-4"``).
* MEMORY is a size in GB with its unit, separated from the name: ``"A100-40GB"``.
* COUNT is a positive number after a colon: ``"H100:8"``, ``"T4:0.5"``.

``str(accelerator)`` writes the same grammar (memory only when it is not the
catalogue default, count only when it is not 1), so ``parse(str(a)) == a`` for
catalogue accelerators without a form factor.

Only the standard library is imported here: this module loads on every client
and every node.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Protocol

from skyward.errors import AcceleratorError

__all__ = [
    "A2",
    "A10",
    "A10G",
    "A16",
    "A30",
    "A40",
    "A100",
    "A800",
    "B100",
    "B200",
    "B300",
    "GB200",
    "GB300",
    "GH200",
    "GTX_1050",
    "GTX_1060",
    "GTX_1070",
    "GTX_1080",
    "GTX_1650",
    "GTX_1660",
    "H100",
    "H200",
    "K80",
    "L4",
    "L40",
    "L40S",
    "MI25",
    "MI50",
    "MI100",
    "MI210",
    "MI250",
    "MI250X",
    "MI300A",
    "MI300B",
    "MI300X",
    "MI325X",
    "P4",
    "P40",
    "P100",
    "RTX_2060",
    "RTX_2070",
    "RTX_2080",
    "RTX_3050",
    "RTX_3060",
    "RTX_3070",
    "RTX_3080",
    "RTX_3090",
    "RTX_4060",
    "RTX_4070",
    "RTX_4080",
    "RTX_4090",
    "RTX_4090D",
    "RTX_5060",
    "RTX_5070",
    "RTX_5080",
    "RTX_5090",
    "RTX_A2000",
    "RTX_A4000",
    "RTX_A4500",
    "RTX_A5000",
    "RTX_A6000",
    "RTX_PRO_4000",
    "RTX_PRO_4500",
    "RTX_PRO_5000",
    "RTX_PRO_6000",
    "T4",
    "T4G",
    "V100",
    "Accelerator",
    "Custom",
    "GTX_1050_Ti",
    "GTX_1070_Ti",
    "GTX_1080_Ti",
    "GTX_1660_Super",
    "GTX_1660_Ti",
    "Gaudi",
    "Gaudi2",
    "Gaudi3",
    "Inferentia1",
    "Inferentia2",
    "Instinct_MI25",
    "Quadro_P2000",
    "Quadro_P4000",
    "Quadro_RTX_4000",
    "Quadro_RTX_5000",
    "Quadro_RTX_6000",
    "Quadro_RTX_8000",
    "RTX_2000_Ada",
    "RTX_2060_Super",
    "RTX_2070_Super",
    "RTX_2080_Super",
    "RTX_2080_Ti",
    "RTX_3060_Laptop",
    "RTX_3060_Ti",
    "RTX_3070_Ti",
    "RTX_3080_Ti",
    "RTX_3090_Ti",
    "RTX_4000_Ada",
    "RTX_4060_Ti",
    "RTX_4070_Super",
    "RTX_4070_Ti",
    "RTX_4070_Ti_Super",
    "RTX_4080_Super",
    "RTX_4500_Ada",
    "RTX_5000_Ada",
    "RTX_5060_Ti",
    "RTX_5070_Ti",
    "RTX_5880_Ada",
    "RTX_6000_Ada",
    "RTX_A5000_Pro",
    "RadeonPro_V520",
    "RadeonPro_V710",
    "TPUv2",
    "TPUv2_8",
    "TPUv3",
    "TPUv3_8",
    "TPUv3_32",
    "TPUv4",
    "TPUv4_64",
    "TPUv5e",
    "TPUv5e_4",
    "TPUv5p",
    "TPUv5p_8",
    "TPUv6",
    "Titan_RTX",
    "Titan_V",
    "Titan_Xp",
    "Trainium",
    "Trainium1",
    "Trainium2",
    "Trainium3",
    "names",
    "parse",
]

_GRAMMAR = "NAME[-MEMORY][:COUNT], e.g. 'H100:8' or 'A100-40GB:2'"

# A size with an optional GB-ish unit. GiB and GB are treated alike on purpose:
# vendors and clouds use both for the same card ("80GB" A100 is really 80GiB).
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:gb|gib|g)?\s*$", re.IGNORECASE)
# NAME-MEMORY at the end of a string; the unit is required here so that names that
# end in digits ("rtx-4090") are never mistaken for a memory size.
# NAME-SIZE of a TPU slice ("v5litepod-8"): a separator is required, as "TPUv48" would be ambiguous.
_SLICE_RE = re.compile(r"^(.+?)[-_ ](\d+)$")
_NAME_MEMORY_RE = re.compile(r"^(.+?)[-_ ](\d+(?:\.\d+)?\s*(?:gb|gib|g))$", re.IGNORECASE)


def _format_number(value: float) -> str:
    # 8.0 -> "8" so that counts and sizes read the way people write them.
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _normalize_memory(memory: object, *, accelerator: str) -> str | None:
    if memory is None:
        return None
    if isinstance(memory, bool):
        match = None
    elif isinstance(memory, int | float):
        # A bare number is a common slip (memory=40); read it as GB rather than fail.
        match = _MEMORY_RE.match(str(memory))
    elif isinstance(memory, str):
        match = _MEMORY_RE.match(memory)
    else:
        match = None
    if match is None:
        raise AcceleratorError(
            f"memory {memory!r} for {accelerator} is not a size in GB: memory is written as a "
            f'number followed by GB. Use e.g. memory="40GB".'
        )
    amount = float(match.group(1))
    if amount <= 0:
        raise AcceleratorError(
            f"memory {memory!r} for {accelerator} must be greater than 0GB. "
            f'Use e.g. memory="40GB", or leave memory out for the default.'
        )
    return f"{_format_number(amount)}GB"


def _check_count(count: object, *, where: str) -> None:
    # `where` places the value for the reader: "for A100" or "in 'H100:0'".
    if isinstance(count, bool) or not isinstance(count, int | float):
        raise AcceleratorError(
            f"accelerator count {count!r} {where} is not a number: count is how many "
            f"accelerators each node gets. Use e.g. count=8, or count=0.5 to share one."
        )
    if not math.isfinite(count) or count <= 0:
        raise AcceleratorError(
            f"accelerator count {count!r} {where} must be a finite number greater "
            f"than 0. Use e.g. count=1, or a fraction such as count=0.5 to share one accelerator."
        )
    # Fractions only make sense as a share of a single device; "1.5 GPUs" cannot be rented.
    if count > 1 and not float(count).is_integer():
        raise AcceleratorError(
            f"accelerator count {count!r} {where} is not whole: counts above 1 must be "
            f"whole numbers (fractions are only for sharing one device). "
            f"Use count={math.floor(count)} or count={math.ceil(count)}."
        )


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One kind of accelerator and how many of it each node gets.

    Build these with the catalogue factories (``A100()``) or ``Custom(...)``; the
    constructor normalises ``memory`` to the ``"<n>GB"`` form and checks ``count``.
    """

    name: str
    count: float = 1
    memory: str | None = None  # like "80GB"
    form_factor: str | None = None
    manufacturer: str = "NVIDIA"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise AcceleratorError(
                f"accelerator name {self.name!r} is empty or not a string: every accelerator "
                f"needs a name. Use a catalogue factory such as sky.accelerators.A100(), or "
                f'sky.accelerators.Custom("MyGPU", memory="48GB").'
            )
        _check_count(self.count, where=f"for {self.name}")
        # frozen + slots: object.__setattr__ is the sanctioned way to normalise in __post_init__.
        object.__setattr__(self, "memory", _normalize_memory(self.memory, accelerator=self.name))

    @property
    def memory_gb(self) -> float | None:
        """Memory per device in GB, or None when it is not known."""
        if self.memory is None:
            return None
        return float(self.memory[: -len("GB")])

    def __str__(self) -> str:
        text = self.name
        entry = _BY_NAME.get(self.name)
        default_memory = entry.memory if entry is not None else None
        if self.memory is not None and self.memory != default_memory:
            text += f"-{self.memory}"
        if self.count != 1:
            text += f":{_format_number(self.count)}"
        return text


@dataclass(frozen=True, slots=True)
class _Entry:
    """One row of the catalogue."""

    factory: str  # the module attribute, a Python identifier
    memory: str  # the default memory of one device
    manufacturer: str = "NVIDIA"
    memory_variants: tuple[str, ...] = ()  # other sizes sold under the same name
    form_factors: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # extra spellings accepted by parse()
    description: str = ""
    canonical: str = ""  # the name when it is not derived from the factory

    @property
    def name(self) -> str:
        if self.canonical:
            return self.canonical
        # These families are written with spaces everywhere else (nvidia-smi, cloud
        # consoles), so that is the canonical form; other names are already single words.
        if self.factory.startswith(_SPACED):
            return self.factory.replace("_", " ")
        return self.factory

    @property
    def memories(self) -> tuple[str, ...]:
        return (self.memory, *self.memory_variants)


_SPACED = ("RTX_", "GTX_", "Titan_", "Quadro_")


def _gpus(memory_by_factory: str, manufacturer: str = "NVIDIA") -> tuple[_Entry, ...]:
    # "RTX_3080 10, RTX_3080_Ti 12": plain rows that differ only in name and memory (GB).
    pairs = (item.split() for item in memory_by_factory.split(","))
    return tuple(_Entry(factory, f"{memory}GB", manufacturer=manufacturer) for factory, memory in pairs)


_CATALOGUE: tuple[_Entry, ...] = (
    # NVIDIA data-centre
    _Entry("H100", "80GB", memory_variants=("94GB", "40GB"), form_factors=("SXM", "PCIe", "NVL")),
    _Entry("H200", "141GB", form_factors=("SXM", "NVL")),
    _Entry("B200", "180GB", memory_variants=("192GB",), description="180GB as the clouds rent it (HGX)"),
    _Entry("B100", "192GB"),
    _Entry("B300", "288GB"),
    _Entry("GB200", "384GB", description="Grace Blackwell superchip: memory of both GPUs"),
    _Entry("GB300", "288GB"),
    _Entry("GH200", "96GB", memory_variants=("144GB",)),
    _Entry("A100", "80GB", memory_variants=("40GB",), form_factors=("SXM", "PCIe")),
    _Entry("A800", "80GB", memory_variants=("40GB",)),
    _Entry("A10G", "24GB", description="the AWS g5 variant of the A10"),
    _Entry("A10", "24GB"),
    _Entry("A16", "16GB", description="memory is per GPU; an A16 board holds four"),
    _Entry("A2", "16GB"),
    _Entry("A30", "24GB"),
    _Entry("A40", "48GB"),
    _Entry("L4", "24GB"),
    _Entry("L40S", "48GB"),
    _Entry("L40", "48GB"),
    _Entry("T4", "16GB"),
    _Entry("T4G", "16GB", description="the T4 of AWS g5g Graviton (arm64) instances"),
    _Entry("V100", "16GB", memory_variants=("32GB",), form_factors=("SXM", "PCIe")),
    _Entry("P100", "16GB", memory_variants=("12GB",)),
    _Entry("P40", "24GB"),
    _Entry("P4", "8GB"),
    _Entry("K80", "12GB", description="memory is per GPU; a K80 board holds two"),
    # NVIDIA GeForce and Titan
    *_gpus("GTX_1050 2, GTX_1050_Ti 4, GTX_1060 6, GTX_1070 8, GTX_1070_Ti 8, GTX_1080 8, "
           "GTX_1080_Ti 11, GTX_1650 4, GTX_1660 6, GTX_1660_Super 6, GTX_1660_Ti 6"),
    *_gpus("Titan_Xp 12, Titan_V 12, Titan_RTX 24"),
    *_gpus("RTX_2060 6, RTX_2060_Super 8, RTX_2070 8, RTX_2070_Super 8, RTX_2080 8, "
           "RTX_2080_Super 8, RTX_2080_Ti 11"),
    *_gpus("RTX_3050 8, RTX_3060 12, RTX_3060_Ti 8, RTX_3060_Laptop 6, RTX_3070 8, RTX_3070_Ti 8"),
    _Entry("RTX_3080", "10GB", memory_variants=("12GB",)),
    *_gpus("RTX_3080_Ti 12, RTX_3090 24, RTX_3090_Ti 24"),
    _Entry("RTX_4060", "8GB"),
    _Entry("RTX_4060_Ti", "8GB", memory_variants=("16GB",)),
    *_gpus("RTX_4070 12, RTX_4070_Super 12, RTX_4070_Ti 12, RTX_4070_Ti_Super 16, RTX_4080 16, "
           "RTX_4080_Super 16, RTX_4090 24"),
    _Entry("RTX_4090D", "24GB", description="the China-market RTX 4090"),
    _Entry("RTX_5060", "8GB"),
    _Entry("RTX_5060_Ti", "16GB", memory_variants=("8GB",)),
    *_gpus("RTX_5070 12, RTX_5070_Ti 16, RTX_5080 16, RTX_5090 32"),
    # NVIDIA workstation: Quadro, RTX A (Ampere), RTX Ada, RTX PRO (Blackwell)
    *_gpus("Quadro_P2000 5, Quadro_P4000 8, Quadro_RTX_4000 8, Quadro_RTX_5000 16, "
           "Quadro_RTX_6000 24, Quadro_RTX_8000 48"),
    _Entry("RTX_A2000", "12GB", memory_variants=("6GB",)),
    *_gpus("RTX_A4000 16, RTX_A4500 20, RTX_A5000 24, RTX_A5000_Pro 24, RTX_A6000 48"),
    *_gpus("RTX_2000_Ada 16, RTX_4000_Ada 20, RTX_4500_Ada 24, RTX_5000_Ada 32, "
           "RTX_5880_Ada 48, RTX_6000_Ada 48"),
    *_gpus("RTX_PRO_4000 24, RTX_PRO_4500 32, RTX_PRO_5000 48, RTX_PRO_6000 96"),
    # AMD
    _Entry("MI25", "16GB", manufacturer="AMD", aliases=("Instinct MI25",)),
    _Entry("MI50", "16GB", manufacturer="AMD", memory_variants=("32GB",)),
    *_gpus("MI100 32, MI210 64, MI250 128, MI250X 128, MI300A 128, MI300B 192, MI300X 192, "
           "MI325X 256", manufacturer="AMD"),
    _Entry("RadeonPro_V520", "8GB", manufacturer="AMD", canonical="Radeon Pro V520",
           description="the GPU of AWS g4ad instances"),
    _Entry("RadeonPro_V710", "28GB", manufacturer="AMD", canonical="Radeon Pro V710"),
    # Intel Habana
    _Entry("Gaudi", "32GB", manufacturer="Intel", aliases=("Gaudi1", "dl1"),
           description="Habana Gaudi, the accelerator of AWS dl1 instances"),
    _Entry("Gaudi2", "96GB", manufacturer="Intel"),
    _Entry("Gaudi3", "128GB", manufacturer="Intel"),
    # AWS silicon (memory per device, as AWS counts devices for each instance type)
    _Entry("Trainium1", "32GB", manufacturer="AWS", aliases=("trn1", "Trainium"),
           description="AWS Trainium (trn1)"),
    _Entry("Trainium2", "96GB", manufacturer="AWS", aliases=("trn2",), description="AWS Trainium2 (trn2)"),
    _Entry("Trainium3", "144GB", manufacturer="AWS", aliases=("trn3",), description="AWS Trainium3 (trn3)"),
    _Entry("Inferentia1", "8GB", manufacturer="AWS", aliases=("inf1", "Inferentia"),
           description="AWS Inferentia (inf1)"),
    _Entry("Inferentia2", "32GB", manufacturer="AWS", aliases=("inf2",), description="AWS Inferentia2 (inf2)"),
    # Google TPUs: memory per unit of count (TensorCore for v2/v3/v4/v5p, chip for v5e/v6e)
    _Entry("TPUv2", "8GB", manufacturer="Google", aliases=("TPU v2", "v2")),
    _Entry("TPUv3", "16GB", manufacturer="Google", aliases=("TPU v3", "v3")),
    _Entry("TPUv4", "32GB", manufacturer="Google", aliases=("TPU v4", "v4")),
    _Entry("TPUv5e", "16GB", manufacturer="Google", aliases=("TPU v5e", "TPUv5lite", "v5e", "v5litepod")),
    _Entry("TPUv5p", "95GB", manufacturer="Google", aliases=("TPU v5p", "v5p")),
    _Entry("TPUv6", "32GB", manufacturer="Google", aliases=("TPU v6e", "TPUv6e", "v6e", "Trillium")),
)

# Factories that are second names of an entry above: {factory: entry factory}.
_SECOND_NAMES = {"Trainium": "Trainium1", "Instinct_MI25": "MI25"}
# TPU slice factories: {factory: (entry factory, slice size)}.
_SLICES = {
    "TPUv2_8": ("TPUv2", 8),
    "TPUv3_8": ("TPUv3", 8),
    "TPUv3_32": ("TPUv3", 32),
    "TPUv4_64": ("TPUv4", 64),
    "TPUv5e_4": ("TPUv5e", 4),
    "TPUv5p_8": ("TPUv5p", 8),
}


def _key(name: str) -> str:
    # One spelling for lookups: case, spaces, '_' and '-' do not distinguish names.
    return re.sub(r"[\s_\-]+", "", name).upper()


_BY_FACTORY: dict[str, _Entry] = {entry.factory: entry for entry in _CATALOGUE}
_BY_NAME: dict[str, _Entry] = {entry.name: entry for entry in _CATALOGUE}
_BY_KEY: dict[str, _Entry] = {}
for _entry in _CATALOGUE:
    for _spelling in (_entry.factory, _entry.name, *_entry.aliases):
        _existing = _BY_KEY.setdefault(_key(_spelling), _entry)
        # Two entries folding to one key would make parse() ambiguous; catch it at import.
        assert _existing is _entry, f"catalogue spelling {_spelling!r} is ambiguous"
del _entry, _spelling, _existing


def _build(
    entry: _Entry, *, count: float, memory: str | None, form_factor: str | None
) -> Accelerator:
    normalized = _normalize_memory(memory, accelerator=entry.name)
    if normalized is None:
        normalized = entry.memory
    elif normalized not in entry.memories:
        raise AcceleratorError(
            f"{entry.name} has no {normalized} variant: known memory sizes are "
            f"{', '.join(entry.memories)}. Use one of those, or "
            f'sky.accelerators.Custom("{entry.name}", memory="{normalized}") for hardware '
            f"skyward does not list."
        )
    if form_factor is not None:
        wanted = form_factor.upper() if isinstance(form_factor, str) else None
        matches = [ff for ff in entry.form_factors if ff.upper() == wanted]
        if not matches:
            raise AcceleratorError(
                f"form factor {form_factor!r} is not one of {entry.name}'s: allowed are "
                f"{', '.join(entry.form_factors)}. Use one of those, or leave form_factor "
                f"out to accept any."
            )
        form_factor = matches[0]
    return Accelerator(
        name=entry.name,
        count=count,
        memory=normalized,
        form_factor=form_factor,
        manufacturer=entry.manufacturer,
    )


class _Factory(Protocol):
    __name__: str

    def __call__(self, *, count: float = 1, memory: str | None = None) -> Accelerator: ...


class _FormFactorFactory(Protocol):
    __name__: str

    def __call__(
        self, *, count: float = 1, form_factor: str | None = None, memory: str | None = None
    ) -> Accelerator: ...


def _describe(entry: _Entry) -> str:
    lines = [f"{entry.manufacturer} {entry.name}, {entry.memory} by default."]
    if entry.description:
        lines[0] = (
            f"{entry.manufacturer} {entry.name} ({entry.description}), {entry.memory} by default."
        )
    if entry.memory_variants:
        lines.append(f"memory: one of {', '.join(entry.memories)}.")
    if entry.form_factors:
        lines.append(f"form_factor: one of {', '.join(entry.form_factors)}, or None for any.")
    lines.append("count: devices per node; a fraction below 1 shares one device.")
    return "\n\n".join(lines)


def _name_factory(fn: object, entry: _Entry) -> None:
    # Name the closure after its module attribute so pickle finds it by reference
    # and help()/repr show the catalogue name.
    fn.__name__ = entry.factory  # type: ignore[attr-defined]
    fn.__qualname__ = entry.factory  # type: ignore[attr-defined]
    fn.__doc__ = _describe(entry)


def _factory(factory: str) -> _Factory:
    entry = _BY_FACTORY[factory]
    if entry.form_factors:
        raise AssertionError(f"{factory} has form factors; build it with _form_factor_factory")

    def make(*, count: float = 1, memory: str | None = None) -> Accelerator:
        return _build(entry, count=count, memory=memory, form_factor=None)

    _name_factory(make, entry)
    return make


def _form_factor_factory(factory: str) -> _FormFactorFactory:
    entry = _BY_FACTORY[factory]
    if not entry.form_factors:
        raise AssertionError(f"{factory} has no form factors; build it with _factory")

    def make(
        *, count: float = 1, form_factor: str | None = None, memory: str | None = None
    ) -> Accelerator:
        return _build(entry, count=count, memory=memory, form_factor=form_factor)

    _name_factory(make, entry)
    return make


class _SliceFactory(Protocol):
    __name__: str

    def __call__(self, *, count: float = 1) -> Accelerator: ...


def _slice_factory(factory: str) -> _SliceFactory:
    base, size = _SLICES[factory]
    entry = _BY_FACTORY[base]

    def make(*, count: float = 1) -> Accelerator:
        # count is how many slices of this size one node gets; check it before multiplying.
        _check_count(count, where=f"for {factory}")
        return _build(entry, count=size * count, memory=None, form_factor=None)

    make.__name__ = make.__qualname__ = factory
    make.__doc__ = (
        f"Google {entry.name} slice of {size} ({_tpu_unit(entry)}): {entry.name}(count={size}).\n\n"
        f"count: slices per node (multiplies the {size})."
    )
    return make


def _tpu_unit(entry: _Entry) -> str:
    return "chips" if entry.factory in ("TPUv5e", "TPUv6") else "TensorCores"


# One line per catalogue entry: explicit assignments (rather than writing into
# globals()) so that type checkers and IDEs see every factory.
H100 = _form_factor_factory("H100")
H200 = _form_factor_factory("H200")
B200 = _factory("B200")
B100 = _factory("B100")
B300 = _factory("B300")
GB200 = _factory("GB200")
GB300 = _factory("GB300")
GH200 = _factory("GH200")
A100 = _form_factor_factory("A100")
A800 = _factory("A800")
A10G = _factory("A10G")
A10 = _factory("A10")
A16 = _factory("A16")
A2 = _factory("A2")
A30 = _factory("A30")
A40 = _factory("A40")
L4 = _factory("L4")
L40S = _factory("L40S")
L40 = _factory("L40")
T4 = _factory("T4")
T4G = _factory("T4G")
V100 = _form_factor_factory("V100")
P100 = _factory("P100")
P40 = _factory("P40")
P4 = _factory("P4")
K80 = _factory("K80")
GTX_1050 = _factory("GTX_1050")
GTX_1050_Ti = _factory("GTX_1050_Ti")
GTX_1060 = _factory("GTX_1060")
GTX_1070 = _factory("GTX_1070")
GTX_1070_Ti = _factory("GTX_1070_Ti")
GTX_1080 = _factory("GTX_1080")
GTX_1080_Ti = _factory("GTX_1080_Ti")
GTX_1650 = _factory("GTX_1650")
GTX_1660 = _factory("GTX_1660")
GTX_1660_Super = _factory("GTX_1660_Super")
GTX_1660_Ti = _factory("GTX_1660_Ti")
Titan_Xp = _factory("Titan_Xp")
Titan_V = _factory("Titan_V")
Titan_RTX = _factory("Titan_RTX")
RTX_2060 = _factory("RTX_2060")
RTX_2060_Super = _factory("RTX_2060_Super")
RTX_2070 = _factory("RTX_2070")
RTX_2070_Super = _factory("RTX_2070_Super")
RTX_2080 = _factory("RTX_2080")
RTX_2080_Super = _factory("RTX_2080_Super")
RTX_2080_Ti = _factory("RTX_2080_Ti")
RTX_3050 = _factory("RTX_3050")
RTX_3060 = _factory("RTX_3060")
RTX_3060_Ti = _factory("RTX_3060_Ti")
RTX_3060_Laptop = _factory("RTX_3060_Laptop")
RTX_3070 = _factory("RTX_3070")
RTX_3070_Ti = _factory("RTX_3070_Ti")
RTX_3080 = _factory("RTX_3080")
RTX_3080_Ti = _factory("RTX_3080_Ti")
RTX_3090 = _factory("RTX_3090")
RTX_3090_Ti = _factory("RTX_3090_Ti")
RTX_4060 = _factory("RTX_4060")
RTX_4060_Ti = _factory("RTX_4060_Ti")
RTX_4070 = _factory("RTX_4070")
RTX_4070_Super = _factory("RTX_4070_Super")
RTX_4070_Ti = _factory("RTX_4070_Ti")
RTX_4070_Ti_Super = _factory("RTX_4070_Ti_Super")
RTX_4080 = _factory("RTX_4080")
RTX_4080_Super = _factory("RTX_4080_Super")
RTX_4090 = _factory("RTX_4090")
RTX_4090D = _factory("RTX_4090D")
RTX_5060 = _factory("RTX_5060")
RTX_5060_Ti = _factory("RTX_5060_Ti")
RTX_5070 = _factory("RTX_5070")
RTX_5070_Ti = _factory("RTX_5070_Ti")
RTX_5080 = _factory("RTX_5080")
RTX_5090 = _factory("RTX_5090")
Quadro_P2000 = _factory("Quadro_P2000")
Quadro_P4000 = _factory("Quadro_P4000")
Quadro_RTX_4000 = _factory("Quadro_RTX_4000")
Quadro_RTX_5000 = _factory("Quadro_RTX_5000")
Quadro_RTX_6000 = _factory("Quadro_RTX_6000")
Quadro_RTX_8000 = _factory("Quadro_RTX_8000")
RTX_A2000 = _factory("RTX_A2000")
RTX_A4000 = _factory("RTX_A4000")
RTX_A4500 = _factory("RTX_A4500")
RTX_A5000 = _factory("RTX_A5000")
RTX_A5000_Pro = _factory("RTX_A5000_Pro")
RTX_A6000 = _factory("RTX_A6000")
RTX_2000_Ada = _factory("RTX_2000_Ada")
RTX_4000_Ada = _factory("RTX_4000_Ada")
RTX_4500_Ada = _factory("RTX_4500_Ada")
RTX_5000_Ada = _factory("RTX_5000_Ada")
RTX_5880_Ada = _factory("RTX_5880_Ada")
RTX_6000_Ada = _factory("RTX_6000_Ada")
RTX_PRO_4000 = _factory("RTX_PRO_4000")
RTX_PRO_4500 = _factory("RTX_PRO_4500")
RTX_PRO_5000 = _factory("RTX_PRO_5000")
RTX_PRO_6000 = _factory("RTX_PRO_6000")
MI25 = _factory("MI25")
MI50 = _factory("MI50")
MI100 = _factory("MI100")
MI210 = _factory("MI210")
MI250 = _factory("MI250")
MI250X = _factory("MI250X")
MI300A = _factory("MI300A")
MI300B = _factory("MI300B")
MI300X = _factory("MI300X")
MI325X = _factory("MI325X")
RadeonPro_V520 = _factory("RadeonPro_V520")
RadeonPro_V710 = _factory("RadeonPro_V710")
Gaudi = _factory("Gaudi")
Gaudi2 = _factory("Gaudi2")
Gaudi3 = _factory("Gaudi3")
Trainium1 = _factory("Trainium1")
Trainium2 = _factory("Trainium2")
Trainium3 = _factory("Trainium3")
Inferentia1 = _factory("Inferentia1")
Inferentia2 = _factory("Inferentia2")
TPUv2 = _factory("TPUv2")
TPUv3 = _factory("TPUv3")
TPUv4 = _factory("TPUv4")
TPUv5e = _factory("TPUv5e")
TPUv5p = _factory("TPUv5p")
TPUv6 = _factory("TPUv6")
Trainium = Trainium1  # the same entry under a second name
Instinct_MI25 = MI25  # the same entry under a second name
TPUv2_8 = _slice_factory("TPUv2_8")
TPUv3_8 = _slice_factory("TPUv3_8")
TPUv3_32 = _slice_factory("TPUv3_32")
TPUv4_64 = _slice_factory("TPUv4_64")
TPUv5e_4 = _slice_factory("TPUv5e_4")
TPUv5p_8 = _slice_factory("TPUv5p_8")

# A catalogue row without its factory line (or the reverse) would silently drop an
# accelerator from sky.accelerators; fail at import instead.
_factories = [e.factory for e in _CATALOGUE] + list(_SECOND_NAMES) + list(_SLICES)
_missing = [f for f in _factories if f not in globals() or f not in __all__]
assert not _missing, f"catalogue entries without a factory or __all__ entry: {_missing}"
del _missing, _factories


def Custom(
    name: str,
    *,
    memory: str | None = None,
    count: float = 1,
    form_factor: str | None = None,
    manufacturer: str = "NVIDIA",
    cuda_min: str | None = None,
    cuda_max: str | None = None,
) -> Accelerator:
    """An accelerator that is not in the catalogue, taken as given.

    Only the generic rules apply (count > 0, memory written as a GB size; ``""`` is no
    memory); the name, memory and form factor are passed to providers unchecked.
    ``cuda_min``/``cuda_max`` are accepted as the reference API spells them and not used:
    skyward picks CUDA builds by the pool's plugins (``torch(cuda=...)``), not by the card.
    """
    del cuda_min, cuda_max
    if memory == "":
        memory = None
    if not isinstance(name, str) or not name.strip():
        raise AcceleratorError(
            f"custom accelerator name {name!r} is empty or not a string: Custom needs the "
            f'name the provider uses for the device. Use e.g. Custom("MyGPU", memory="48GB").'
        )
    return Accelerator(
        name=name.strip(),
        count=count,
        memory=memory,
        form_factor=form_factor,
        manufacturer=manufacturer,
    )


def names() -> list[str]:
    """Canonical names of every catalogue accelerator, in catalogue order."""
    return [entry.name for entry in _CATALOGUE]


def _parse_count(text: str, original: str) -> float:
    try:
        count: float = int(text)
    except ValueError:
        try:
            count = float(text)
        except ValueError:
            raise AcceleratorError(
                f"accelerator count {text!r} in {original!r} is not a number: the form is "
                f"{_GRAMMAR}. Write the count as a number after the colon."
            ) from None
    _check_count(count, where=f"in {original!r}")
    return count


def _unknown(name: str, memory: str | None, count: float | None) -> AcceleratorError:
    keys = list(_BY_KEY)
    close = difflib.get_close_matches(_key(name), keys, n=6, cutoff=0.6)
    suggestions: list[str] = []
    for key in close:
        canonical = _BY_KEY[key].name
        if canonical not in suggestions:
            suggestions.append(canonical)
    suggestions = suggestions[:3]
    hint = ""
    if suggestions:
        quoted = [f"'{s}'" for s in suggestions]
        joined = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        hint = f" Did you mean {joined}?"
    custom_args = [f'"{name}"']
    if memory is not None:
        custom_args.append(f'memory="{memory}"')
    if count is not None and count != 1:
        custom_args.append(f"count={_format_number(count)}")
    return AcceleratorError(
        f"unknown accelerator {name!r}: not in skyward's catalogue.{hint} See "
        f"sky.accelerators.names() for the list, or use "
        f"sky.accelerators.Custom({', '.join(custom_args)})."
    )


def parse(value: str | Accelerator) -> Accelerator:
    """Turn ``NAME[-MEMORY][:COUNT]`` (or an Accelerator, returned as is) into an Accelerator.

    >>> parse("h100:8")
    Accelerator(name='H100', count=8, memory='80GB', form_factor=None, manufacturer='NVIDIA')
    """
    if isinstance(value, Accelerator):
        return value
    if not isinstance(value, str):
        raise AcceleratorError(
            f"accelerator {value!r} is a {type(value).__name__}, not a name or an Accelerator: "
            f"the string form is {_GRAMMAR}. Pass a string or e.g. sky.accelerators.A100()."
        )
    text = value.strip()
    if not text:
        raise AcceleratorError(
            f"accelerator {value!r} is empty: the form is {_GRAMMAR}. "
            f"Leave the accelerator out for CPU-only nodes."
        )
    head, sep, count_text = text.partition(":")
    if ":" in count_text:
        raise AcceleratorError(
            f"accelerator {value!r} has more than one ':': the form is {_GRAMMAR}. "
            f"Put the memory after a '-' and a single count after the ':'."
        )
    count: float | None = None
    if sep:
        count = _parse_count(count_text.strip(), value)
    name = head.strip()
    memory: str | None = None
    entry = _BY_KEY.get(_key(name))
    if entry is None:
        match = _NAME_MEMORY_RE.match(name)
        if match is not None:
            name, memory = match.group(1).strip(), match.group(2)
            entry = _BY_KEY.get(_key(name))
    size = 1
    if entry is None:
        # A TPU slice: "TPUv5e-4", "v4-64", "TPU v5p-8" is that TPU with count = the size.
        match = _SLICE_RE.match(name)
        if match is not None:
            base = _BY_KEY.get(_key(match.group(1)))
            if base is not None and base.manufacturer == "Google":
                entry, size = base, int(match.group(2))
    if entry is None:
        raise _unknown(name, memory, count)
    return _build(
        entry,
        count=size * (1 if count is None else count),
        memory=memory,
        form_factor=None,
    )
