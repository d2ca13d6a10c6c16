"""InfiniBand link rates: lane speeds, widths and line encodings, as ibnetdiscover names them."""

from __future__ import annotations

import re
from enum import StrEnum

from gpupool.errors import InvalidInput


class LinkSpeed(StrEnum):
    """Per-lane signalling generation, in the order the standards introduced them."""

    SDR = "SDR"
    DDR = "DDR"
    QDR = "QDR"
    FDR10 = "FDR10"
    FDR = "FDR"
    EDR = "EDR"
    HDR = "HDR"
    NDR = "NDR"
    XDR = "XDR"


# Nominal per-lane rate in Gb/s as /sys/class/infiniband/*/ports/*/rate reports it.
LANE_RATE_GBPS: dict[LinkSpeed, float] = {
    LinkSpeed.SDR: 2.5,
    LinkSpeed.DDR: 5.0,
    LinkSpeed.QDR: 10.0,
    LinkSpeed.FDR10: 10.0,
    LinkSpeed.FDR: 14.0,
    LinkSpeed.EDR: 25.0,
    LinkSpeed.HDR: 50.0,
    LinkSpeed.NDR: 100.0,
    LinkSpeed.XDR: 200.0,
}

# 8b/10b line code up to QDR; 64b/66b from FDR10 on.
_EIGHT_TEN = {LinkSpeed.SDR, LinkSpeed.DDR, LinkSpeed.QDR}

SPEED_ORDER: dict[LinkSpeed, int] = {speed: rank for rank, speed in enumerate(LinkSpeed)}

VALID_WIDTHS = (1, 2, 4, 8, 12)

_WIDTH_SPEED = re.compile(r"^(\d+)[xX]([A-Za-z]+[0-9]*)$")


def encoding_efficiency(speed: LinkSpeed) -> float:
    """Share of the signalling rate left for data after line encoding."""
    return 0.8 if speed in _EIGHT_TEN else 64.0 / 66.0


def signal_rate_gbps(width: int, speed: LinkSpeed) -> float:
    """Width x nominal lane rate: what the kernel reports (4x QDR = 40 Gb/s)."""
    return width * LANE_RATE_GBPS[speed]


def data_rate_gbps(width: int, speed: LinkSpeed) -> float:
    """Effective data rate after line encoding (4x QDR = 32 Gb/s)."""
    return signal_rate_gbps(width, speed) * encoding_efficiency(speed)


def parse_speed(text: str) -> LinkSpeed:
    """'QDR' -> LinkSpeed.QDR; raises InvalidInput naming the known speeds."""
    try:
        return LinkSpeed(text.upper())
    except ValueError:
        known = ", ".join(s.value for s in LinkSpeed)
        raise InvalidInput(f"Unknown link speed {text!r}; expected one of {known}.") from None


def parse_width_speed(token: str) -> tuple[int, LinkSpeed]:
    """'4xQDR' -> (4, QDR); raises InvalidInput for anything else."""
    match = _WIDTH_SPEED.match(token.strip())
    if not match:
        raise InvalidInput(f"Expected a link width and speed such as '4xQDR', got {token!r}.")
    width = int(match.group(1))
    if width not in VALID_WIDTHS:
        raise InvalidInput(f"Link width {width}x is not one of 1x, 2x, 4x, 8x, 12x.")
    return width, parse_speed(match.group(2))


def format_width_speed(width: int, speed: LinkSpeed) -> str:
    """(4, QDR) -> '4xQDR', the token ibnetdiscover prints."""
    return f"{width}x{speed.value}"
