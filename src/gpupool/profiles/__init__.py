"""Device profiles: one YAML description per device model, validated on load.

Adding a chip is adding a file here, or in a directory named by GPUPOOL_PROFILES_DIR.
"""

from gpupool.profiles.loader import (
    PROFILES_DIR_ENV,
    DeviceProfile,
    Interconnect,
    InterconnectKind,
    MigProfile,
    ProfileKind,
    ProfileSet,
    Sharing,
    Vendor,
    VisibleBy,
    default_profiles,
    find_profile,
    get_profile,
    load_profile_file,
    load_profiles,
)

__all__ = [
    "PROFILES_DIR_ENV",
    "DeviceProfile",
    "Interconnect",
    "InterconnectKind",
    "MigProfile",
    "ProfileKind",
    "ProfileSet",
    "Sharing",
    "Vendor",
    "VisibleBy",
    "default_profiles",
    "find_profile",
    "get_profile",
    "load_profile_file",
    "load_profiles",
]
