"""The public home of `plait.report.telemetry`, where the observability layer keeps it.

``from plait.telemetry import OpenTelemetryCallback`` keeps working for
programs written before telemetry joined the observability layer's folder.
"""

from plait.report.telemetry import OpenTelemetryCallback

__all__ = ["OpenTelemetryCallback"]
