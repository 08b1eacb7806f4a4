"""dpppl-dp-accounting: a dpppl plugin."""
