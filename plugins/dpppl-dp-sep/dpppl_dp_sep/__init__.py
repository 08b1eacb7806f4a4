"""dpppl-dp-sep: a dpppl plugin."""
