"""The `raysim` command's subcommands, one module each with a `main(args)`: raysim.cli imports only
the one it runs."""
