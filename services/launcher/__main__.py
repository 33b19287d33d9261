from infrarsi.service import main
from infrarsi_services.launcher.service import LauncherService

if __name__ == "__main__":
    main(LauncherService)
