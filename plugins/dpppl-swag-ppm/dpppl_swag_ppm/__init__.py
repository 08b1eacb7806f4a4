"""dpppl-swag-ppm: a dpppl plugin."""
