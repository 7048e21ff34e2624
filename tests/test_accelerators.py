from __future__ import annotations

import inspect
import pickle
from dataclasses import FrozenInstanceError

import pytest

import skyward.accelerators as acc
from skyward.accelerators import A100, H100, RTX_4090, Accelerator, Custom, names, parse
from skyward.errors import AcceleratorError, ConfigError

REQUIRED = [
    "H100",
    "H200",
    "B200",
    "GH200",
    "A100",
    "A10G",
    "A10",
    "A40",
    "L4",
    "L40S",
    "L40",
    "T4",
    "V100",
    "P100",
    "K80",
    "RTX_3090",
    "RTX_4090",
    "RTX_5090",
    "RTX_A4000",
    "RTX_A5000",
    "RTX_A6000",
    "MI250X",
    "MI300X",
    "Trainium",
    "Inferentia2",
    "TPUv4",
    "TPUv5e",
]


# --- the catalogue and its factories -------------------------------------------------


@pytest.mark.parametrize("factory", REQUIRED)
def test_every_required_factory_is_a_public_module_attribute(factory: str) -> None:
    fn = getattr(acc, factory)
    assert callable(fn)
    assert factory in acc.__all__
    assert factory in dir(acc)
    made = fn()
    assert isinstance(made, Accelerator)
    assert made.count == 1
    assert made.memory is not None and made.memory.endswith("GB")
    assert made.name in names()


@pytest.mark.parametrize("factory", REQUIRED)
def test_factories_are_keyword_only(factory: str) -> None:
    params = inspect.signature(getattr(acc, factory)).parameters
    assert "count" in params and "memory" in params
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    with pytest.raises(TypeError):
        getattr(acc, factory)(2)


def test_names_lists_canonical_names_of_the_whole_catalogue() -> None:
    listed = names()
    assert len(listed) == len(set(listed)) >= len(REQUIRED)
    assert "A100" in listed and "RTX 4090" in listed and "TPUv5e" in listed
    assert "RTX_4090" not in listed


def test_all_names_resolve() -> None:
    for name in acc.__all__:
        assert hasattr(acc, name)


@pytest.mark.parametrize(
    ("factory", "name", "memory", "manufacturer"),
    [
        ("H100", "H100", "80GB", "NVIDIA"),
        ("H200", "H200", "141GB", "NVIDIA"),
        ("B200", "B200", "180GB", "NVIDIA"),
        ("A100", "A100", "80GB", "NVIDIA"),
        ("A10G", "A10G", "24GB", "NVIDIA"),
        ("A10", "A10", "24GB", "NVIDIA"),
        ("A40", "A40", "48GB", "NVIDIA"),
        ("L4", "L4", "24GB", "NVIDIA"),
        ("L40S", "L40S", "48GB", "NVIDIA"),
        ("T4", "T4", "16GB", "NVIDIA"),
        ("V100", "V100", "16GB", "NVIDIA"),
        ("RTX_4090", "RTX 4090", "24GB", "NVIDIA"),
        ("RTX_A6000", "RTX A6000", "48GB", "NVIDIA"),
        ("MI300X", "MI300X", "192GB", "AMD"),
        ("TPUv4", "TPUv4", "32GB", "Google"),
        ("TPUv5e", "TPUv5e", "16GB", "Google"),
        ("Trainium", "Trainium1", "32GB", "AWS"),
    ],
)
def test_catalogue_defaults(factory: str, name: str, memory: str, manufacturer: str) -> None:
    made = getattr(acc, factory)()
    assert (made.name, made.memory, made.manufacturer) == (name, memory, manufacturer)


def test_memory_variants() -> None:
    assert A100(memory="40GB").memory == "40GB"
    assert A100(memory="40gb").memory == "40GB"
    assert A100(memory="40 GB").memory == "40GB"
    assert acc.V100(memory="32GB").memory_gb == 32.0
    assert A100().memory_gb == 80.0


def test_unknown_memory_variant_names_the_allowed_ones() -> None:
    with pytest.raises(AcceleratorError) as info:
        A100(memory="48GB")
    message = str(info.value)
    assert "48GB" in message and "80GB" in message and "40GB" in message
    assert "Custom" in message


def test_malformed_memory() -> None:
    with pytest.raises(AcceleratorError, match="not a size in GB"):
        A100(memory="lots")
    with pytest.raises(AcceleratorError):
        Custom("X", memory="0GB")


