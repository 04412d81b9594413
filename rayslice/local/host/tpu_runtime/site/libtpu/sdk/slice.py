"""The simulated ``libtpu.sdk.slice``: where this host's chips sit in the slice.

``get_chip_coordinates()`` returns one object per chip of this host with ``hostname()``,
``chip_index()`` and ``coordinates()``, the calls Ray 2.60's ``ray.util.tpu``
(``_discover_tpu_node_coords``, behind ``SubslicePlacementGroup``) makes. The coordinates are
those a real slice of the host's topology gives its chips (`rayslice_simulated_tpu.chip_coordinates`).
"""

from __future__ import annotations

import rayslice_simulated_tpu as runtime  # type: ignore[import-not-found]  # beside this package


class ChipCoordinate:
    def __init__(self, hostname: str, chip_index: int, coordinates: tuple[int, ...]):
        self._hostname = hostname
        self._chip_index = chip_index
        self._coordinates = coordinates

    def hostname(self) -> str:
        return self._hostname

    def chip_index(self) -> int:
        return self._chip_index

    def coordinates(self) -> tuple[int, ...]:
        return self._coordinates

    def __repr__(self) -> str:
        return f"ChipCoordinate({self._hostname!r}, {self._chip_index}, {self._coordinates})"


def get_chip_coordinates() -> list[ChipCoordinate]:
    return [ChipCoordinate(*chip) for chip in runtime.host_chip_coordinates()]
