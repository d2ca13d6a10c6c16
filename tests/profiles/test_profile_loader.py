"""Device profiles: every built-in file validates, lookups work, new files are picked up, bad ones explain."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.errors import ProfileError, UnknownName
from gpupool.profiles import PROFILES_DIR_ENV, ProfileKind, default_profiles, load_profiles

REQUIRED = ["H200", "H100-SXM-80GB", "A100-80GB", "A10", "L40S", "V100M16", "V100M32", "T4", "P100",
            "MI300X", "Ascend910B", "Z100", "G2", "G3"]

NEW_CHIP = """\
model: B200
display_name: NVIDIA B200
vendor: nvidia
kind: gpu
memory_mib: 184320
visible_devices_env: CUDA_VISIBLE_DEVICES
"""


def test_builtin_profiles_cover_the_required_models() -> None:
    profiles = load_profiles()
    assert set(REQUIRED) <= set(profiles)


def test_openb_anonymised_models_have_unknown_memory() -> None:
    profiles = load_profiles()
    assert profiles["G2"].memory_mib == 0 and not profiles["G2"].memory_known
    assert profiles["G3"].memory_mib == 0
    assert profiles["V100M32"].memory_mib == 32 * 1024


def test_kinds_and_vendor_variables() -> None:
    profiles = load_profiles()
    assert profiles["Ascend910B"].kind is ProfileKind.NPU
    assert profiles["Ascend910B"].visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert profiles["Z100"].kind is ProfileKind.DCU
    assert profiles["Z100"].visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert profiles["MI300X"].visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert profiles["H100-SXM-80GB"].visible_devices_env == "CUDA_VISIBLE_DEVICES"


def test_mig_only_where_the_device_has_it() -> None:
    profiles = load_profiles()
    assert {p.model for p in profiles.values() if p.has_mig} == {"H200", "H100-SXM-80GB", "A100-80GB"}
    names = [m.name for m in profiles["H100-SXM-80GB"].sharing.mig]
    assert "1g.10gb" in names and "7g.80gb" in names


@pytest.mark.parametrize(
    ("name", "model"),
    [("H100", "H100-SXM-80GB"), ("h100 sxm 80gb", "H100-SXM-80GB"), ("v100m32", "V100M32"),
     ("V100M16", "V100M16"), ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"), ("Tesla T4", "T4"),
     ("a100", "A100-80GB"), ("ascend 910b", "Ascend910B")],
)
def test_lookup_by_name_or_alias_ignores_case(name: str, model: str) -> None:
    assert load_profiles().get_profile(name).model == model


def test_unknown_model_suggests_a_close_name() -> None:
    with pytest.raises(UnknownName, match="Did you mean 'V100M32'"):
        load_profiles().get_profile("V100M33")


def test_new_file_is_picked_up_without_code_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "b200.yaml").write_text(NEW_CHIP)
    monkeypatch.setenv(PROFILES_DIR_ENV, str(tmp_path))
    profiles = load_profiles()
    assert profiles.get_profile("b200").memory_mib == 184320
    assert default_profiles().find("B200") is not None
    assert set(REQUIRED) <= set(profiles)


def test_extra_dir_replaces_a_builtin_of_the_same_model(tmp_path: Path) -> None:
    (tmp_path / "t4.yaml").write_text(
        "model: T4\ndisplay_name: T4\nvendor: nvidia\nkind: gpu\nmemory_mib: 15360\n"
        "visible_devices_env: CUDA_VISIBLE_DEVICES\n"
    )
    assert load_profiles(extra_dirs=[tmp_path])["T4"].memory_mib == 15360


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (NEW_CHIP + "memroy_mib: 1\n", "memroy_mib"),
        (NEW_CHIP.replace("memory_mib: 184320", "memory_mib: lots"), "memory_mib"),
        (NEW_CHIP.replace("kind: gpu", "kind: tpu"), "kind"),
        (NEW_CHIP + "sharing: {mig: [{name: 1g.10gb, compute_slices: 9, memory_mib: 1, max_instances: 1}]}\n",
         "sharing.mig.0.compute_slices"),
    ],
)
def test_bad_file_names_file_and_field(tmp_path: Path, body: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ProfileError) as info:
        load_profiles(extra_dirs=[tmp_path])
    assert str(path) in info.value.message
    assert repr(field) in info.value.message
    assert info.value.details["field"] == field


def test_invalid_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model: X\n  vendor: [nvidia\n")
    with pytest.raises(ProfileError, match=r"broken\.yaml.*not valid YAML at line"):
        load_profiles(extra_dirs=[tmp_path])


def test_duplicate_names_in_one_directory_are_rejected(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(NEW_CHIP)
    (tmp_path / "b.yaml").write_text(NEW_CHIP.replace("display_name: NVIDIA B200", "display_name: again"))
    with pytest.raises(ProfileError, match="already used"):
        load_profiles(extra_dirs=[tmp_path])


def test_missing_profile_dir_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROFILES_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(ProfileError, match="does not exist"):
        load_profiles()
