"""The learning layer: losses, backward through tapes, optimizers and training loops."""

from plait.optimization.backward import BackwardReport, backward
from plait.optimization.losses import Loss, VerifierLoss
from plait.optimization.step import TrainingStep

__all__ = ["BackwardReport", "Loss", "TrainingStep", "VerifierLoss", "backward"]
