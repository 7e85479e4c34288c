"""A Trainer's checkpoint: ``trainer.json`` in its ``checkpoint_dir``, and what it resumes from.

Rewritten (atomically, through `plait._files`) after every minibatch and every
validation: parameters, optimizer state, position (epoch, next minibatch), scores
and the best parameters, with the settings and data digests it was written for; a
new `Trainer` on the same directory continues from there, and a file of other
settings or data is refused before any call.

Without ``checkpoint_dir`` and with ``state=`` (a state store), the same document
is one key of the store's table ``learning`` (`plait.optimization.checkpoint_place`):
``trainer/<digest of the settings and data>``, so a training stopped on one machine
resumes on another; one whose parameters the program cannot take (another
program) is refused as a file's is.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from plait.execution.checkpoint_codec import CheckpointError
from plait.optimization.checkpoint_place import CheckpointPlace

if TYPE_CHECKING:
    from plait.optimization.training.trainer_parts import TrainerParts

logger = logging.getLogger("plait.optimization")

CHECKPOINT_FILE = "trainer.json"

CHECKPOINT_FORMAT = "plait.trainer/1"

_PROGRESS_KEYS = ("epoch", "batch", "initial_score", "scores", "best")
"""Where a training run was, as its checkpoint keeps it."""

_CHECKPOINT_KEYS = ("settings", "parameters", "optimizer", *_PROGRESS_KEYS)
"""What a Trainer checkpoint holds; a file without one of them cannot resume."""


class CheckpointedTrainer:
    """The checkpoint of a `Trainer` (its mixin: what it uses of the Trainer is `TrainerParts`)."""

    _data_digests: tuple[str, str] | None
    """The digests of the training and validation sets, once computed (`_settings`)."""

    def _position(self: TrainerParts) -> tuple[int, int] | None:
        """(epoch, minibatch) the checkpoint would resume from; None without one.

        Read without restoring anything: `fit` checks the checkpoint in full.
        """
        place = self._place()
        data = place.read(place.remedy("another checkpoint_dir"))
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            return None
        epoch, batch = data.get("epoch"), data.get("batch")
        if not (isinstance(epoch, int) and isinstance(batch, int)):
            return None
        return (epoch, batch)

    def _place(self: TrainerParts) -> CheckpointPlace:
        """Where the checkpoint is kept: ``trainer.json`` in ``checkpoint_dir``, else a key
        of the ``state`` store named by the settings and data, else nowhere."""
        # import time: the search package, only for a checkpoint
        from plait.optimization.search.checkpoint import digest

        path = self.checkpoint_dir / CHECKPOINT_FILE if self.checkpoint_dir is not None else None
        key = f"trainer/{digest(self._settings())}" if self.state is not None else ""
        return CheckpointPlace(path, state=self.state, key=key)

    def _kept_in(self: TrainerParts) -> str | None:
        """The argument naming where the checkpoint is kept, for the report; None: nowhere."""
        if self.checkpoint_dir is not None:
            return "checkpoint_dir"
        return "state" if self.state is not None else None

    def _settings(self: TrainerParts) -> dict[str, Any]:
        """What a checkpoint must have been written for to be resumed by this Trainer (the
        data digested once: every minibatch's checkpoint writes them)."""
        # import time: the search package, only for a checkpoint
        from plait.optimization.search.checkpoint import digest

        digests = self._data_digests
        if digests is None:
            digests = self._data_digests = (digest(self.train_set), digest(self.val_set))
        train, val = digests
        return {
            "train_size": len(self.train_set),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "train_set": train,
            "val_set": val,
        }

    def _other_settings(self: TrainerParts, written: Any) -> list[str]:
        """Returns what differs between the settings a checkpoint was ``written`` for and
        this Trainer's, in words; a file written before the data were digested is checked
        on the settings it has."""
        mine = self._settings()
        if not isinstance(written, dict):
            return [f"settings {written!r}"]
        words = {"train_set": "another training set", "val_set": "another validation set"}
        return [
            words.get(key, f"{key}={written[key]!r} (this Trainer has {mine[key]!r})")
            for key in mine
            if key in written and written[key] != mine[key]
        ] + [f"the setting {key!r}" for key in written if key not in mine]

    def _save(self: TrainerParts, state: dict[str, Any]) -> None:
        place = self._writing
        if not place.kept:
            return
        if self.checkpoint_dir is not None:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "format": CHECKPOINT_FORMAT,
            "settings": self._settings(),
            **state,
            "parameters": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        place.write(json.dumps(data, ensure_ascii=False, indent=1))

    def _load(self: TrainerParts) -> dict[str, Any] | None:
        data = self._read_checkpoint()
        if data is None:
            return None
        place = self._place()
        path, remedy = place.name, place.remedy("another checkpoint_dir")
        try:
            self.module.load_state_dict(data["parameters"])
            self.optimizer.load_state_dict(data["optimizer"])
        except (KeyError, TypeError, ValueError) as exc:
            text = exc.args[0] if exc.args else exc
            raise CheckpointError(f"{path} cannot be restored ({text}): {remedy}") from None
        logger.info(
            "Trainer: resuming from %s at epoch %d, minibatch %d",
            path,
            data["epoch"],
            data["batch"],
        )
        return {key: data[key] for key in _PROGRESS_KEYS}

    def _read_checkpoint(self: TrainerParts) -> dict[str, Any] | None:
        """Reads and checks the checkpoint, changing nothing (`plait train` asks before it
        runs); None when there is none.

        Raises:
            ValueError: a file of another kind, or written for other settings or data.
            CheckpointError: unreadable, or without a field a resume needs.
        """
        place = self._place()
        path, remedy = place.name, place.remedy("another checkpoint_dir")
        data = place.read(remedy)
        if data is None:
            return None
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a plait Trainer checkpoint: {remedy}")
        missing = [key for key in _CHECKPOINT_KEYS if key not in data]
        if missing:
            raise CheckpointError(f"{path} has no {', '.join(missing)}: {remedy}")
        other = self._other_settings(data["settings"])
        if other:
            raise ValueError(
                f"{path} was written for {', '.join(other)}; use another checkpoint_dir, or "
                "delete the file to start over"
            )
        return data
