"""One unit rule and the words of each kind of device, for every command's output.

A GiB is 2**30 bytes everywhere (tables, summaries, plots, ``targets``, the HTML report). A
one-tile device (a GPU: the whole device memory is one pool) speaks GiB, "device" and the
operations and modules of the profile; a many-tile device (an IPU) speaks tiles, bytes per
tile and code categories (vertex code, exchange code), which mean nothing on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.text import seconds_text

__all__ = ["GIB", "DeviceWords", "device_words", "gib_text"]

GIB = 2**30


def gib_text(value: float, digits: int = 2) -> str:
    return f"{value / GIB:,.{digits}f}"


@dataclass(frozen=True)
class DeviceWords:
    """How output names memory on this device: ``one_tile`` (a GPU) or per tile (an IPU)."""

    one_tile: bool

    @property
    def memory_unit(self) -> str:
        return "GiB" if self.one_tile else "bytes"

    @property
    def where(self) -> str:
        """What memory is counted on: the device, or its fullest tile."""
        return "device" if self.one_tile else "worst tile"

    def bytes(self, value: float) -> str:
        """A byte count as this device's user reads it: 1.23 GiB, or 123,456 bytes."""
        return f"{gib_text(value)} GiB" if self.one_tile else f"{int(value):,} bytes"

    def bytes_of(self, used: float, capacity: float) -> str:
        """``92.10 of 80.00 GiB`` or ``700,000 of 638,976 bytes``."""
        if self.one_tile:
            return f"{gib_text(used)} of {gib_text(capacity)} GiB"
        return f"{int(used):,} of {int(capacity):,} bytes"

    def seconds(self, value: float) -> str:
        return seconds_text(value)


def device_words(tiles: int) -> DeviceWords:
    """The words for a device of ``tiles`` tiles (1: a GPU)."""
    return DeviceWords(one_tile=tiles == 1)
