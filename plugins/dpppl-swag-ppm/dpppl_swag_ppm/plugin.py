"""Hook implementations of dpppl-swag-ppm."""
