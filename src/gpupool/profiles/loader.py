"""Load and validate device profiles (one YAML file per device model) and look them up by name."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpupool.errors import InvalidInput, ProfileError, UnknownName, closest
from gpupool.yamlfiles import read_text, safe_load

PROFILES_DIR_ENV = "GPUPOOL_PROFILES_DIR"
"""Extra profile directories (separated by os.pathsep) read after the built-in ones."""

BUILTIN_DIR = Path(__file__).parent


class ProfileKind(StrEnum):
    GPU = "gpu"
    NPU = "npu"
    DCU = "dcu"


class Vendor(StrEnum):
    NVIDIA = "nvidia"
    AMD = "amd"
    HUAWEI = "huawei"
    HYGON = "hygon"
    UNKNOWN = "unknown"


class InterconnectKind(StrEnum):
    NVLINK = "nvlink"
    XGMI = "xgmi"
    HCCS = "hccs"
    PCIE = "pcie"


class VisibleBy(StrEnum):
    """How the vendor's visible-devices variable names a device."""

    UUID = "uuid"
    INDEX = "index"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Interconnect(_Strict):
    """The fastest device-to-device link inside one node."""

    kind: InterconnectKind
    bandwidth_gb_s: float = Field(gt=0, description="gigabytes per second per device, both directions")


class MigProfile(_Strict):
    """One Multi-Instance GPU partition shape the device supports."""

    name: str = Field(pattern=r"^\d+g\.\d+gb$")
    compute_slices: int = Field(ge=1, le=8)
    memory_mib: int = Field(gt=0)
    max_instances: int = Field(ge=1, le=8)


class Sharing(_Strict):
    """Which sharing mechanisms the device supports."""

    mps: bool = False
    mps_limits: bool = Field(
        default=False, description="MPS can cap a client's threads and pinned memory (Volta or newer)"
    )
    time_slice: bool = True
    mig: tuple[MigProfile, ...] = ()


class DeviceProfile(_Strict):
    """A device model's description: the figures scheduling, isolation and billing use."""

    model: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    display_name: str
    vendor: Vendor
    kind: ProfileKind
    aliases: tuple[str, ...] = ()
    memory_mib: int = Field(ge=0, description="0 = unknown (anonymised models)")
    memory_bandwidth_gb_s: float | None = Field(default=None, gt=0)
    compute_units: int | None = Field(default=None, gt=0)
    compute_unit_name: str = "SM"
    bf16_tflops: float | None = Field(default=None, gt=0, description="dense, no sparsity")
    fp16_tflops: float | None = Field(default=None, gt=0, description="dense, no sparsity")
    interconnect: Interconnect | None = None
    pcie_gen: int | None = Field(default=None, ge=1, le=7)
    sharing: Sharing = Sharing()
    visible_devices_env: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$")
    visible_devices_by: VisibleBy = VisibleBy.UUID
    price_usd_per_hour: float | None = Field(default=None, ge=0, description="reference only")
    source: str = ""
    notes: str = ""

    @field_validator("aliases")
    @classmethod
    def _aliases_not_blank(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not a.strip() for a in value):
            raise ValueError("aliases must not be blank")
        return value

    @property
    def memory_known(self) -> bool:
        return self.memory_mib > 0

    @property
    def has_mig(self) -> bool:
        return bool(self.sharing.mig)

    def names(self) -> tuple[str, ...]:
        """The model name followed by every alias."""
        return (self.model, *self.aliases)