def test_form_factor() -> None:
    assert H100(form_factor="SXM").form_factor == "SXM"
    # Case does not matter; the catalogue spelling is kept.
    assert H100(form_factor="pcie").form_factor == "PCIe"
    assert H100().form_factor is None
    with pytest.raises(AcceleratorError) as info:
        H100(form_factor="OAM")
    assert "'OAM'" in str(info.value) and "SXM" in str(info.value) and "NVL" in str(info.value)


def test_form_factor_only_where_the_catalogue_has_some() -> None:
    assert "form_factor" in inspect.signature(H100).parameters
    assert "form_factor" not in inspect.signature(acc.T4).parameters


@pytest.mark.parametrize("count", [1, 8, 0.5, 0.25, 2.0])
def test_valid_counts(count: float) -> None:
    assert A100(count=count).count == count


@pytest.mark.parametrize("count", [0, -1, 1.5, float("nan"), float("inf"), True, "8"])
def test_invalid_counts(count: object) -> None:
    with pytest.raises(AcceleratorError) as info:
        A100(count=count)  # type: ignore[arg-type]
    assert repr(count) in str(info.value)


def test_accelerator_is_frozen_hashable_and_picklable() -> None:
    a = H100(count=8, form_factor="SXM")
    with pytest.raises(FrozenInstanceError):
        a.count = 4  # type: ignore[misc]
    assert {a: 1}[H100(count=8, form_factor="SXM")] == 1
    assert pickle.loads(pickle.dumps(a)) == a
    # Factories pickle by reference (they are module attributes with matching names).
    assert pickle.loads(pickle.dumps(A100)) is A100


def test_str() -> None:
    assert str(A100()) == "A100"
    assert str(A100(count=8)) == "A100:8"
    assert str(A100(count=8.0)) == "A100:8"
    assert str(acc.T4(count=0.5)) == "T4:0.5"
    assert str(A100(memory="40GB", count=2)) == "A100-40GB:2"
    assert str(RTX_4090(count=2)) == "RTX 4090:2"
    assert str(Custom("MyGPU", memory="48GB")) == "MyGPU-48GB"


def test_custom() -> None:
    c = Custom("MyGPU", memory="48GB", count=2)
    assert (c.name, c.memory, c.count, c.manufacturer) == ("MyGPU", "48GB", 2, "NVIDIA")
    assert c.memory_gb == 48.0
    assert Custom("MyGPU").memory_gb is None
    assert Custom("Gaudi2", manufacturer="Intel").manufacturer == "Intel"
    with pytest.raises(AcceleratorError):
        Custom("")
    with pytest.raises(AcceleratorError):
        Custom("MyGPU", count=0)


def test_direct_construction_is_validated() -> None:
    assert Accelerator("A100", memory="40").memory == "40GB"
    with pytest.raises(AcceleratorError):
        Accelerator("A100", count=-2)


# --- parse ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A100", A100()),
        ("a100", A100()),
        ("  A100  ", A100()),
        ("H100:8", H100(count=8)),
        ("T4:0.5", acc.T4(count=0.5)),
        ("A100-40GB", A100(memory="40GB")),
        ("a100-40gb:4", A100(memory="40GB", count=4)),
        ("A100 40GB", A100(memory="40GB")),
        ("RTX4090", RTX_4090()),
        ("rtx-4090", RTX_4090()),
        ("RTX_4090", RTX_4090()),
        ("RTX 4090", RTX_4090()),
        ("rtx_a6000:2", acc.RTX_A6000(count=2)),
        ("L40S", acc.L40S()),
        ("L40", acc.L40()),
        ("A10G", acc.A10G()),
        ("A10", acc.A10()),
        ("trn1", acc.Trainium()),
        ("inf2", acc.Inferentia2()),
        ("tpu-v5e", acc.TPUv5e()),
        ("TPU v4:8", acc.TPUv4(count=8)),
    ],
)
def test_parse(text: str, expected: Accelerator) -> None:
    assert parse(text) == expected


def test_parse_returns_accelerators_unchanged() -> None:
    a = H100(count=8, form_factor="SXM")
    assert parse(a) is a


@pytest.mark.parametrize("factory", REQUIRED)
def test_str_round_trips_through_parse(factory: str) -> None:
    for a in (getattr(acc, factory)(), getattr(acc, factory)(count=4)):
        assert parse(str(a)) == a
    assert parse(str(A100(memory="40GB", count=0.5))) == A100(memory="40GB", count=0.5)


