"""The command lines: one module per hvdps subcommand (compare, project, emulate, hosts); hvdps/cli.py
dispatches to them."""
