"""Task files read: the task catalogue, sentence, token and QA splits, embedding pairs, with file:line errors."""
