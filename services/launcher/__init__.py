"""The launcher service (``python -m infrarsi_services.launcher``); see ``service`` for what it owns."""
