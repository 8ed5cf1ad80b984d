"""Extractive QA as a task family."""
