from tether.cli.app import main

main()
