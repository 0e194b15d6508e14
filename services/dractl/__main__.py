from services.dractl.cli import main

main()
