"""dpppl-prv: a dpppl plugin."""
