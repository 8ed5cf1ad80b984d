"""The stage commands: each module's `main(argv)` is one command line (launchers/ and data_prep/ call it)."""
