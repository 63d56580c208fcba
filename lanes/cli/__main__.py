from lanes.cli import main

main(prog_name="lanes")
