"""Usage records, the async queue that overlaps the next turn, ledgers."""
