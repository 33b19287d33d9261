"""The telemetry service (``python -m infrarsi_services.telemetry``); see ``service`` for what it owns."""
