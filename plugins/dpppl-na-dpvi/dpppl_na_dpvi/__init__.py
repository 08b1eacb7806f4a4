"""dpppl-na-dpvi: a dpppl plugin."""
