from infrarsi.service import main
from infrarsi_services.telemetry.service import TelemetryService

if __name__ == "__main__":
    main(TelemetryService)
