"""rollway benchmarks (not tests): `make bench`."""
