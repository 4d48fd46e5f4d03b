from fasttrain.cli import run

run()
