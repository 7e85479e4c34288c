"""Running plait programs beyond one machine (the ``ray`` extra).

`map_dataset` runs a program over a Ray Dataset (``ray.data``); `PlaitMapper`
is the callable class behind it, for ``ds.map_batches`` directly. Endpoint
limits (``max_concurrent``, ``rpm``, ``tpm``) hold across the whole cluster:
one named Ray actor per endpoint (`EndpointLimits`) lends every worker its
permits and tokens in leases (`plait.distributed.leases`). Ray is imported
only when these names are first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plait.distributed.ray import EndpointLimits, PlaitMapper, map_dataset

__all__ = ["EndpointLimits", "PlaitMapper", "map_dataset"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("plait.distributed.ray"), name)
    raise AttributeError(f"module 'plait.distributed' has no attribute {name!r}")
