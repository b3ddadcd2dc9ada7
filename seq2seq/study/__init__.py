"""Compare training runs: discovery and grouping, cached scoring, report, plots."""
