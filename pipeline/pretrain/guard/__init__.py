"""The spike guard: its judgement of each step against a rolling window (on the device, inside the step), and what
the run does about what it finds (go on, note updates left out, roll back, or stop)."""
