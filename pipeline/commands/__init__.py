"""The stages' command lines: `main(argv)` per verb; launchers/ and data_prep/ scripts are thin shims over them."""
