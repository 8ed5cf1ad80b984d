"""What each step trains on: the run's plan, its phases and stretches, the data stream, masking, the LR
schedule, the run's ledger and the checkpoint record."""