def name_key(name: str) -> str:
    """Case- and punctuation-insensitive lookup key: 'H100 SXM-80GB' -> 'h100sxm80gb'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_key = name_key


def _field_path(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def load_profile_file(path: Path) -> DeviceProfile:
    """Read and validate one profile file; a problem raises ProfileError naming file and field."""
    try:
        raw: Any = safe_load(read_text(path, "the profile file"))
    except OSError as exc:
        raise ProfileError(
            f"{path}: cannot read the profile file ({exc.strerror}).", file=str(path)
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise ProfileError(
            f"{path}: the file is not valid YAML{where}" + (f" ({problem})" if problem else "")
            + "; fix the syntax.", file=str(path)
        ) from None
    except InvalidInput as exc:
        raise ProfileError(exc.message, file=str(path)) from None
    if not isinstance(raw, dict):
        raise ProfileError(
            f"{path}: a profile must be a YAML mapping of fields such as model, vendor, kind, memory_mib.",
            file=str(path),
        )
    try:
        return DeviceProfile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(first["loc"])
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise ProfileError(
            f"{path}: field {field!r}: {first['msg']}{more}; fix that field.", file=str(path), field=field
        ) from None


class ProfileSet(Mapping[str, DeviceProfile]):
    """Profiles by model name, with case-insensitive lookup by model name or alias."""

    def __init__(self, profiles: Sequence[DeviceProfile]) -> None:
        self._by_model: dict[str, DeviceProfile] = {p.model: p for p in profiles}
        self._index: dict[str, str] = {}
        # Model names win over aliases, so an alias can never shadow another profile's model name.
        for profile in self._by_model.values():
            for alias in profile.aliases:
                self._index.setdefault(_key(alias), profile.model)
        for profile in self._by_model.values():
            self._index[_key(profile.model)] = profile.model

    def __getitem__(self, model: str) -> DeviceProfile:
        return self._by_model[model]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._by_model))

    def __len__(self) -> int:
        return len(self._by_model)

    def find(self, name: str) -> DeviceProfile | None:
        """The profile whose model name or alias matches `name` (case- and punctuation-insensitive)."""
        model = self._index.get(_key(name))
        return self._by_model[model] if model is not None else None

    def get_profile(self, name: str) -> DeviceProfile:
        """Like find() but raise UnknownName with a did-you-mean suggestion."""
        profile = self.find(name)
        if profile is None:
            raise UnknownName(
                f"Unknown device model {name!r}; known models: {', '.join(self)}." + self._nearest(name),
                name=name,
            )
        return profile

    def _nearest(self, name: str) -> str:
        """' Did you mean ...?' among model names and aliases too: a mistyped short name ('H1000')
        is nearer its alias ('H100') than the long model name, and another short name ('Z100')
        would otherwise win."""
        names = [*self, *(alias for p in self._by_model.values() for alias in p.aliases)]
        close = closest(name, names)
        if close is None:
            return ""
        model = self._index[_key(close)]
        return f" Did you mean {close!r}?" if close == model else f" Did you mean {close!r} ({model})?"


def _profile_dirs(extra_dirs: Sequence[Path | str]) -> list[tuple[Path, str]]:
    """Each directory to read, with the sentence's end when it is missing: where it was named."""
    dirs = [(BUILTIN_DIR, "gpupool's own profiles are missing; reinstall gpupool")]
    env = os.environ.get(PROFILES_DIR_ENV, "")
    named_by_env = f"create it or unset {PROFILES_DIR_ENV}, which names it"
    dirs += [(Path(d), named_by_env) for d in env.split(os.pathsep) if d]
    dirs += [(Path(d), "create it or give --dir an existing directory") for d in extra_dirs]
    return dirs


def load_profiles(extra_dirs: Sequence[Path | str] = ()) -> ProfileSet:
    """All profiles: the built-in files, then GPUPOOL_PROFILES_DIR, then `extra_dirs`.

    A later directory's file with the same model name replaces the earlier one, so an operator can
    correct a figure without editing the package. Two files with the same model (or a model and an
    alias that collide) in one directory raise ProfileError.
    """
    by_model: dict[str, DeviceProfile] = {}
    for directory, instead in _profile_dirs(extra_dirs):
        if not directory.is_dir():
            raise ProfileError(
                f"{directory}: profile directory does not exist; {instead}.",
                file=str(directory),
            )
        seen: dict[str, Path] = {}
        for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
            profile = load_profile_file(path)
            for name in profile.names():
                other = seen.get(_key(name))
                if other is not None and other != path:
                    raise ProfileError(
                        f"{path}: name {name!r} is already used by {other.name}; give each model a "
                        "unique name and aliases.",
                        file=str(path),
                        field="model",
                    )
                seen[_key(name)] = path
            by_model[profile.model] = profile
    return ProfileSet(list(by_model.values()))


_cache: dict[str, ProfileSet] = {}


def default_profiles() -> ProfileSet:
    """load_profiles() cached per value of GPUPOOL_PROFILES_DIR (profiles do not change at run time)."""
    env = os.environ.get(PROFILES_DIR_ENV, "")
    if env not in _cache:
        _cache[env] = load_profiles()
    return _cache[env]


def get_profile(name: str) -> DeviceProfile:
    """Look up a profile by model name or alias, case-insensitive; raises UnknownName."""
    return default_profiles().get_profile(name)


def find_profile(name: str) -> DeviceProfile | None:
    """Look up a profile by model name or alias, case-insensitive; None when unknown."""
    return default_profiles().find(name)
