"""raysim: a federated-learning simulator on Ray."""

__version__ = "0.1.0"
