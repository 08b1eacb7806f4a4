"""Hook implementations of dpppl-prv."""
