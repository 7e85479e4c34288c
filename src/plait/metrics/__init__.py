"""The public home of `plait.optimization.metrics`, where the learning layer keeps it.

``from plait.metrics import metric_exact_match`` (and the rest of its
`__all__`) keeps working for programs written before the metrics joined the
learning layer's folder.
"""

from plait.optimization.metrics import (
    metric_contains,
    metric_exact_match,
    metric_f1,
    metric_field_match,
)

__all__ = ["metric_contains", "metric_exact_match", "metric_f1", "metric_field_match"]
