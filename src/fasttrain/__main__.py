from fasttrain.cli import main

main()
