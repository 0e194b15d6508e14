from services.discovery.cli import main

main()
