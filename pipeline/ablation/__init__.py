"""Ablation studies: RoBERTa's design tables (launchers/ablate.py)."""