def test_parse_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(AcceleratorError) as info:
        parse("A1000")
    message = str(info.value)
    assert "'A1000'" in message
    assert "Did you mean 'A100'" in message
    assert 'Custom("A1000")' in message


def test_parse_unknown_name_keeps_memory_in_the_custom_hint() -> None:
    with pytest.raises(AcceleratorError) as info:
        parse("rtx4900-24GB:2")
    message = str(info.value)
    assert "'RTX 4090'" in message
    assert 'Custom("rtx4900", memory="24GB", count=2)' in message


def test_parse_unknown_without_suggestion() -> None:
    with pytest.raises(AcceleratorError) as info:
        parse("quantum-annealer")
    assert "Did you mean" not in str(info.value)
    assert "names()" in str(info.value)


@pytest.mark.parametrize("text", ["H100:x", "H100:0", "H100:-1", "H100:", "H100:1.5", "H100:nan"])
def test_parse_bad_count(text: str) -> None:
    with pytest.raises(AcceleratorError) as info:
        parse(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("text", ["", "   ", "H100:8:2", "A100-48GB"])
def test_parse_other_errors(text: str) -> None:
    with pytest.raises(AcceleratorError):
        parse(text)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(AcceleratorError, match="int"):
        parse(100)  # type: ignore[arg-type]


def test_accelerator_error_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse("nope")
    with pytest.raises(ValueError):
        parse("nope")


def test_import_is_stdlib_only() -> None:
    import subprocess
    import sys

    code = (
        "import sys, skyward.accelerators; "
        "heavy = {'numpy', 'torch', 'pandas'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- every name of the reference catalogue ---------------------------------------------

# The reference's factory names, as its users write them (sky.accelerators.<name>()).
_REFERENCE_NAMES = """
H100 H200 GH200 B100 B200 GB200 A100 A800 A40 A10 A10G A16 A2 L4 L40 L40S T4 T4G V100 P100 P40 P4
K80 RTX_5090 RTX_5080 RTX_5070_Ti RTX_5070 RTX_5060_Ti RTX_5060 RTX_4090 RTX_4090D RTX_4080_Super
RTX_4080 RTX_4070_Ti_Super RTX_4070_Ti RTX_4070_Super RTX_4070 RTX_4060_Ti RTX_4060 RTX_3090_Ti
RTX_3090 RTX_3080_Ti RTX_3080 RTX_3070_Ti RTX_3070 RTX_3060_Ti RTX_3060 RTX_3060_Laptop RTX_3050
RTX_2080_Ti RTX_2080_Super RTX_2080 RTX_2070_Super RTX_2070 RTX_2060_Super RTX_2060 GTX_1660_Ti
GTX_1660_Super GTX_1660 GTX_1080_Ti GTX_1080 GTX_1070_Ti GTX_1070 GTX_1060 Titan_Xp Titan_V
RTX_6000_Ada RTX_5880_Ada RTX_5000_Ada RTX_PRO_6000 RTX_PRO_4000 RTX_PRO_4500 RTX_A6000 RTX_A5000
RTX_A5000_Pro RTX_A4000 RTX_A2000 Quadro_RTX_8000 Quadro_RTX_6000 Quadro_RTX_5000 Quadro_RTX_4000
Quadro_P4000 MI300X MI300B MI300A MI250X MI250 MI210 MI100 MI50 RadeonPro_V710 RadeonPro_V520
Instinct_MI25 Trainium1 Trainium2 Trainium3 Inferentia1 Inferentia2 Gaudi Gaudi2 Gaudi3 TPUv2 TPUv3
TPUv4 TPUv5e TPUv5p TPUv6 TPUv2_8 TPUv3_8 TPUv3_32 TPUv4_64 TPUv5e_4 TPUv5p_8
"""
REFERENCE = _REFERENCE_NAMES.split()


@pytest.mark.parametrize("factory", REFERENCE)
def test_every_reference_name_is_a_factory_that_round_trips(factory: str) -> None:
    fn = getattr(acc, factory)
    assert factory in acc.__all__
    made = fn()
    assert made.name in names() and made.memory is not None
    assert fn(count=2).count == 2 * made.count
    # The factory's own name parses, in the spellings people write it.
    assert parse(factory) == made
    assert parse(factory.replace("_", "-").lower()) == made
    assert parse(str(made)) == made and parse(str(fn(count=2))) == fn(count=2)
    assert pickle.loads(pickle.dumps(made)) == made


def test_no_two_catalogue_rows_share_a_spelling() -> None:
    # Import asserts it too; this says it where a reader of the tests looks.
    keys = [n.replace(" ", "").upper() for n in names()]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    ("factory", "name", "memory", "manufacturer"),
    [
        ("T4G", "T4G", "16GB", "NVIDIA"),
        ("GTX_1080_Ti", "GTX 1080 Ti", "11GB", "NVIDIA"),
        ("Titan_V", "Titan V", "12GB", "NVIDIA"),
        ("RTX_6000_Ada", "RTX 6000 Ada", "48GB", "NVIDIA"),
        ("RTX_PRO_6000", "RTX PRO 6000", "96GB", "NVIDIA"),
        ("Quadro_RTX_8000", "Quadro RTX 8000", "48GB", "NVIDIA"),
        ("RadeonPro_V520", "Radeon Pro V520", "8GB", "AMD"),
        ("Instinct_MI25", "MI25", "16GB", "AMD"),
        ("MI300A", "MI300A", "128GB", "AMD"),
        ("Gaudi2", "Gaudi2", "96GB", "Intel"),
        ("Inferentia1", "Inferentia1", "8GB", "AWS"),
        ("Trainium2", "Trainium2", "96GB", "AWS"),
        ("TPUv5p", "TPUv5p", "95GB", "Google"),
        ("TPUv6", "TPUv6", "32GB", "Google"),
    ],
)
def test_new_catalogue_rows(factory: str, name: str, memory: str, manufacturer: str) -> None:
    made = getattr(acc, factory)()
    assert (made.name, made.memory, made.manufacturer) == (name, memory, manufacturer)


def test_memory_options_of_new_rows() -> None:
    assert acc.RTX_3080(memory="12GB").memory == "12GB"
    assert acc.RTX_4060_Ti(memory="16GB").memory_gb == 16.0
    assert acc.A800(memory="40GB").memory == "40GB"
    with pytest.raises(AcceleratorError, match="10GB"):
        acc.RTX_3080(memory="20GB")


def test_second_names_are_the_same_entry() -> None:
    assert acc.Trainium() == acc.Trainium1() and acc.Trainium is acc.Trainium1
    assert acc.Instinct_MI25() == acc.MI25()
    assert parse("trn1") == parse("Trainium") == acc.Trainium1()
    assert parse("trn2:16") == acc.Trainium2(count=16)
    assert parse("inf1") == acc.Inferentia1()
    assert parse("dl1") == acc.Gaudi()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TPUv5e-4", acc.TPUv5e(count=4)),
        ("v5litepod-8", acc.TPUv5e(count=8)),
        ("v4-64", acc.TPUv4(count=64)),
        ("TPU v5p-8:2", acc.TPUv5p(count=16)),
        ("v6e-8", acc.TPUv6(count=8)),
        ("trillium:4", acc.TPUv6(count=4)),
        ("tpuv3_32", acc.TPUv3(count=32)),
    ],
)
def test_tpu_slices_parse_as_the_tpu_with_the_slice_size_as_count(text: str, expected: Accelerator) -> None:
    assert parse(text) == expected


def test_slice_factories_multiply_their_size() -> None:
    assert acc.TPUv5e_4() == acc.TPUv5e(count=4)
    assert acc.TPUv4_64(count=2) == acc.TPUv4(count=128)
    assert acc.TPUv2_8().memory == "8GB" and acc.TPUv2_8().count == 8
    with pytest.raises(AcceleratorError, match="TPUv5e_4"):
        acc.TPUv5e_4(count=0)
    assert "count" in inspect.signature(acc.TPUv5p_8).parameters
    assert pickle.loads(pickle.dumps(acc.TPUv5p_8)) is acc.TPUv5p_8


def test_a_slice_size_only_applies_to_tpus() -> None:
    with pytest.raises(AcceleratorError, match="unknown accelerator"):
        parse("A100-8")


def test_reference_spellings_of_options_are_accepted() -> None:
    assert H100(memory="40GB").memory == "40GB"
    assert Custom("My-GPU", memory="", count=2).memory is None
    assert Custom("H100-Custom", memory="80GB", cuda_min="12.0", cuda_max="13.1").memory == "80GB"
