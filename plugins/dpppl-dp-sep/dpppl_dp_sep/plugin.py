"""Hook implementations of dpppl-dp-sep."""
