"""Hook implementations of dpppl-dp-accounting."""
