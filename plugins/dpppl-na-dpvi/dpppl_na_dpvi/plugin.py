"""Hook implementations of dpppl-na-dpvi."""
