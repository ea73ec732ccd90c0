"""`naiad tune`: the search space (`space`), the search (`search`), the live runner (`runner`),
the report (`report`) and the command (`flags`, `command`)."""
