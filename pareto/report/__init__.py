"""What pareto shows: the terminal tables (``tables``) and the HTML report (``html``, with the data it
reads and the figures it draws)."""
