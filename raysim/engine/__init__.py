"""The Ray side of raysim: client actors, the server actor and the round loop."""
