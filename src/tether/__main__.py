from tether.cli.entry import main

main()
