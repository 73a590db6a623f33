"""The built-in algorithms, one module each, found by `raysim.registry` by module name."""
