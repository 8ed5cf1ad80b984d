"""The fair protocol: the sweep on a held-out slice of train, the selection slice, the label curve."""
