"""What the parts of a `Trainer` use of it: a Protocol, for the type checker only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from plait.module import Module
from plait.optimization.checkpoint_place import CheckpointPlace
from plait.optimization.training.optimizer import Optimizer
from plait.optimization.training.step import TrainingStep
from plait.resources.state import StateURL


class TrainerParts(Protocol):
    """What the parts of a `Trainer` (its checkpoint, its estimate) use of it."""

    step: TrainingStep
    module: Module
    optimizer: Optimizer
    resources: Any
    train_set: list[tuple[Any, Any]]
    val_set: list[tuple[Any, Any]]
    epochs: int
    batch_size: int
    checkpoint_dir: Path | None
    state: StateURL | None
    shuffle: bool
    seed: int
    max_concurrent: int | None
    max_calls: int | None
    max_tokens: int | None
    max_cost: float | None
    _data_digests: tuple[str, str] | None
    _writing: CheckpointPlace

    def _batches(self) -> int: ...

    def _check_optimizer_alias(self) -> None: ...

    def _position(self) -> tuple[int, int] | None: ...

    def _settings(self) -> dict[str, Any]: ...

    def _place(self) -> CheckpointPlace: ...

    def _other_settings(self, written: Any) -> list[str]: ...

    def _read_checkpoint(self) -> dict[str, Any] | None: ...

    def _minibatch_sizes_left(self, position: tuple[int, int]) -> list[int]: ...

    async def _estimate(self, sample: int) -> Any: ...

    async def _sampled_step(self, sample: int, least_calls: int) -> tuple[Any, Any]: ...
