"""The files a validator keeps in its state directory beside the node's, by name.

The names live apart from `templar.validator.state`, which reads and writes the files and loads torch
and the score book to do so. A process that only places or reads a file needs neither: the localnet's
supervisor writes each validator's secret from the run's seed, and the dashboard reads the book's
readable copy.
"""

from __future__ import annotations

BOOK_FILE = "scorebook.json"
"""The score book's readable copy, for operators and the dashboard (the book itself is saved in the
node's state file)."""
SECRET_FILE = "eval_secret"
"""The validator's private evaluation secret (`templar.validator.state.load_or_create_secret`)."""
SECRET_BYTES = 32
"""The secret's length."""
