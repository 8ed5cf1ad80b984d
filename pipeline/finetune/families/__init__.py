"""Task families: the interface every family implements and the registry that picks one, with a sub-package per
family (sequence, token, qa, embedding) and the official metrics they share."""
