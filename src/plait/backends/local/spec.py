"""What plait knows about the ``local`` provider without loading llama-cpp-python."""

from __future__ import annotations

from typing import Any

from plait.backends.spec import ProviderSpec

__all__ = ["SPEC"]


def _arguments(config: Any) -> dict[str, Any]:
    """The GGUF file (None: the embedded model) and its context window; no model name."""
    kwargs: dict[str, Any] = {"model_path": config.model_path}
    if config.n_ctx is not None:
        kwargs["n_ctx"] = config.n_ctx
    return kwargs


SPEC = ProviderSpec(
    name="local",
    backend="plait.backends.local.backend:LocalBackend",
    free=True,
    in_process=True,  # each `plait serve` worker loads its own copy of the model
    model_string_key="model_path",  # "local:/models/qwen.gguf" is a file, not a model name
    keys=("model_path", "n_ctx"),
    # The embedded model decodes up to its batch size of calls together (LocalBackend's
    # n_seq_max, backend.BATCH_SIZE: 4), so as many may be in flight; queueing the rest
    # in the limiter (not inside the backend) and no default timeout keep a long run
    # from timing out calls that merely waited their turn.
    defaults={"max_concurrent": 4, "timeout": None},
    arguments=_arguments,
    cache_keys=("model_path",),
)
