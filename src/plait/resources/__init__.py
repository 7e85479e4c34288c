"""Resources: which endpoint serves each alias, and the limits, retries and costs of calls.

`ResourceConfig` maps the aliases a program uses to validated endpoints;
`ResourceManager` sends each call through its endpoint's backend within the
endpoint's limits (`limits.Limiter`), retries it in place (`RetryPolicy`),
and records usage and cost (`usage`); every budget over a call (an
endpoint's, the manager's, a run's) is a `budget.Budget` ledger.
"""

from plait.resources.config import (
    EndpointConfig,
    ResourceConfig,
    allow_api_key_env,
    register_provider,
)
from plait.resources.manager import EndpointStats, ResourceManager
from plait.resources.retry import RetryPolicy
from plait.resources.usage import Price

__all__ = [
    "EndpointConfig",
    "EndpointStats",
    "Price",
    "ResourceConfig",
    "ResourceManager",
    "RetryPolicy",
    "allow_api_key_env",
    "register_provider",
]
